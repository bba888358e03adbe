import Testing

@testable import ShoalCore
@testable import ShoalTransport

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)

/// The ages behind the staleness metrics, as plain data: no clock, no socket.
@Suite struct VersionVectorHistoryTests {
    @Test func theAgeIsThatOfTheFirstStepThePeerDoesNotCover() {
        var history = VersionVectorHistory()
        history.record(VersionVector([siteA: 1]), at: 1_000)
        history.record(VersionVector([siteA: 1]), at: 2_000)  // no growth: no step
        history.record(VersionVector([siteA: 3]), at: 3_000)
        history.record(VersionVector([siteA: 3, siteB: 5]), at: 4_000)
        #expect(history.steps[siteA]?.count == 2 && history.steps[siteB]?.count == 1)
        // Holding everything: nothing is stale.
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 3, siteB: 5]), now: 10_000) == 0)
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 9, siteB: 9]), now: 10_000) == 0)
        // Lacking only what arrived last: dated by that step.
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 3]), now: 10_000) == 6_000)
        // Lacking a's second and third transactions: dated by the step that first held them.
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 1, siteB: 5]), now: 10_000) == 7_000)
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 2, siteB: 5]), now: 10_000) == 7_000)
        // Holding nothing: as old as the history; the oldest site decides.
        #expect(history.ageOfOldestLacking(VersionVector(), now: 10_000) == 9_000)
        // A clock read before the step (never from a monotonic clock) gives 0, not a wrapped number.
        #expect(history.ageOfOldestLacking(VersionVector(), now: 500) == 0)
    }

    @Test func aFullHistoryThinsItsOlderHalfAndKeepsItsOldestStep() {
        var history = VersionVectorHistory(capacity: 8)
        for step in 1...40 { history.record(VersionVector([siteA: UInt64(step)]), at: UInt64(step) * 1_000) }
        let timeline = history.steps[siteA] ?? []
        #expect(timeline.count <= 8)
        #expect(timeline.first?.milliseconds == 1_000)
        #expect(timeline.last?.milliseconds == 40_000)
        // Recent ages stay exact; a peer lacking everything is as old as the first step; older ones may read short,
        // never long.
        #expect(history.ageOfOldestLacking(VersionVector([siteA: 39]), now: 41_000) == 1_000)
        #expect(history.ageOfOldestLacking(VersionVector(), now: 41_000) == 40_000)
        let age = history.ageOfOldestLacking(VersionVector([siteA: 10]), now: 41_000)
        #expect(age <= 30_000 && age > 0)
        // Steps only grow, so the search stays right after thinning.
        for (earlier, later) in zip(timeline, timeline.dropFirst()) {
            #expect(later.seq > earlier.seq && later.milliseconds > earlier.milliseconds)
        }
    }
}
