import Crypto
import ShoalCore

/// One signed statement about the cluster's membership: "node N (key K, site S) is a member" or "node N is
/// removed", by a member (whose own key and site the record carries), at a time.
///
/// Records are only ever added. The roster table keys each by its hash (``id``); ``Roster`` decides membership
/// from all of them: a removal wins over every add of the same node, forever.
public struct RosterRecord: Sendable, Hashable {
    /// What the record says.
    public enum Action: UInt8, Sendable {
        /// The subject is a member.
        case add = 1
        /// The subject is removed, for good.
        case remove = 2
        /// The subject writes under ``RosterRecord/siteID`` too: signed by the subject itself when its database moved
        /// to a fresh site (restored from an older copy, or copied), so that a removal fences that site as well.
        case site = 3
    }

    /// What the record says.
    public var action: Action
    /// The cluster it belongs to (16 bytes); records of other clusters are ignored.
    public var clusterID: [UInt8]
    /// The node it is about.
    public var subject: NodeID
    /// An add: the subject's public key (DER SubjectPublicKeyInfo), whose hash is ``subject``. Empty for a removal.
    public var subjectKey: [UInt8]
    /// An add: the site id the subject's hellos must carry. A removal: the site it cuts (the subject's site when the
    /// signer knew it, or another site the subject wrote under). A site binding: the site the subject writes under.
    public var siteID: SiteID?
    /// A removal: the highest seq of the subject's site the signer held when it signed (its *cut*). Members refuse
    /// every change of that site beyond the highest cut of the subject's removals, whatever path it comes by: what the
    /// subject writes after its removal never counts. A member that held more when it learnt of the removal signs
    /// a removal of its own with what it held, so every member draws the same line. Nil in records made before
    /// cuts existed (encoding version 2).
    public var cut: UInt64?
    /// The subject's name when the record was made, for people.
    public var name: String
    /// The member that signed it.
    public var signer: NodeID
    /// The signer's public key (DER SubjectPublicKeyInfo), whose hash is ``signer``.
    public var signerKey: [UInt8]
    /// The signer's site id (how the founder's site becomes known: no record adds the founder).
    public var signerSite: SiteID
    /// When, in milliseconds since the Unix epoch (the signer's clock; for people and for ordering adds).
    public var signedAtMilliseconds: UInt64
    /// ECDSA P-256 over ``signedBytes``, by the signer's key (64 bytes, raw form).
    public var signature: [UInt8]

    /// A record signed by `signer`.
    public static func make(
        _ action: Action,
        cluster: [UInt8],
        subject: NodeID,
        subjectKey: [UInt8] = [],
        siteID: SiteID? = nil,
        name: String,
        signer: NodeIdentity,
        signerSite: SiteID,
        cut: UInt64? = nil,
        at milliseconds: UInt64
    ) throws(ShoalError) -> RosterRecord {
        var record = RosterRecord(
            action: action,
            clusterID: cluster,
            subject: subject,
            subjectKey: subjectKey,
            siteID: siteID,
            name: String(name.prefix(64)),
            signer: signer.nodeID,
            signerKey: signer.publicKeyDER,
            signerSite: signerSite,
            signedAtMilliseconds: milliseconds,
            cut: action == .remove ? cut : nil,
            signature: []
        )
        record.signature = try signer.sign(record.signedBytes)
        return record
    }

    /// The bytes the signature covers.
    public var signedBytes: [UInt8] {
        // A record without a cut keeps encoding version 2, so the records made before cuts existed keep their
        // signatures and older members still read every add.
        var bytes: [UInt8] = Array("SHOAL-ROSTER".utf8) + [cut == nil ? 2 : Self.version, action.rawValue]
        bytes += clusterID
        bytes += subject.bytes
        bytes.appendVarint(UInt64(subjectKey.count))
        bytes += subjectKey
        if let siteID {
            bytes.append(1)
            bytes += siteID.bytes
        } else {
            bytes.append(0)
        }
        bytes.appendVarint(UInt64(name.utf8.count))
        bytes += name.utf8
        bytes += signer.bytes
        bytes.appendVarint(UInt64(signerKey.count))
        bytes += signerKey
        bytes += signerSite.bytes
        bytes.appendBigEndian(signedAtMilliseconds)
        if let cut { bytes.appendBigEndian(cut) }
        return bytes
    }

    /// The encoding's version: 3 adds a removal's cut (records without one are still written as version 2).
    static let version: UInt8 = 3

    /// What the roster table stores: the signed bytes, then the signature.
    public var encoded: [UInt8] { signedBytes + signature }

    /// The record's key in the roster table: the SHA-256 of ``encoded``.
    public var id: [UInt8] { Array(SHA256.hash(data: encoded)) }

