import Dispatch
import Foundation
import ShoalTestSupport
import Synchronization
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// SQLite calls block. Each serialized store runs them on a thread of its own, so blocked stores never hold the
/// cooperative pool's few threads (two on a two-core machine), and everything else keeps running meanwhile.
@Suite struct SerializedStoreTests {
    @Test func moreBlockedStoresThanPoolThreadsStillLeaveThePoolFree() async throws {
        let directory = try temporaryDirectory("executor")
        defer { try? FileManager.default.removeItem(at: directory) }
        let count = max(4, ProcessInfo.processInfo.activeProcessorCount * 2)
        let workers = try (0..<count).map { index in
            let path = directory.appendingPathComponent("\(index).db").path
            _ = try Store(path: path)
            return try SerializedStore(path: path, options: StoreOptions())
        }
        let blocked = Counter()
        let release = DispatchSemaphore(value: 0)
        let calls = workers.map { worker in
            Task {
                try await worker.withStore { _ throws(ShoalError) in
                    blocked.increment()
                    release.wait()  // blocks this store's thread, as a long SQLite call would
                }
            }
        }
        // Should they run on the pool, this task could not even check: a watchdog off the pool lets them go, so
        // the test fails instead of hanging.
        DispatchQueue.global().asyncAfter(deadline: .now() + 250) { for _ in 0..<count { release.signal() } }
        // All of them block at once, more than the pool has threads, and this task still runs to see it.
        // (A generous deadline: the test suites running beside this one hold the pool's threads for a minute or more
        // at the start, waiting on child processes, and these calls start from the pool. On the pool, the workers
        // could never all block at once however long this waits; the watchdog lets them go at 250 s.)
        let allBlocked = await waitUntil(within: 240) { blocked.value == count }
        #expect(allBlocked, "only \(blocked.value) of \(count) stores ran at once")
        // Other work on the pool is not held up by them.
        let sum = await withTaskGroup(of: Int.self) { group in
            for value in 1...100 { group.addTask { value } }
            return await group.reduce(0, +)
        }
        #expect(sum == 5_050)
        for _ in 0..<count { release.signal() }
        for call in calls { try await call.value }
        // The store's own thread answers later calls as before.
        #expect(try await workers[0].versionVector() == VersionVector())
    }
}

/// A count several threads add to.
private final class Counter: Sendable {
    private let count = Mutex(0)
    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}
