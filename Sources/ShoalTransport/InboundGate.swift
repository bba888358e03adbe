import Synchronization

/// Keeps a connection's reader from running ahead of its driver: at most `limit` of the peer's messages wait, read
/// but not yet handled, so a fast peer's batches stay in its socket and in TCP's window (and its writes wait) instead
/// of piling up decoded in memory while this node applies.
///
/// While the driver answers the peer's pull it handles no message, and the peer may be answering ours at the same
/// time: then the reader is let through, so that two nodes serving each other can never both wait on writes
/// neither reads. What it reads meanwhile is handled once the answer is sent.
final class InboundGate: Sendable {
    private struct State {
        var waiting = 0
        var serving = false
        var closed = false
        var reader: CheckedContinuation<Void, Never>?
    }

    /// How many read messages may wait for the driver at most (outside an answer).
    let limit: Int
    private let state = Mutex(State())

    init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// The reader passed on one more message: returns once it may read the next one.
    func admitted() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let goOn = state.withLock { state in
                    state.waiting += 1
                    guard state.closed || state.serving || state.waiting < limit else {
                        state.reader = continuation
                        return false
                    }
                    return true
                }
                if goOn { continuation.resume() }
            }
        } onCancel: {
            close()
        }
    }

    /// The driver handled one message.
    func handled() {
        let reader = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.waiting = max(0, state.waiting - 1)
            guard state.waiting < limit else { return nil }
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume()
    }

    /// The driver starts (true) or ends (false) answering the peer's pull.
    func serving(_ serving: Bool) {
        let reader = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.serving = serving
            guard serving else { return nil }
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume()
    }

    /// The connection ends: the reader is never held again.
    func close() {
        let reader = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.closed = true
            defer { state.reader = nil }
            return state.reader
        }
        reader?.resume()
    }

    /// How many read messages wait for the driver (for tests).
    var waiting: Int { state.withLock { $0.waiting } }
}
