import Synchronization

/// A lock awaited instead of blocked on, first come first served: the embedded storage's one connection is held by
/// one reader or transaction at a time, across the awaits of its statements, without holding up a thread.
final class RelayAsyncLock: Sendable {
    private struct State {
        var held = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        var first = 0
    }

    private let state = Mutex(State())

    /// Runs `body` holding the lock.
    func withLock<T, E: Error>(_ body: () async throws(E) -> T) async throws(E) -> T {
        await lock()
        defer { unlock() }
        return try await body()
    }

    /// Waits for the lock and takes it.
    func lock() async {
        await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                guard state.held else {
                    state.held = true
                    return true
                }
                state.waiters.append(waiter)
                return false
            }
            if now { waiter.resume() }
        }
    }

    /// Gives the lock to the next waiter, or frees it.
    func unlock() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard state.first < state.waiters.count else {
                state.waiters.removeAll(keepingCapacity: true)
                state.first = 0
                state.held = false
                return nil
            }
            let next = state.waiters[state.first]
            state.first += 1
            if state.first >= 64 && state.first * 2 >= state.waiters.count {
                state.waiters.removeFirst(state.first)
                state.first = 0
            }
            return next
        }
        next?.resume()
    }
}
