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
            keyring: keyring, token: "t", roster: behind, identity: member,
            listed: [try grant(1, secret: 1, to: member, by: founder)]
        )
        #expect(Set(missing.map(\.recipient.node)) == Set(behind.members.keys).subtracting([removed.nodeID, member.nodeID]))
        #expect(missing.allSatisfy { $0.contents.token == "t" })
    }
}
