import Synchronization

/// The bytes of pull answers the relay holds at once, across all its connections, and their limit.
///
/// A pull takes its page's byte budget before it reads the page and keeps what the page holds until its answer has
/// been written out (or its connection closed); a pull that finds too little left is refused with 503 and Retry-After,
/// so readers that take their answers slowly, or never, cannot make the relay hold more than the limit (plus, for a
/// page whose first change set alone is larger than its budget, that change set).
final class RelayPageMemory: Sendable {
    /// The most bytes held at once.
    let limit: Int
    private let held = Mutex(0)

    init(limit: Int) {
        self.limit = limit
    }

    /// The bytes held now.
    var bytes: Int { held.withLock { $0 } }

    /// Takes `bytes` for one page: nil when fewer than that are left.
    func hold(_ bytes: Int) -> Hold? {
        let taken = held.withLock { held in
            guard held + bytes <= limit else { return false }
            held += bytes
            return true
        }
        return taken ? Hold(memory: self, bytes: bytes) : nil
    }

    fileprivate func change(by bytes: Int) {
        held.withLock { $0 += bytes }
    }

    /// What one page holds, given back when the hold is released (its answer written, or dropped).
    final class Hold: Sendable {
        private let memory: RelayPageMemory
        private let bytes: Mutex<Int>

        fileprivate init(memory: RelayPageMemory, bytes: Int) {
            self.memory = memory
            self.bytes = Mutex(bytes)
        }

        /// Holds `bytes` from now on instead: what the page holds, once it is read (more than was taken when its first
        /// change set alone is larger than its budget).
        func resize(to bytes: Int) {
            let difference = self.bytes.withLock { held in
                defer { held = bytes }
                return bytes - held
            }
            memory.change(by: difference)
        }

        deinit {
            memory.change(by: -bytes.withLock { $0 })
        }
    }
}