    /// Decodes a stored record; throws on anything malformed (the signature is checked by ``Roster``).
    public init(decoding bytes: [UInt8]) throws(ShoalError) {
        var reader = ByteReader(bytes)
        func fail(_ what: String) -> ShoalError { ShoalError(code: .corruptMetadata, message: "a roster record \(what)") }
        guard bytes.count > 12, Array(try reader.readBytes(12)) == Array("SHOAL-ROSTER".utf8) else {
            throw fail("without its header")
        }
        let version = try reader.readByte()
        guard version == 2 || version == Self.version else { throw fail("of an unknown version") }
        guard let action = Action(rawValue: try reader.readByte()) else { throw fail("with an unknown action") }
        self.action = action
        clusterID = Array(try reader.readBytes(16))
        guard let subject = NodeID(bytes: try reader.readBytes(32)) else { throw fail("with a bad subject") }
        self.subject = subject
        let keyLength = try reader.readVarint()
        guard keyLength <= 512 else { throw fail("with an overlong key") }
        subjectKey = Array(try reader.readBytes(Int(keyLength)))
        switch try reader.readByte() {
        case 0: siteID = nil
        case 1: siteID = SiteID(bytes: try reader.readBytes(16))
        default: throw fail("with a bad site flag")
        }
        let nameLength = try reader.readVarint()
        guard nameLength <= 256, let name = String(validating: try reader.readBytes(Int(nameLength)), as: UTF8.self)
        else { throw fail("with a bad name") }
        self.name = name
        guard let signer = NodeID(bytes: try reader.readBytes(32)) else { throw fail("with a bad signer") }
        self.signer = signer
        let signerKeyLength = try reader.readVarint()
        guard signerKeyLength <= 512 else { throw fail("with an overlong key") }
        signerKey = Array(try reader.readBytes(Int(signerKeyLength)))
        guard let signerSite = SiteID(bytes: try reader.readBytes(16)) else { throw fail("with a bad signer site") }
        self.signerSite = signerSite
        signedAtMilliseconds = try reader.readBigEndianUInt64()
        cut = version >= 3 ? try reader.readBigEndianUInt64() : nil
        guard cut == nil || action == .remove else { throw fail("that cuts without removing") }
        signature = Array(try reader.readBytes(64))
        guard reader.isAtEnd else { throw fail("with trailing bytes") }
    }

    private init(
        action: Action,
        clusterID: [UInt8],
        subject: NodeID,
        subjectKey: [UInt8],
        siteID: SiteID?,
        name: String,
        signer: NodeID,
        signerKey: [UInt8],
        signerSite: SiteID,
        signedAtMilliseconds: UInt64,
        cut: UInt64?,
        signature: [UInt8]
    ) {
        self.action = action
        self.clusterID = clusterID
        self.subject = subject
        self.subjectKey = subjectKey
        self.siteID = siteID
        self.name = name
        self.signer = signer
        self.signerKey = signerKey
        self.signerSite = signerSite
        self.signedAtMilliseconds = signedAtMilliseconds
        self.cut = cut
        self.signature = signature
    }
}

/// A cluster's membership, decided from every roster record held.
///
/// The founder (the node whose id begins with the cluster id) is a member without any record; a record counts when
/// its signature checks against the key it carries and that key is vouched for: the founder's, or the key of a
/// counted add. Members are the founder and the subjects of counted adds, minus every subject of a counted removal:
/// a removal wins over any add, made before or after it, forever. Records of other clusters, forged or malformed,
/// do not count.
public struct Roster: Sendable {
    /// A member as the roster knows it.
    public struct Member: Sendable, Hashable {
        /// Its node id.
        public var nodeID: NodeID
        /// Its public key.
        public var publicKeyDER: [UInt8]
        /// The site id its hellos must carry (nil: not known, which only the founder's can be, before it signs).
        public var siteID: SiteID?
        /// Its name when added.
        public var name: String
        /// Who added it (itself, for the founder).
        public var addedBy: NodeID
        /// When (signer's clock).
        public var addedAtMilliseconds: UInt64

        /// A member.
        public init(
            nodeID: NodeID,
            publicKeyDER: [UInt8],
            siteID: SiteID?,
            name: String,
            addedBy: NodeID,
            addedAtMilliseconds: UInt64
        ) {
            self.nodeID = nodeID
            self.publicKeyDER = publicKeyDER
            self.siteID = siteID
            self.name = name
            self.addedBy = addedBy
            self.addedAtMilliseconds = addedAtMilliseconds
        }
    }

