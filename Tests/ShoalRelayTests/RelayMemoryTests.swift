import NIOCore
import NIOEmbedded
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalRelay

@Suite struct RelayMemoryTests {
    @Test func pagesAreHeldUpToTheLimitAndGivenBackWhenReleased() async {
        let memory = RelayPageMemory(limit: 10_000)
        var first: RelayPageMemory.Hold? = await memory.hold(6_000, waitingAtMost: .seconds(10))
        #expect(first != nil)
        #expect(await memory.hold(5_000, waitingAtMost: .milliseconds(20)) == nil)
        #expect(memory.bytes == 6_000)
        // The page read carried less than its budget: the rest is free again.
        first?.resize(to: 1_000)
        #expect(memory.bytes == 1_000)
        var second: RelayPageMemory.Hold? = await memory.hold(9_000, waitingAtMost: .seconds(10))
        #expect(second != nil)
        // One change set larger than the budget is held all the same (a page carries at least one).
        second?.resize(to: 12_000)
        #expect(memory.bytes == 13_000)
        #expect(await memory.hold(1, waitingAtMost: .milliseconds(20)) == nil)
        first = nil
        second = nil
        #expect(memory.bytes == 0)
        // A budget over the limit holds the limit.
        let whole = await memory.hold(50_000, waitingAtMost: .seconds(10))
        #expect(whole != nil && memory.bytes == 10_000)
    }

    @Test func aPullWhoseBudgetDoesNotFitWaitsItsTurnUntilPagesAreWrittenOut() async {
        let memory = RelayPageMemory(limit: 10_000)
        var held: RelayPageMemory.Hold? = await memory.hold(8_000, waitingAtMost: .seconds(10))
        async let waiting = memory.hold(4_000, waitingAtMost: .seconds(30))
        #expect(await waitUntil(within: 10) { memory.waiting == 1 })
        // A later, smaller one does not pass the one waiting.
        #expect(await memory.hold(1_000, waitingAtMost: .milliseconds(20)) == nil)
        held = nil
        let admitted = await waiting
        #expect(admitted != nil)
        #expect(memory.bytes == 4_000)
        _ = held
    }

    @Test func aConnectionThatTakesNothingForTheTimeoutIsClosed() throws {
        let channel = EmbeddedChannel(handler: RelayWriteStallHandler(timeout: .seconds(30)))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        // It takes a little now and then: never closed.
        for _ in 0..<5 {
            channel.isWritable = false
            channel.pipeline.fireChannelWritabilityChanged()
            channel.embeddedEventLoop.advanceTime(by: .seconds(20))
            channel.isWritable = true
            channel.pipeline.fireChannelWritabilityChanged()
            channel.embeddedEventLoop.advanceTime(by: .seconds(20))
        }
        #expect(channel.isActive)
        // It stops taking anything.
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.embeddedEventLoop.advanceTime(by: .seconds(29))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
    }

    @Test func aStoppingRelayEndsEveryWaitAtOnce() async {
        let notifier = RelayNotifier()
        let clock = ContinuousClock()
        let started = clock.now
        async let waited = notifier.wait("c", after: 0, for: .seconds(60))
        #expect(await waitUntil(within: 10) { await notifier.waiting("c") == 1 })
        await notifier.shutDown()
        #expect(await waited == false)
        // Later waits return at once too, saying so, rather than letting a long-poll ask again in a loop.
        #expect(await notifier.wait("c", after: 0, for: .seconds(60)) == false)
        #expect(clock.now - started < .seconds(10))
    }
}

/// The relay's view of its storage's health: a ping that fails, or does not come back in time, counts as down.
@Suite struct RelayStorageHealthTests {
    /// Pings that wait until the test says how each ends.
    private actor Pings {
        private var waiting: CheckedContinuation<Bool, Never>?
        private(set) var started = 0

        func next() async -> Bool {
            started += 1
            return await withCheckedContinuation { waiting = $0 }
        }

        /// Ends the ping under way (true: it answers); false when none is under way yet.
        func end(answering: Bool) -> Bool {
            guard let waiting else { return false }
            self.waiting = nil
            waiting.resume(returning: answering)
            return true
        }
    }

    @Test func aPingThatFailsOrHangsCountsAsDownUntilOneAnswers() async throws {
        let health = RelayStorageHealth(stallLimit: .milliseconds(200))
        #expect(health.down == nil)
        let pings = Pings()
        let prober = Task {
            await health.probe { () throws(ShoalError) in
                if await !pings.next() { throw ShoalError(code: .relay, message: "connection refused") }
            }
        }
        defer { prober.cancel() }
        // The first ping hangs: past the stall limit the storage counts as down.
        #expect(try await waitUntil(within: 10) { health.down?.contains("has not answered") == true })
        // It fails: down, with the failure, until a ping answers.
        #expect(try await waitUntil(within: 10) { await pings.end(answering: false) })
        #expect(try await waitUntil(within: 10) { health.down == "connection refused" })
        #expect(try await waitUntil(within: 10) { await pings.started == 2 })
        #expect(health.down == "connection refused")
        #expect(await pings.end(answering: true))
        #expect(try await waitUntil(within: 10) { health.down == nil })
    }
}
