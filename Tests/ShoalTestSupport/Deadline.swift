import Foundation

/// Waits until `condition` holds, checking it every `interval` milliseconds; `false` once `seconds` pass first.
///
/// For what a test cannot be told by an event (another process's file, a daemon's state): the deadline only
/// bounds a failing test, the check is what the test waits on.
public func waitUntil(
    within seconds: Double,
    checkingEvery interval: UInt64 = 50,
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now + .milliseconds(Int64(seconds * 1000))
    while clock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(interval))
    }
    return try await condition()
}

/// Runs blocking work (waiting for a child process, say) on a thread of its own, not on one of the cooperative
/// pool's few threads, which the tests running beside it need.
public func offPool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
    }
}
