import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity

/// What a node decides about the relay's key epochs, with no I/O: which grants to adopt, who gets grants, which grants
/// the relay's mailbox lacks, and which epochs to start again at a relay that lost or rolled back its storage.
/// Membership decides, not the relay: only a current member's grant counts, and no epoch is granted to a node any
/// epoch held here was made without. ``RelayLink`` fetches and posts what these say.
enum RelayEpochPlan {
    /// What the link does about epochs before an upload.
    enum Step: Sendable, Equatable {
        /// Nothing: this node was removed, or has no identity or roster.
        case none
        /// The roster removed a node that the newest epoch held here does not exclude: read the grants (another member
        /// may have rotated already), then rotate if still needed.
        case rotate
        /// Leave grants for members the last check did not see.
        case grantMembers(Set<NodeID>)
    }

    /// The step for `roster` as it stands, given the nodes the newest held epoch excludes and the members last granted.
    static func next(
        roster: Roster?,
        identity: NodeIdentity?,
        excluded: Set<String>,
        granted: Set<NodeID>?
    ) -> Step {
        guard let identity, let roster, roster.removed[identity.nodeID] == nil else { return .none }
        if !Set(roster.removed.keys.map(\.description)).isSubset(of: excluded) { return .rotate }
        let members = Set(roster.members.keys).union([identity.nodeID])
        return granted == members ? .none : .grantMembers(members)
    }

    /// The grants of `listed` this node adopts: made for it, signed by a current member (a removed node that rotated
    /// first gains nothing by it), opening with its key, and not an epoch it holds with the same secret already, unless
    /// it is the newest and carries another token (the relay lost its state and a member started the epoch again there
    /// with the token it held: this node's is then unknown to the relay).
    static func adoptable(
        _ listed: [RelayGrant],
        identity: NodeIdentity,
        cluster: String,
        roster: Roster?,
        keyring: RelayKeyring
    ) -> [(epoch: UInt32, contents: EpochGrant.Contents)] {
        let me = identity.nodeID.description
        let held = Set(keyring.epochs.map { "\($0.epoch) \($0.secret)" })
        var adopted: [(epoch: UInt32, contents: EpochGrant.Contents)] = []
        for grant in listed where grant.recipient == me {
            guard let data = Data(base64Encoded: grant.body), let decoded = try? EpochGrant(decoding: Array(data)),
                decoded.epoch == grant.epoch
            else { continue }
            if let roster, roster.members[decoded.signer] == nil || roster.removed[decoded.signer] != nil { continue }
            guard let contents = try? decoded.open(with: identity, cluster: cluster) else { continue }
            let newToken = decoded.epoch >= keyring.newest && !contents.token.isEmpty && contents.token != keyring.token
            guard newToken || !held.contains("\(decoded.epoch) \(Data(contents.secret).base64EncodedString())")
            else { continue }
            adopted.append((decoded.epoch, contents))
        }
        return adopted
    }

    /// The token that this node's grant of `epoch` among `listed` carries, if one signed by a current member opens with
    /// its key and carries one (a grant of the newest epoch when it was made): the token the relay registered then.
    static func token(
        of epoch: UInt32,
        in listed: [RelayGrant],
        identity: NodeIdentity,
        cluster: String,
        roster: Roster?
    ) -> String? {
        let me = identity.nodeID.description
        for grant in listed where grant.recipient == me && grant.epoch == epoch {
            guard let data = Data(base64Encoded: grant.body), let decoded = try? EpochGrant(decoding: Array(data)),
                decoded.epoch == epoch
            else { continue }
            if let roster, roster.members[decoded.signer] == nil || roster.removed[decoded.signer] != nil { continue }
            guard let contents = try? decoded.open(with: identity, cluster: cluster), !contents.token.isEmpty else {
                continue
            }
            return contents.token
        }
        return nil
    }

    /// The members of `roster` and this node, with their keys, minus every node an epoch held here was made without: a
    /// member whose roster has not caught up with a removal yet must not grant the removed node what excluded it.
    static func recipients(_ roster: Roster, identity: NodeIdentity, excluding removed: Set<String>)
        -> [(node: NodeID, key: [UInt8])]
    {
        var recipients = roster.members.values.filter { !removed.contains($0.nodeID.description) }
            .map { (node: $0.nodeID, key: $0.publicKeyDER) }
        if !recipients.contains(where: { $0.node == identity.nodeID }) {
            recipients.append((identity.nodeID, identity.publicKeyDER))
        }
        return recipients
    }

