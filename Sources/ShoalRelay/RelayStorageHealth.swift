import ShoalCore
import Synchronization

/// Whether the relay's storage answers, as a probe sees it: one `ping` a second, and a ping that has not come back
/// within ``stallLimit`` counts as down (a PostgreSQL server that went away makes queries wait, not fail). While the
/// storage is down, requests are answered at once with 503 instead of waiting for it, and `/v1/health` says so.
final class RelayStorageHealth: Sendable {
    /// How long a ping may take before the storage counts as down.
    let stallLimit: Duration

    /// A health whose pings count as stalled after `stallLimit`.
    init(stallLimit: Duration = .seconds(3)) {
        self.stallLimit = stallLimit
    }

    private struct State {
        /// When the ping under way started (nil: none under way).
        var pingStarted: ContinuousClock.Instant?
        /// The last ping failed, with this reason.
        var failure: String?
    }

    private let state = Mutex(State())

    /// Why the storage counts as down now, or nil when it answers.
    var down: String? {
        state.withLock { state in
            if let failure = state.failure { return failure }
            if let started = state.pingStarted, ContinuousClock.now - started > stallLimit {
                return "it has not answered for \(ContinuousClock.now - started)"
            }
            return nil
        }
    }

    /// Calls `ping` (the storage's) once a second until cancelled.
    func probe(_ ping: @Sendable () async throws(ShoalError) -> Void) async {
        while !Task.isCancelled {
            state.withLock { $0.pingStarted = .now }
            var failure: String?
            do {
                try await ping()
            } catch {
                failure = error.message
            }
            state.withLock { state in
                state.pingStarted = nil
                state.failure = failure
            }
            try? await Task.sleep(for: .seconds(1))
        }
    }
}
