import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalSecurity

/// The roster's rules, without sockets: who counts, and that a removal wins.
@Suite struct RosterTests {
    private let founder = NodeIdentity.generate()
    private var cluster: [UInt8] { Array(founder.nodeID.bytes.prefix(16)) }

    private func add(_ subject: NodeIdentity, by signer: NodeIdentity, at time: UInt64 = 1) throws -> RosterRecord {
        try RosterRecord.make(
            .add,
            cluster: cluster,
            subject: subject.nodeID,
            subjectKey: subject.publicKeyDER,
            siteID: .random(),
            name: "n",
            signer: signer,
            signerSite: .random(),
            at: time
        )
    }

    private func remove(_ subject: NodeIdentity, by signer: NodeIdentity, at time: UInt64 = 2) throws -> RosterRecord {
        try RosterRecord.make(
            .remove,
            cluster: cluster,
            subject: subject.nodeID,
            name: "n",
            signer: signer,
            signerSite: .random(),
            at: time
        )
    }

    @Test func theFounderIsAMemberWithoutARecordAndVouchesForTheNodesItAdds() throws {
        #expect(Roster(records: [], clusterID: cluster).isMember(founder.nodeID))
        let b = NodeIdentity.generate()
        let c = NodeIdentity.generate()
        // Given in any order: c was added by b, b by the founder.
        let records = [try add(c, by: b), try add(b, by: founder)]
        let roster = Roster(records: records, clusterID: cluster)
        #expect(Set(roster.members.keys) == [founder.nodeID, b.nodeID, c.nodeID])
        #expect(roster.members[c.nodeID]?.addedBy == b.nodeID)
        // The founder's key and site come from what it signed.
        #expect(roster.members[founder.nodeID]?.publicKeyDER == founder.publicKeyDER)
        #expect(roster.members[founder.nodeID]?.siteID == records[1].signerSite)
    }

    @Test func aRemovalWinsOverEveryAddBeforeOrAfterIt() throws {
        let b = NodeIdentity.generate()
        let records = [
            try add(b, by: founder, at: 1), try remove(b, by: founder, at: 2),
            try add(b, by: founder, at: 3),
        ]
        for permutation in [records, records.reversed(), [records[1], records[2], records[0]]] {
            let roster = Roster(records: permutation, clusterID: cluster)
            #expect(!roster.isMember(b.nodeID))
            #expect(roster.removed[b.nodeID] != nil)
        }
    }

    @Test func forgedOtherClusterAndUnvouchedRecordsDoNotCount() throws {
        let b = NodeIdentity.generate()
        let outsider = NodeIdentity.generate()
        var forged = try add(b, by: founder)
        forged.name = "changed after signing"
        let unvouched = try add(b, by: outsider)
        // A self-add by someone whose id does not begin with the cluster id: not the founder.
        let pretender = try add(outsider, by: outsider)
        // A record whose carried key is not its signer's.
        var borrowedKey = try add(b, by: founder)
        borrowedKey.signerKey = outsider.publicKeyDER
        var otherCluster = try add(b, by: founder)
        otherCluster.clusterID = Array(repeating: 7, count: 16)
        let removalByOutsider = try remove(founder, by: outsider)
        let roster = Roster(
            records: [forged, unvouched, pretender, otherCluster, removalByOutsider, borrowedKey],
            clusterID: cluster
        )
        #expect(roster.members.isEmpty && roster.records.isEmpty)
        #expect(roster.isMember(founder.nodeID) && !roster.isMember(b.nodeID) && !roster.isMember(outsider.nodeID))
    }

    @Test func anAddWhoseKeyIsNotItsSubjectsDoesNotCount() throws {
        let b = NodeIdentity.generate()
        let c = NodeIdentity.generate()
        let mismatched = try RosterRecord.make(
            .add,
            cluster: cluster,
            subject: b.nodeID,
            subjectKey: c.publicKeyDER,
            name: "b with c's key",
            signer: founder,
            signerSite: .random(),
            at: 1
        )
        #expect(!Roster(records: [mismatched], clusterID: cluster).isMember(b.nodeID))
    }