    /// The cluster.
    public let clusterID: [UInt8]
    /// Members known by a record: every member but a founder that has signed nothing yet.
    public private(set) var members: [NodeID: Member] = [:]
    /// Removed nodes, with the removal that counted first.
    public private(set) var removed: [NodeID: RosterRecord] = [:]
    /// The records that counted.
    public private(set) var records: [RosterRecord] = []
    /// The sites each node bound to itself beside the one its membership names (``RosterRecord/Action/site``).
    public private(set) var boundSites: [NodeID: Set<SiteID>] = [:]
    /// Every site known of each removed node: the one its membership names, those it bound, those its removals name.
    public private(set) var removedSites: [NodeID: Set<SiteID>] = [:]
    /// Per removed node's site, the highest cut of its removals (``RosterRecord/cut``): members refuse that site's
    /// changes beyond it. A site of a removed node no removal cuts is in ``removedSites`` only (fenced at what a
    /// member holds of it when it learns of the removal).
    public private(set) var fences: [SiteID: UInt64] = [:]

    /// The membership `records` give for cluster `clusterID`.
    ///
    /// A removed node's signature vouches only for what it signed before its removal (by the clocks of the two
    /// records): a removed node, the founder included, admits and removes no one after it.
    public init(records candidates: [RosterRecord], clusterID: [UInt8]) {
        self.clusterID = clusterID
        let all = candidates.filter { $0.clusterID == clusterID }
        // Drop what removed signers signed after their removal, and weigh again, until the removals settle (a
        // removal dropped this way may bring back what its subject signed; a few passes settle any real roster).
        var removals: [NodeID: UInt64] = [:]
        var counted: [RosterRecord] = []
        for _ in 0..<16 {
            // A site binding counts whenever it was signed: it only ever makes its signer's removal fence more.
            let kept = all.filter { record in
                record.action == .site || removals[record.signer].map { record.signedAtMilliseconds < $0 } ?? true
            }
            counted = Self.counted(kept, clusterID: clusterID)
            var next: [NodeID: UInt64] = [:]
            for record in counted where record.action == .remove {
                next[record.subject] = min(next[record.subject] ?? .max, record.signedAtMilliseconds)
            }
            if next == removals { break }
            removals = next
        }
        records = counted
        // The earliest add binds a node (ties: the smaller record id), so every member decides alike; the founder is
        // known by the records it signed.
        let ordered = records.map { (record: $0, id: $0.id) }.sorted { a, b in
            a.record.signedAtMilliseconds != b.record.signedAtMilliseconds
                ? a.record.signedAtMilliseconds < b.record.signedAtMilliseconds : a.id.lexicographicallyPrecedes(b.id)
        }.map(\.record)
        for record in ordered {
            if Self.isFounder(record.signer, of: clusterID), members[record.signer] == nil {
                members[record.signer] = Member(
                    nodeID: record.signer,
                    publicKeyDER: record.signerKey,
                    siteID: record.signerSite,
                    name: "",
                    addedBy: record.signer,
                    addedAtMilliseconds: record.signedAtMilliseconds
                )
            }
            switch record.action {
            case .add:
                guard members[record.subject] == nil else { continue }
                members[record.subject] = Member(
                    nodeID: record.subject,
                    publicKeyDER: record.subjectKey,
                    siteID: record.siteID,
                    name: record.name,
                    addedBy: record.signer,
                    addedAtMilliseconds: record.signedAtMilliseconds
                )
            case .remove:
                if removed[record.subject] == nil { removed[record.subject] = record }
            case .site:
                if let site = record.siteID { boundSites[record.subject, default: []].insert(site) }
            }
        }
        // A removal without a site names the site the subject's membership names.
        var named: [NodeID: SiteID] = [:]
        for node in removed.keys {
            var sites = boundSites[node] ?? []
            if let site = members[node]?.siteID {
                named[node] = site
                sites.insert(site)
            }
            for record in records where record.action == .remove && record.subject == node {
                if let site = record.siteID { sites.insert(site) }
                if named[node] == nil, let site = record.siteID { named[node] = site }
            }
            if !sites.isEmpty { removedSites[node] = sites }
        }
        for record in records where record.action == .remove {
            guard let cut = record.cut, let site = record.siteID ?? named[record.subject],
                removedSites[record.subject]?.contains(site) == true
            else { continue }
            fences[site] = max(fences[site] ?? 0, cut)
        }
        for node in removed.keys { members[node] = nil }
    }

    /// The records whose signatures check against a key the roster vouches for.
    private static func counted(_ candidates: [RosterRecord], clusterID: [UInt8]) -> [RosterRecord] {
        var keys: [NodeID: [UInt8]] = [:]
        var counted: [RosterRecord] = []
        var waiting = candidates
        var progress = true
        while progress {
            progress = false
            var next: [RosterRecord] = []
            for record in waiting {
                let vouched = isFounder(record.signer, of: clusterID) || keys[record.signer] == record.signerKey
                guard vouched else {
                    next.append(record)
                    continue
                }
                guard NodeIdentity.nodeID(ofPublicKeyDER: record.signerKey) == record.signer,
                    NodeIdentity.isValid(signature: record.signature, of: record.signedBytes, publicKeyDER: record.signerKey),
                    record.action != .add || NodeIdentity.nodeID(ofPublicKeyDER: record.subjectKey) == record.subject,
                    record.action != .site || (record.subject == record.signer && record.siteID != nil)
                else { continue }  // forged or inconsistent: never counts
                counted.append(record)
                progress = true
                if record.action == .add, keys[record.subject] == nil { keys[record.subject] = record.subjectKey }
            }
            waiting = next
        }
        return counted
    }

