import Foundation
import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity
import ShoalTransport

extension RelayLink {
    // MARK: Key epochs

    func refreshGrantsIfNeeded(_ api: RelayAPIClient) async throws(RelayCallError) {
        guard let refused = state.withLock({ $0.grantsNeeded }) else { return }
        if state.withLock({ $0.credentials.token }) == refused {
            try await refreshGrants(api, required: true)
        }
        state.withLock { if $0.grantsNeeded == refused { $0.grantsNeeded = nil } }
    }

    /// Fetches the grants of epochs after the newest held and adopts those made for this node by a member.
    /// `required`: the token was retired, so finding none means this node was left out.
    func refreshGrants(_ api: RelayAPIClient, required: Bool) async throws(RelayCallError) {
        guard let identity = configuration.identity else {
            if required {
                throw RelayCallError.unauthorized(
                    "the token was retired by a key rotation, and this node has no key to open grants", token: nil
                )
            }
            return
        }
        // Refused (the token retired, or an upload under a key the relay does not hold): every grant for this node is
        // read again, not only newer epochs, since the relay may hold another secret for an epoch held here.
        let newest = required ? 0 : state.withLock { $0.credentials.keyring.newest }
        // When the token was retired, the grant may still be on its way (a member grants those it sees join): wait
        // for it at the relay rather than asking again and again.
        let wait = required ? configuration.waitMilliseconds : 0
        let listed = try await api.grants(after: newest, recipient: identity.nodeID, waitMilliseconds: UInt64(wait))
        let adopted = RelayEpochPlan.adoptable(
            listed.grants,
            identity: identity,
            cluster: configuration.clusterID,
            roster: configuration.roster?(),
            keyring: state.withLock { $0.credentials.keyring }
        )
        guard !adopted.isEmpty else {
            if required {
                // The relay's newest epoch is held here already, with its token: a fallback to the configured token
                // (refused while the relay had lost that epoch) left it. Back to it, rather than "no grant".
                let resumed = state.withLock { state -> Bool in
                    let keyring = state.credentials.keyring
                    guard let token = keyring.token, let epoch = listed.epoch, epoch <= keyring.newest,
                        token != state.credentials.token
                    else { return false }
                    state.credentials.token = token
                    return true
                }
                if resumed { return }
                throw RelayCallError.ungranted(
                    "the token was retired when the cluster's key moved to epoch \(listed.epoch ?? 0), and no grant "
                        + "for this node was found: it was removed from the cluster, or the member who rotated did not "
                        + "know it yet (members add grants for newer members as they see them)"
                )
            }
            return
        }
        try adopt(adopted, rotatedHere: false)
    }

    /// Keeps the epochs of `grants`, seals with the newest from now on, and uses its token.
    func adopt(_ grants: [(epoch: UInt32, contents: EpochGrant.Contents)], rotatedHere: Bool) throws(RelayCallError) {
        let (keyring, newest) = state.withLock { $0.adopt(grants, clusterSecret: configuration.clusterSecret) }
        if let path = configuration.keyringPath {
            try localNow { () throws(ShoalError) in try keyring.save(path) }
        }
        report(.epoch(newest, rotatedHere: rotatedHere))
    }

    /// Starts a new key epoch when the roster removed a node that no epoch held here excludes yet; and leaves grants
    /// for members that joined after the last rotation.
    func rotateIfNeeded(_ api: RelayAPIClient) async throws(RelayCallError) {
        guard let identity = configuration.identity, let roster = configuration.roster?(),
            roster.removed[identity.nodeID] == nil
        else { return }
        try await reestablishIfNeeded(api, identity: identity, roster: roster)
        func next() -> RelayEpochPlan.Step {
            let (excluded, granted) = state.withLock { ($0.credentials.keyring.removed, $0.grantedMembers) }
            return RelayEpochPlan.next(roster: roster, identity: identity, excluded: excluded, granted: granted)
        }
        if next() == .rotate {
            // Another member may have rotated already.
            try await refreshGrants(api, required: false)
        }
        switch next() {
        case .none: break
        case .rotate: try await rotate(api, identity: identity, roster: roster)
        case .grantMembers(let members): try await grantMembers(members, api, identity: identity, roster: roster)
        }
    }