    @Test func recordsRoundTripAndMalformedBytesAreRefused() throws {
        let record = try add(NodeIdentity.generate(), by: founder)
        #expect(try RosterRecord(decoding: record.encoded) == record)
        for cut in [0, 1, 12, 30, record.encoded.count - 1] {
            #expect(throws: ShoalError.self) { try RosterRecord(decoding: Array(record.encoded.prefix(cut))) }
        }
        #expect(throws: ShoalError.self) { try RosterRecord(decoding: record.encoded + [0]) }
    }

    @Test func nodeIDsPrintGroupedAndParseEitherWay() throws {
        let id = founder.nodeID
        let text = id.description
        #expect(text.count == 52 + 12)
        #expect(text.split(separator: "-").allSatisfy { $0.count == 4 })
        #expect(NodeID(parsing: text) == id)
        #expect(NodeID(parsing: text.lowercased().replacingOccurrences(of: "-", with: " ")) == id)
        #expect(id.short == String(text.prefix(9)))
        #expect(NodeID(parsing: String(text.dropLast())) == nil)
        #expect(NodeID(parsing: text.replacingOccurrences(of: "A", with: "1")) == nil || !text.contains("A"))
    }

    @Test func theKeyFileIsTheOwnersOnlyAndRefusedWhenOthersMayReadIt() throws {
        let directory = try temporaryDirectory("keyfile")
        defer { try? FileManager.default.removeItem(at: directory) }
        let database = directory.appendingPathComponent("k.db").path
        let keyFile = KeyFile(identity: founder, cluster: .founded(by: founder.nodeID))
        try keyFile.save(forDatabase: database)
        let loaded = try KeyFile.load(forDatabase: database)
        #expect(loaded.identity.nodeID == founder.nodeID && loaded.cluster == keyFile.cluster)
        chmod(KeyFile.path(forDatabase: database), 0o644)
        #expect {
            try KeyFile.load(forDatabase: database)
        } throws: { error in
            (error as? ShoalError)?.code == .identity && "\(error)".contains("chmod 600")
        }
        #expect(throws: ShoalError.self) { try KeyFile.load(forDatabase: database + "-missing") }
    }
}

extension RosterTests {
    @Test func aRemovedNodeAdmitsNoOneAfterItsRemovalButWhatItSignedBeforeStays() throws {
        let b = NodeIdentity.generate()
        let c = NodeIdentity.generate()
        let d = NodeIdentity.generate()
        let records = [
            try add(b, by: founder, at: 1),
            try add(c, by: b, at: 2),  // before b's removal: stays
            try remove(b, by: founder, at: 3),
            try add(d, by: b, at: 4),  // after: does not count
        ]
        let roster = Roster(records: records, clusterID: cluster)
        #expect(roster.isMember(c.nodeID))
        #expect(!roster.isMember(d.nodeID) && !roster.isMember(b.nodeID))
        // A removed founder too: what it signs afterwards counts for nothing.
        let late = try add(d, by: founder, at: 10)
        let founderRemoved = Roster(records: records + [try remove(founder, by: c, at: 5), late], clusterID: cluster)
        #expect(!founderRemoved.isMember(founder.nodeID) && !founderRemoved.isMember(d.nodeID))
        #expect(founderRemoved.isMember(c.nodeID))
    }