    /// What each held epoch grants (its secret, the token members use for the newest, the nodes it excludes).
    static func contents(of epoch: RelayKeyring.Epoch, newest: Bool, token: String) -> EpochGrant.Contents? {
        guard let secret = Data(base64Encoded: epoch.secret) else { return nil }
        return EpochGrant.Contents(
            secret: Array(secret),
            token: newest ? token : "",
            removed: epoch.removed.compactMap { NodeID(parsing: $0) }
        )
    }

    /// The grants the relay's mailbox lacks (it holds those `listed`): every held epoch the relay holds as this node
    /// does, for every recipient. The newest epoch's grants carry the token the keyring holds for it, the one its
    /// rotation registered and the members use; `inUse`, the token this node uses now, only when the keyring holds
    /// none. A fallback to the configured token (after a refusal) must not hand new members a token the rotation
    /// retired.
    ///
    /// An epoch counts as the relay's only when its grant to this node there opens to the secret held here: a relay
    /// put back to an older copy may hold another secret under the same number (started afresh by a member that joined
    /// after the copy), and this node's grants of its own would fork the epoch for whoever has none there yet, this
    /// node included (a grant to itself would take the place of the one the others leave for it, from which it would
    /// learn the relay's).
    static func missing(
        keyring: RelayKeyring,
        inUse: String,
        roster: Roster,
        identity: NodeIdentity,
        cluster: String,
        listed: [RelayGrant]
    ) -> [(epoch: UInt32, contents: EpochGrant.Contents, recipient: (node: NodeID, key: [UInt8]))] {
        let token = keyring.token ?? inUse
        let held = Set(listed.map { "\($0.epoch) \($0.recipient)" })
        let me = identity.nodeID.description
        var same: Set<UInt32> = []
        for grant in listed where grant.recipient == me {
            guard let data = Data(base64Encoded: grant.body), let decoded = try? EpochGrant(decoding: Array(data)),
                decoded.epoch == grant.epoch, let contents = try? decoded.open(with: identity, cluster: cluster)
            else { continue }
            let secret = Data(contents.secret).base64EncodedString()
            if keyring.epochs.contains(where: { $0.epoch == grant.epoch && $0.secret == secret }) {
                same.insert(grant.epoch)
            }
        }
        var missing: [(epoch: UInt32, contents: EpochGrant.Contents, recipient: (node: NodeID, key: [UInt8]))] = []
        for epoch in keyring.epochs where same.contains(epoch.epoch) {
            guard let contents = contents(of: epoch, newest: epoch.epoch == keyring.newest, token: token) else { continue }
            for recipient in recipients(roster, identity: identity, excluding: keyring.removed)
            where !held.contains("\(epoch.epoch) \(recipient.node.description)") {
                missing.append((epoch.epoch, contents, recipient))
            }
        }
        return missing
    }

    /// `contents` of `epoch` sealed to `recipient` and signed by `signer`, as the relay's mailbox keeps it.
    static func grant(
        _ epoch: UInt32,
        _ contents: EpochGrant.Contents,
        to recipient: (node: NodeID, key: [UInt8]),
        cluster: String,
        signer: NodeIdentity
    ) throws(ShoalError) -> RelayGrant {
        let grant = try EpochGrant.make(
            cluster: cluster,
            epoch: epoch,
            contents: contents,
            recipient: recipient.node,
            recipientKey: recipient.key,
            signer: signer
        )
        return RelayGrant(epoch: epoch, recipient: recipient.node.description, body: Data(grant.encoded).base64EncodedString())
    }

    /// What starts `epoch` at the relay: a grant of `contents` for each member of `roster` but those `excluded`, the
    /// epoch's upload key, and the hash of `token` (the token members use from then on).
    static func rotation(
        _ epoch: UInt32,
        _ contents: EpochGrant.Contents,
        token: String,
        roster: Roster,
        excluding excluded: Set<String>,
        cluster: String,
        signer: NodeIdentity
    ) throws(ShoalError) -> RelayRotation {
        var grants: [RelayGrant] = []
        for recipient in recipients(roster, identity: signer, excluding: excluded) {
            grants.append(try grant(epoch, contents, to: recipient, cluster: cluster, signer: signer))
        }
        let uploadKey = RelaySeal(secrets: [epoch: contents.secret], epoch: epoch).uploadKey(epoch)
            .map { Data($0).base64EncodedString() }
        return RelayRotation(epoch: epoch, tokenHash: RelayAPI.tokenHash(token), grants: grants, uploadKey: uploadKey)
    }
}
