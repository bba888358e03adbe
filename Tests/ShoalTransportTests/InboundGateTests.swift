import Synchronization
import Testing

@testable import ShoalTransport

/// Waits (up to 5 s) until `condition` holds.
private func eventually(_ condition: () -> Bool) async throws -> Bool {
    for _ in 0..<500 {
        if condition() { return true }
        try await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

/// The bound on what a connection reads ahead of its driver.
@Suite struct InboundGateTests {
    @Test func theReaderStaysAtMostTheLimitAheadExceptWhileTheDriverAnswers() async throws {
        let gate = InboundGate(limit: 2)
        let reads = Mutex(0)
        // Stands for the socket: a hundred messages ready to read.
        let (socket, supply) = AsyncStream.makeStream(of: Int.self)
        for message in 0..<100 { supply.yield(message) }
        let reader = Task {
            for await _ in socket {
                reads.withLock { $0 += 1 }
                await gate.admitted()
            }
        }
        #expect(try await eventually { reads.withLock { $0 } == 2 && gate.waiting == 2 })
        // A window in which a reader the gate failed to hold would run ahead (not a wait: nothing may change in it).
        try await Task.sleep(for: .milliseconds(100))
        #expect(reads.withLock { $0 } == 2 && gate.waiting == 2)

        // Each message the driver handles lets one more in.
        gate.handled()
        #expect(try await eventually { reads.withLock { $0 } == 3 })
        try await Task.sleep(for: .milliseconds(50))  // a window to run ahead in, as above
        #expect(reads.withLock { $0 } == 3)

        // While the driver answers a pull, the reader is not held: both sides keep reading.
        gate.serving(true)
        #expect(try await eventually { reads.withLock { $0 } == 100 })
        gate.serving(false)
        supply.yield(100)
        #expect(try await eventually { reads.withLock { $0 } == 101 })
        supply.yield(101)
        try await Task.sleep(for: .milliseconds(100))  // a window to run ahead in, as above
        #expect(reads.withLock { $0 } == 101)  // held again until the driver catches up
        for _ in 0..<99 { gate.handled() }
        #expect(try await eventually { reads.withLock { $0 } == 102 })

        // Once the connection ends the reader is never held.
        gate.close()
        for message in 102..<110 { supply.yield(message) }
        supply.finish()
        await reader.value
        #expect(reads.withLock { $0 } == 110)
    }

    @Test func aCancelledReaderIsReleased() async {
        let gate = InboundGate(limit: 1)
        let reader = Task { await gate.admitted() }
        reader.cancel()
        await reader.value
        #expect(gate.waiting == 1)
    }
}
