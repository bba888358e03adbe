import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity
import Testing

@testable import ShoalRelayClient

/// Membership decides, not the relay: which grants a node adopts, who gets grants, and when it rotates.
@Suite struct RelayEpochPlanTests {
    private let founder = NodeIdentity.generate()
    private let member = NodeIdentity.generate()
    private let removed = NodeIdentity.generate()
    private var cluster: [UInt8] { Array(founder.nodeID.bytes.prefix(16)) }
    private let clusterID = "cluster"

    private func record(_ action: RosterRecord.Action, _ subject: NodeIdentity, at time: UInt64) throws -> RosterRecord {
        try RosterRecord.make(
            action, cluster: cluster, subject: subject.nodeID, subjectKey: subject.publicKeyDER, siteID: .random(),
            name: "n", signer: founder, signerSite: .random(), at: time
        )
    }

    private func roster(removing: Bool) throws -> Roster {
        var records = [try record(.add, member, at: 1), try record(.add, removed, at: 1)]
        if removing { records.append(try record(.remove, removed, at: 2)) }
        return Roster(records: records, clusterID: cluster)
    }

    private func grant(_ epoch: UInt32, secret: UInt8, to recipient: NodeIdentity, by signer: NodeIdentity) throws -> RelayGrant {
        let contents = EpochGrant.Contents(secret: Array(repeating: secret, count: 32), token: "t\(epoch)", removed: [])
        let made = try EpochGrant.make(
            cluster: clusterID, epoch: epoch, contents: contents, recipient: recipient.nodeID,
            recipientKey: recipient.publicKeyDER, signer: signer
        )
        return RelayGrant(epoch: epoch, recipient: recipient.nodeID.description, body: Data(made.encoded).base64EncodedString())
    }

    @Test func onlyAMembersGrantForThisNodeThatOpensAndIsNewIsAdopted() throws {
        let roster = try roster(removing: true)
        var keyring = RelayKeyring()
        keyring.epochs = [RelayKeyring.Epoch(epoch: 1, secret: Data(Array(repeating: 1, count: 32)).base64EncodedString(), removed: [])]
        keyring.token = "t1"
        var forged = try grant(3, secret: 3, to: member, by: founder)
        forged.body = Data(Array(Data(base64Encoded: forged.body)!).map { $0 ^ 0x20 }).base64EncodedString()
        let listed = [
            try grant(1, secret: 1, to: member, by: founder),  // held already
            try grant(2, secret: 2, to: member, by: removed),  // a removed node's rotation
            try grant(2, secret: 9, to: founder, by: founder),  // for another node
            forged,
            try grant(4, secret: 4, to: member, by: founder),
        ]
        let adopted = RelayEpochPlan.adoptable(listed, identity: member, cluster: clusterID, roster: roster, keyring: keyring)
        #expect(adopted.map(\.epoch) == [4])
        #expect(adopted.first?.contents.secret == Array(repeating: 4, count: 32))
        // The newest epoch held, granted again with the same secret and another token (started again at a relay that
        // lost it): adopted for its token; with the token held, not.
        let again = [try grant(1, secret: 1, to: member, by: founder)]
        keyring.epochs.removeAll { $0.epoch > 1 }
        keyring.token = "held"
        #expect(RelayEpochPlan.adoptable(again, identity: member, cluster: clusterID, roster: roster, keyring: keyring).map(\.contents.token) == ["t1"])
        keyring.token = "t1"
        #expect(RelayEpochPlan.adoptable(again, identity: member, cluster: clusterID, roster: roster, keyring: keyring).isEmpty)
    }

    @Test func aRemovalNoHeldEpochExcludesRotatesAndTheRemovedNodeGetsNoGrant() throws {
        let roster = try roster(removing: true)
        #expect(RelayEpochPlan.next(roster: roster, identity: member, excluded: [], granted: nil) == .rotate)
        #expect(RelayEpochPlan.next(roster: roster, identity: removed, excluded: [], granted: nil) == .none)
        let excluded: Set<String> = [removed.nodeID.description]
        let members = Set(roster.members.keys).union([member.nodeID])
        #expect(RelayEpochPlan.next(roster: roster, identity: member, excluded: excluded, granted: nil) == .grantMembers(members))
        #expect(RelayEpochPlan.next(roster: roster, identity: member, excluded: excluded, granted: members) == .none)
        // A member whose roster has not caught up with the removal still grants nothing to a node an epoch excludes.
        let behind = try self.roster(removing: false)
        let recipients = RelayEpochPlan.recipients(behind, identity: member, excluding: excluded).map(\.node)
        #expect(!recipients.contains(removed.nodeID) && recipients.contains(member.nodeID))
        var keyring = RelayKeyring()
        keyring.epochs = [
            RelayKeyring.Epoch(
                epoch: 1, secret: Data(Array(repeating: 1, count: 32)).base64EncodedString(),
                removed: [removed.nodeID.description]
            )
        ]
        let missing = RelayEpochPlan.missing(
            keyring: keyring, inUse: "t", roster: behind, identity: member, cluster: clusterID,
            listed: [try grant(1, secret: 1, to: member, by: founder)]
        )
        #expect(Set(missing.map(\.recipient.node)) == Set(behind.members.keys).subtracting([removed.nodeID, member.nodeID]))
        #expect(missing.allSatisfy { $0.contents.token == "t" })
    }

