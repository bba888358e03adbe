import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Key epochs

    /// Runs one pass of the epoch session (``RelayEpochSession/Pass``) with the epoch driver (``RelayEpochDriver``):
    /// its actions through the relay's API, its effects here. ``RelayEpochSession/Pass/grantsIfNeeded`` fetches this
    /// node's grants only when the relay retired the token in use; ``RelayEpochSession/Pass/newerGrants`` fetches
    /// those of epochs after the newest held; ``RelayEpochSession/Pass/epochs`` checks the relay's epochs, rotates when
    /// the roster removed a node that no epoch held here excludes yet, and leaves grants for members that joined after
    /// the last rotation.
    func epochs(_ pass: RelayEpochSession.Pass, _ api: RelayAPIClient) async throws(RelayCallError) {
        if pass == .grantsIfNeeded, state.withLock({ $0.grantsNeeded }) == nil { return }
        var session = configuration.epochSession(pass, now: configuration.clock.monotonicMilliseconds())
        var endpoint = Endpoint(link: self, api: api)
        try await RelayEpochDriver.run(&session, &endpoint)
    }

    /// Carries out what a pass of the epoch session did on the side: saves the keyring, reports, logs.
    func carryOut(_ effects: [RelayEpochSession.Effect]) async throws(RelayCallError) {
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
