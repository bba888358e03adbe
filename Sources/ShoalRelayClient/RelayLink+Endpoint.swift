import ShoalCore
import ShoalRelayProtocol

extension RelayLink {
    /// What the drivers (``RelayPullDriver``, ``RelayEpochDriver``) need, answered by the link: the relay through its
    /// API, the node through its store, the link's state under its lock.
    struct Endpoint: RelayPullEndpoint, RelayEpochEndpoint {
        let link: RelayLink
        let api: RelayAPIClient

        func nowMilliseconds() -> UInt64 { link.configuration.clock.nowMilliseconds() }

        func held() async throws(RelayCallError) -> VersionVector { try await link.held() }

        func seal(opening epoch: UInt32) async throws(RelayCallError) -> RelaySeal {
            if !link.state.withLock({ $0.credentials.seal }).holds(epoch) {
                // Sealed with an epoch this node has not learnt yet: its grant is in the relay's mailbox.
                try await link.epochs(.newerGrants, api)
            }
            return link.state.withLock { $0.credentials.seal }
        }

        func relayServed(_ served: VersionVector) {
            link.state.withLock { $0.served.merge(served) }
        }

        func apply(
            _ batch: ChangeBatch,
            received: [SiteID: UInt64]
        ) async throws(RelayCallError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>) {
            try await link.local { () throws(ShoalError) in try await link.apply(batch, received: received) }
        }

        func grants(
            after: UInt32,
            recipient: NodeID?,
            waitMilliseconds: UInt64
        ) async throws(RelayCallError) -> RelayGrants {
            try await api.grants(after: after, recipient: recipient, waitMilliseconds: waitMilliseconds)
        }

        func rotate(_ rotation: RelayRotation) async throws(RelayCallError) { try await api.rotate(rotation) }

        func post(_ grants: [RelayGrant]) async throws(RelayCallError) { try await api.post(grants) }

        func withState(
            _ event: (inout RelayLinkState, inout SystemRandomNumberGenerator) -> RelayEpochSession.Action
        ) -> RelayEpochSession.Action {
            var random = SystemRandomNumberGenerator()
            return link.state.withLock { event(&$0, &random) }
        }

        func carryOut(_ effects: [RelayEpochSession.Effect]) async throws(RelayCallError) {
            try await link.carryOut(effects)
        }
    }
}
