import ShoalTestSupport
import Testing

@testable import ShoalCore

@Suite struct BackoffUnitTests {
    @Test func delaysDoubleUpToTheCapAndResetAfterASuccess() {
        var backoff = Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000, jitter: 1...1)
        var random = SystemRandomNumberGenerator()
        let delays = (0..<6).map { _ in backoff.next(using: &random) }
        #expect(delays == [100, 200, 400, 800, 1_000, 1_000])
        backoff.reset()
        #expect(backoff.next(using: &random) == 100)
    }

    @Test func jitterStaysWithinItsRange() {
        var random = SplitMix(state: 42)
        for _ in 0..<1_000 {
            var backoff = Backoff(initialMilliseconds: 1_000, maximumMilliseconds: 30_000)
            let delay = backoff.next(using: &random)
            #expect((800...1_200).contains(delay))
        }
        // A range of one point gives exactly that factor.
        var random2 = SplitMix(state: 7)
        var low = Backoff(initialMilliseconds: 1_000, maximumMilliseconds: 30_000, jitter: 0.8...0.8)
        #expect(low.next(using: &random2) == 800)
        var high = Backoff(initialMilliseconds: 1_000, maximumMilliseconds: 30_000, jitter: 1.2...1.2)
        #expect(high.next(using: &random2) == 1_200)
    }

    @Test func aHugeCapNeverOverflows() {
        var backoff = Backoff(initialMilliseconds: 1 << 62, maximumMilliseconds: .max, jitter: 1...1)
        var random = SystemRandomNumberGenerator()
        for _ in 0..<4 { _ = backoff.next(using: &random) }
        #expect(backoff.currentMilliseconds >= 1 << 62)
    }
}
