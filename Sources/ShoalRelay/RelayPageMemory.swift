import Synchronization

/// The bytes of pull answers the relay holds at once, across all its connections, and their limit.
///
/// A pull holds its page's budget before it reads the page, and what the page carries until its answer has been written
/// out (or its connection closed). A pull whose budget does not fit waits its turn (first come, first served) for at
/// most a while, then is refused with 503 and Retry-After; so readers that take their answers slowly, or never, cannot
/// make the relay hold more than the limit, nor can many pulls read pages at once beyond it. The limit is passed only
/// by a page whose first change set alone is larger than its budget (a page carries at least one).
final class RelayPageMemory: Sendable {
    /// The most bytes held at once.
    let limit: Int

    private struct Waiter {
        let id: UInt64
        let bytes: Int
        let continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var held = 0
        var waiters: [Waiter] = []
        var nextID: UInt64 = 0
    }

    private let state = Mutex(State())

    init(limit: Int) {
        self.limit = limit
    }

    /// The bytes held now.
    var bytes: Int { state.withLock { $0.held } }

    /// How many pulls wait for their budget now (what tests wait on).
    var waiting: Int { state.withLock { $0.waiters.count } }

    /// Holds `bytes` (at most the limit) for one page, waiting up to `patience` for them to fit after the pulls that
    /// wait already; nil when they did not.
    func hold(_ bytes: Int, waitingAtMost patience: Duration) async -> Hold? {
        let bytes = min(max(bytes, 0), limit)
        let id: UInt64? = state.withLock { state in
            if state.waiters.isEmpty && state.held + bytes <= limit {
                state.held += bytes
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return Hold(memory: self, bytes: bytes) }
        let granted = await withCheckedContinuation { continuation in
            let now = state.withLock { state in
                // Released since the look above, with no one before: no wait.
                if state.waiters.isEmpty && state.held + bytes <= limit {
                    state.held += bytes
                    return true
                }
                state.waiters.append(Waiter(id: id, bytes: bytes, continuation: continuation))
                return false
            }
            if now {
                continuation.resume(returning: true)
            } else {
                Task {
                    try? await Task.sleep(for: patience)
                    self.expire(id)
                }
            }
        }
        return granted ? Hold(memory: self, bytes: bytes) : nil
    }

    /// A waiter whose patience ran out: refused, if it still waits.
    private func expire(_ id: UInt64) {
        let waiter = state.withLock { state -> Waiter? in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index)
        }
        waiter?.continuation.resume(returning: false)
    }

    /// Moves what is held by `bytes` (negative: given back) and lets in the waiters that now fit, in turn.
    fileprivate func change(by bytes: Int) {
        let admitted = state.withLock { state -> [Waiter] in
            state.held += bytes
            var admitted: [Waiter] = []
            while let first = state.waiters.first, state.held + first.bytes <= limit {
                state.held += first.bytes
                admitted.append(state.waiters.removeFirst())
            }
            return admitted
        }
        for waiter in admitted { waiter.continuation.resume(returning: true) }
    }

    /// What one page holds, given back when the hold goes (its answer written, or dropped).
    final class Hold: Sendable {
        private let memory: RelayPageMemory
        private let bytes: Mutex<Int>

        fileprivate init(memory: RelayPageMemory, bytes: Int) {
            self.memory = memory
            self.bytes = Mutex(bytes)
        }

        /// Holds `bytes` from now on instead: what the page carries, once it is read (less than its budget, or more
        /// when its first change set alone is larger).
        func resize(to bytes: Int) {
            let difference = self.bytes.withLock { held in
                defer { held = bytes }
                return bytes - held
            }
            if difference != 0 { memory.change(by: difference) }
        }

        deinit {
            memory.change(by: -bytes.withLock { $0 })
        }
    }
}