    /// A member admitted after another shows the adds that admit it (in its certificate); the earlier member counts
    /// them only along a chain of valid signatures from a member it knows, and never for a removed node.
    @Test func anAdmissionProofCountsOnlyAlongValidSignaturesFromAKnownMember() throws {
        let b = NodeIdentity.generate()
        let c = NodeIdentity.generate()
        let d = NodeIdentity.generate()
        let addB = try add(b, by: founder, at: 1)
        let addC = try add(c, by: b, at: 2)
        let addD = try add(d, by: c, at: 3)
        // The newest member's view: every add. Its proof is its add, then its signer's, up to the founder.
        let newest = Roster(records: [addB, addC, addD], clusterID: cluster)
        #expect(newest.admissionProof(of: d.nodeID) == [addD, addC, addB])
        #expect(newest.admissionProof(of: founder.nodeID).isEmpty)
        #expect(newest.admissionProof(of: NodeIdentity.generate().nodeID).isEmpty)

        // A member that knows only the founder takes d from its proof, and c on the way (b vouched by the founder).
        let early = Roster(records: [], clusterID: cluster)
        let taken = try #require(early.admitting(d.nodeID, key: d.publicKeyDER, proof: [addD, addC, addB]))
        #expect(taken.isMember(d.nodeID) && taken.isMember(c.nodeID) && taken.isMember(b.nodeID))
        #expect(taken.member(d.nodeID)?.siteID == addD.siteID)
        // One that knows b needs only the two adds after it.
        let knowsB = Roster(records: [addB], clusterID: cluster)
        #expect(knowsB.admitting(d.nodeID, key: d.publicKeyDER, proof: [addD, addC])?.isMember(d.nodeID) == true)

        // Refused: a chain that reaches no known member, another key than the add's, a forged record, a record of
        // another cluster, a removed signer on the way, a removed subject, and a proof longer than allowed.
        #expect(early.admitting(d.nodeID, key: d.publicKeyDER, proof: [addD, addC]) == nil)
        #expect(early.admitting(d.nodeID, key: c.publicKeyDER, proof: [addD, addC, addB]) == nil)
        var forged = addD
        forged.siteID = .random()
        #expect(early.admitting(d.nodeID, key: d.publicKeyDER, proof: [forged, addC, addB]) == nil)
        let outsider = NodeIdentity.generate()
        let byOutsider = try add(d, by: outsider, at: 3)
        #expect(early.admitting(d.nodeID, key: d.publicKeyDER, proof: [byOutsider]) == nil)
        var otherCluster = addD
        otherCluster.clusterID = Array(repeating: 7, count: 16)
        #expect(early.admitting(d.nodeID, key: d.publicKeyDER, proof: [otherCluster, addC, addB]) == nil)
        let cRemoved = Roster(records: [addB, try remove(c, by: founder, at: 4)], clusterID: cluster)
        #expect(cRemoved.admitting(d.nodeID, key: d.publicKeyDER, proof: [addD, addC]) == nil)
        let dRemoved = Roster(records: [addB, addC, try remove(d, by: founder, at: 4)], clusterID: cluster)
        #expect(dRemoved.admitting(d.nodeID, key: d.publicKeyDER, proof: [addD]) == nil)
        let long = Array(repeating: addD, count: Roster.maximumProofRecords) + [addC, addB]
        #expect(early.admitting(d.nodeID, key: d.publicKeyDER, proof: long) == nil)
    }

    /// The proof travels in the member's certificate, in an extension TLS libraries pass over; a malformed one reads
    /// as no proof.
    @Test func aCertificateCarriesItsAdmissionAndAMalformedOneReadsAsNone() throws {
        let b = NodeIdentity.generate()
        let addB = try add(b, by: founder, at: 1)
        let certificate = try b.certificate(name: "b", siteID: .random(), admission: [addB])
        #expect(try PeerCertificate(certificate).admission == [addB])
        #expect(try PeerCertificate(b.certificate(name: "b", siteID: .random())).admission.isEmpty)
        let encoded = PeerCertificate.encode(admission: [addB])
        #expect(PeerCertificate.decode(admission: encoded[...]) == [addB])
        #expect(PeerCertificate.decode(admission: encoded.dropLast()).isEmpty)
        #expect(PeerCertificate.decode(admission: (encoded + [0])[...]).isEmpty)
        #expect(PeerCertificate.decode(admission: [0xFF, 0xFF, 0xFF, 0x0F]).isEmpty)
    }
}