    /// Grants left for members that joined carry the newest epoch's token as the keyring holds it (the one its rotation
    /// registered), not the token in use: after a refusal the node may have fallen back to its configured token, which
    /// the rotation retired, and a new member handed that one could never be let in.
    @Test func grantsForNewMembersCarryTheKeyringsTokenNotAFallback() throws {
        let roster = try roster(removing: false)
        var keyring = RelayKeyring()
        keyring.epochs = [1, 2].map {
            RelayKeyring.Epoch(
                epoch: $0, secret: Data(Array(repeating: UInt8($0), count: 32)).base64EncodedString(), removed: []
            )
        }
        keyring.token = "rotated"
        // The relay's mailbox holds both epochs for this node only: every other member lacks both.
        let listed = [
            try grant(1, secret: 1, to: member, by: founder), try grant(2, secret: 2, to: member, by: founder),
        ]
        let missing = RelayEpochPlan.missing(
            keyring: keyring, inUse: "configured", roster: roster, identity: member, cluster: clusterID,
            listed: listed
        )
        let others = Set(roster.members.keys).union([member.nodeID]).subtracting([member.nodeID])
        #expect(Set(missing.map(\.recipient.node)) == others)
        #expect(missing.count == 2 * others.count)
        #expect(missing.filter { $0.epoch == 2 }.allSatisfy { $0.contents.token == "rotated" })
        // An older epoch's grants hand out no token.
        #expect(missing.filter { $0.epoch == 1 }.allSatisfy { $0.contents.token.isEmpty })
        // A keyring with no token of its own (no rotation replaced the configured one): the token in use.
        keyring.token = nil
        let fallback = RelayEpochPlan.missing(
            keyring: keyring, inUse: "configured", roster: roster, identity: member, cluster: clusterID,
            listed: listed
        )
        #expect(fallback.filter { $0.epoch == 2 }.allSatisfy { $0.contents.token == "configured" })
    }

    /// An older epoch that excluded a removed node does not keep it from the newest: a member that never held the newer
    /// epochs started epoch 1 afresh (excluding every node removed) at a relay that lost them, and another member then
    /// started its epoch 2 again on top of it, made before the last removal. The newest decides: rotate.
    @Test func aRemovalTheNewestEpochDoesNotExcludeRotatesEvenIfAnOlderOneDoes() throws {
        let roster = try roster(removing: true)
        var keyring = RelayKeyring()
        keyring.epochs = [
            RelayKeyring.Epoch(
                epoch: 1, secret: Data(Array(repeating: 1, count: 32)).base64EncodedString(),
                removed: [removed.nodeID.description]
            ),
            RelayKeyring.Epoch(
                epoch: 2, secret: Data(Array(repeating: 2, count: 32)).base64EncodedString(), removed: []
            ),
        ]
        #expect(keyring.removed == [removed.nodeID.description] && keyring.removedFromNewest.isEmpty)
        let step = RelayEpochPlan.next(
            roster: roster, identity: member, excluded: keyring.removedFromNewest, granted: nil
        )
        #expect(step == .rotate)
        // Granted nothing of any epoch all the same: the union of what the held epochs exclude.
        let recipients = RelayEpochPlan.recipients(roster, identity: member, excluding: keyring.removed).map(\.node)
        #expect(!recipients.contains(removed.nodeID))
    }

    /// A member grants only epochs the relay holds as it does: its own grant there opens to the secret it holds. A
    /// relay put back to an older copy may hold another secret under the number (and no grant for a member that joined
    /// after the copy and started the epoch afresh meanwhile); granting its own would fork the epoch for whoever has
    /// none there yet, itself included.
    @Test func onlyEpochsTheRelayHoldsWithTheSameSecretAreGrantedToOthers() throws {
        let roster = try roster(removing: false)
        var keyring = RelayKeyring()
        keyring.epochs = [1, 2, 3].map {
            RelayKeyring.Epoch(
                epoch: $0, secret: Data(Array(repeating: UInt8($0), count: 32)).base64EncodedString(), removed: []
            )
        }
        keyring.token = "t"
        // Epoch 1 as held here, epoch 2 with another secret, epoch 3 with no grant for this node.
        let listed = [
            try grant(1, secret: 1, to: member, by: founder), try grant(2, secret: 9, to: member, by: founder),
        ]
        let missing = RelayEpochPlan.missing(
            keyring: keyring, inUse: "t", roster: roster, identity: member, cluster: clusterID, listed: listed
        )
        #expect(!missing.isEmpty && missing.allSatisfy { $0.epoch == 1 })
        #expect(!missing.contains { $0.recipient.node == member.nodeID })
    }
}
