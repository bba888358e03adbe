import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Key epochs

    /// Carries out one pass of the epoch session (``RelayEpochSession/Pass``): its actions through the relay's API,
    /// its effects here. ``RelayEpochSession/Pass/grantsIfNeeded`` fetches this node's grants only when the relay
    /// retired the token in use; ``RelayEpochSession/Pass/newerGrants`` fetches those of epochs after the newest held;
    /// ``RelayEpochSession/Pass/epochs`` checks the relay's epochs, rotates when the roster removed a node that no
    /// epoch held here excludes yet, and leaves grants for members that joined after the last rotation.
    func epochs(_ pass: RelayEpochSession.Pass, _ api: RelayAPIClient) async throws(RelayCallError) {
        if pass == .grantsIfNeeded, state.withLock({ $0.grantsNeeded }) == nil { return }
        var session = RelayEpochSession(
            pass,
            identity: configuration.identity,
            cluster: configuration.clusterID,
            clusterSecret: configuration.clusterSecret,
            waitMilliseconds: configuration.waitMilliseconds,
            roster: configuration.roster?(),
            now: configuration.clock.monotonicMilliseconds()
        )
        var random = SystemRandomNumberGenerator()
        var action = state.withLock { session.start(state: &$0, random: &random) }
        while true {
            try await carryOut(session.takeEffects())
            switch action {
            case .done:
                return
            case .fail(let error):
                throw error
            case .fetchGrants(let after, let recipient, let wait):
                let listed = try await api.grants(after: after, recipient: recipient, waitMilliseconds: wait)
                action = state.withLock { session.listed(listed, state: &$0, random: &random) }
            case .postRotation(let rotation):
                let outcome: RelayEpochSession.RotationOutcome
                do {
                    try await api.rotate(rotation)
                    outcome = .rotated
                } catch {
                    guard case .conflict = error else { throw error }
                    outcome = .conflict
                }
                action = state.withLock { session.rotation(outcome, state: &$0, random: &random) }
            case .postGrants(let grants):
                try await api.post(grants)
                action = state.withLock { session.posted(state: &$0) }
            }
        }
    }

    private func carryOut(_ effects: [RelayEpochSession.Effect]) async throws(RelayCallError) {
        for effect in effects {
            switch effect {
            case .adopted(let keyring, let newest, let rotatedHere):
                if let path = configuration.keyringPath {
                    try await local { () throws(ShoalError) in try keyring.save(path) }
                }
                report(.epoch(newest, rotatedHere: rotatedHere))
            case .restarting(let relay, let held):
                configuration.logger.info(
                    """
                    the relay lacks key epochs this node holds (it lost or rolled back its storage): \
                    starting them again there
                    """,
                    metadata: ["relay": "\(relay)", "held": "\(held)"]
                )
            case .rotated(let epoch):
                configuration.logger.info("rotated the relay key", metadata: ["epoch": "\(epoch)"])
            }
        }
    }
}