    /// The most records an admission proof carries (``admissionProof(of:)``); a longer one is refused unread.
    public static let maximumProofRecords = 32

    /// The adds that admit `node`, each followed by the add of its signer, up to the founder (or
    /// ``maximumProofRecords`` of them): what a member shows a member admitted before it, which does not know it yet
    /// (see ``admitting(_:key:proof:)``). Empty for the founder and for a node this roster does not admit.
    public func admissionProof(of node: NodeID) -> [RosterRecord] {
        var proof: [RosterRecord] = []
        var current = node
        var seen: Set<NodeID> = []
        while proof.count < Self.maximumProofRecords, !Self.isFounder(current, of: clusterID),
            let member = members[current], seen.insert(current).inserted,
            let add = records.first(where: { record in
                record.action == .add && record.subject == current && record.signer == member.addedBy
                    && record.signedAtMilliseconds == member.addedAtMilliseconds
            })
        {
            proof.append(add)
            current = add.signer
        }
        return proof
    }

    /// This roster with the adds of `proof` that admit `node` (whose key is `key`), when they do: each add is signed
    /// by a member this roster knows (the founder, or a member with the same key) or by a node an earlier add of the
    /// proof admits, and none of the nodes on the way is removed here. Nil otherwise. Signatures are checked only
    /// along a chain that reaches a known member, so a stranger's proof costs no more than its own records.
    public func admitting(_ node: NodeID, key: [UInt8], proof: [RosterRecord]) -> Roster? {
        guard !proof.isEmpty, proof.count <= Self.maximumProofRecords, removed[node] == nil, !isMember(node) else {
            return nil
        }
        var vouched: [NodeID: [UInt8]] = [:]
        var counted: [RosterRecord] = []
        var waiting = proof.filter { $0.action == .add && $0.clusterID == clusterID }
        var progress = true
        while progress {
            progress = false
            var next: [RosterRecord] = []
            for record in waiting {
                let signer = record.signer
                let known =
                    (Self.isFounder(signer, of: clusterID) && isMember(signer)
                        && NodeIdentity.nodeID(ofPublicKeyDER: record.signerKey) == signer)
                    || (members[signer].map { $0.publicKeyDER == record.signerKey } ?? false)
                    || vouched[signer] == record.signerKey
                guard known else {
                    next.append(record)
                    continue
                }
                guard removed[signer] == nil, removed[record.subject] == nil,
                    NodeIdentity.isValid(signature: record.signature, of: record.signedBytes, publicKeyDER: record.signerKey),
                    NodeIdentity.nodeID(ofPublicKeyDER: record.subjectKey) == record.subject
                else { continue }
                counted.append(record)
                progress = true
                if vouched[record.subject] == nil { vouched[record.subject] = record.subjectKey }
            }
            waiting = next
        }
        guard vouched[node] == key else { return nil }
        // The whole roster decides, as it does for records that arrive by sync: the earliest add binds a node.
        let extended = Roster(records: records + counted, clusterID: clusterID)
        guard extended.members[node]?.publicKeyDER == key else { return nil }
        return extended
    }

    /// Whether `node` founded cluster `clusterID` (its id begins with it).
    public static func isFounder(_ node: NodeID, of clusterID: [UInt8]) -> Bool {
        Array(node.bytes.prefix(clusterID.count)) == clusterID
    }

    /// A member as the roster knows it: the founder without a record has no key or site known yet.
    public func member(_ node: NodeID) -> Member? {
        if let member = members[node] { return member }
        guard isMember(node) else { return nil }
        return Member(nodeID: node, publicKeyDER: [], siteID: nil, name: "", addedBy: node, addedAtMilliseconds: 0)
    }

    /// Every site `node` writes or wrote under, as far as the roster knows: the one its membership names and those it
    /// bound (a removed node's include those its removals name).
    public func sites(of node: NodeID) -> Set<SiteID> {
        if let sites = removedSites[node] { return sites }
        var sites = boundSites[node] ?? []
        if let site = members[node]?.siteID { sites.insert(site) }
        return sites
    }

    /// Whether `node` is a member: the founder unless removed, or a node a counted add names.
    public func isMember(_ node: NodeID) -> Bool {
        members[node] != nil || (Self.isFounder(node, of: clusterID) && removed[node] == nil)
    }
}