    /// Starts again at the relay the epochs this node holds beyond the relay's newest, in order, each with its grants
    /// for the members and its upload key: a relay that lost its storage, or was restored from a copy older than a
    /// rotation, learns them back from the members instead of a member starting a different epoch under the same
    /// number. The newest comes with the token members hold for it. Checked when the relay's heads are read again.
    func reestablishIfNeeded(_ api: RelayAPIClient, identity: NodeIdentity, roster: Roster) async throws(RelayCallError) {
        let now = configuration.clock.monotonicMilliseconds()
        // The newest epoch's token as the members hold it (the one a fallback to the configured token may have
        // replaced here): started again with another, the members' would be unknown to the relay.
        let (keyring, token) = state.withLock { ($0.credentials.keyring, $0.credentials.keyring.token ?? $0.credentials.token) }
        guard keyring.newest > 0, state.withLock({ $0.epochsCheckedMs.map { now - $0 >= 30_000 } ?? true }) else { return }
        let listed = try await api.grants(after: keyring.newest)
        state.withLock { $0.epochsCheckedMs = now }
        guard let relayNewest = listed.epoch, relayNewest < keyring.newest else { return }
        configuration.logger.info(
            "the relay lacks key epochs this node holds (it lost or rolled back its storage): starting them again there",
            metadata: ["relay": "\(relayNewest)", "held": "\(keyring.newest)"]
        )
        for epoch in keyring.epochs where epoch.epoch > relayNewest {
            let newest = epoch.epoch == keyring.newest
            guard let contents = RelayEpochPlan.contents(of: epoch, newest: newest, token: token) else { continue }
            // Only the newest epoch's token is one members use; an older epoch's is never handed out.
            let rotation = try localNow { () throws(ShoalError) in
                try RelayEpochPlan.rotation(
                    epoch.epoch, contents, token: newest ? token : RelayAPI.makeToken(), roster: roster,
                    excluding: keyring.removed, cluster: configuration.clusterID, signer: identity
                )
            }
            do {
                try await api.rotate(rotation)
            } catch {
                guard case .conflict = error else { throw error }
                // Another member started it first (this node's, or one made afresh): the grants say which.
                return
            }
        }
        state.withLock { $0.grantedMembers = nil }
    }

    func rotate(_ api: RelayAPIClient, identity: NodeIdentity, roster: Roster) async throws(RelayCallError) {
        let epoch = state.withLock { $0.credentials.keyring.newest } + 1
        var generator = SystemRandomNumberGenerator()
        let secret = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let token = RelayAPI.makeToken()
        let contents = EpochGrant.Contents(secret: secret, token: token, removed: roster.removed.keys.sorted())
        let excluded = state.withLock { $0.credentials.keyring.removed }.union(contents.removed.map(\.description))
        let rotation = try localNow { () throws(ShoalError) in
            try RelayEpochPlan.rotation(
                epoch, contents, token: token, roster: roster, excluding: excluded, cluster: configuration.clusterID,
                signer: identity
            )
        }
        do {
            try await api.rotate(rotation)
        } catch {
            if case .conflict = error {
                // Another member started this epoch: adopt its grant; the next pass checks what it excludes.
                try await refreshGrants(api, required: false)
                return
            }
            throw error
        }
        try adopt([(epoch, contents)], rotatedHere: true)
        configuration.logger.info("rotated the relay key", metadata: ["epoch": "\(epoch)"])
    }

    /// Leaves in the relay's mailbox the grants `members` lack, for every epoch held here.
    func grantMembers(
        _ members: Set<NodeID>,
        _ api: RelayAPIClient,
        identity: NodeIdentity,
        roster: Roster
    ) async throws(RelayCallError) {
        let (keyring, token) = state.withLock { ($0.credentials.keyring, $0.credentials.token) }
        guard !keyring.epochs.isEmpty else {
            state.withLock { $0.grantedMembers = members }
            return
        }
        let listed = try await api.grants(after: 0)
        var grants: [RelayGrant] = []
        for missing in RelayEpochPlan.missing(
            keyring: keyring, token: token, roster: roster, identity: identity, listed: listed.grants
        ) {
            grants.append(
                try localNow { () throws(ShoalError) in
                    try RelayEpochPlan.grant(
                        missing.epoch, missing.contents, to: missing.recipient, cluster: configuration.clusterID,
                        signer: identity
                    )
                }
            )
        }
        if !grants.isEmpty { try await api.post(grants) }
        state.withLock { $0.grantedMembers = members }
    }
}
