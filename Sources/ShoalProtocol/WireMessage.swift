import ShoalCore

/// The protocol versions this build speaks.
public enum WireProtocol {
    /// The oldest version this build accepts.
    public static let minimumVersion: UInt16 = 1
    /// The newest version this build speaks. Version 2 adds ``ValuePiece`` (values larger than a frame travel
    /// in pieces) and change kind 3 (a column whose value travels in pieces); version 3 adds read-only inspections
    /// (``WireMessage/inspect(_:)``, ``InspectionRequest``, ``InspectionAnswer``), which `shoal verify --peer` runs;
    /// version 4 adds to a ``SyncRequest`` the requester's wall clock, so a node can tell that its clock runs ahead, and
    /// the site it writes as with what it holds of the answerer's, so a node restored from an older copy can tell that
    /// it wrote transactions its peers hold with other content; version 5 carries schema changes as change sets (a
    /// replicated `shoal_schema` table) and holds changes for tables and columns a node lacks, so the hello's schema
    /// fingerprint is a position peers may differ in, no longer a condition; version 6 adds compressed frames (message
    /// type 13: a change batch or a value piece, deflated), which a node sends only on a link of version 6 or more;
    /// version 7 adds ``WireMessage/holding(_:)`` (message type 14: "I now hold this version vector"), which a node
    /// sends its peers at each commit instead of starting a round, so a peer that already holds it costs one small
    /// message, and one that lacks it pulls at once; and ``WireMessage/members(_:)`` (message type 15: what each
    /// member was last known to hold, and how long ago), so every node learns what every member holds; version 8
    /// changes what the digest in an ``Ack`` and an ``InspectionAnswer`` covers: tombstones are left out (nodes collect
    /// them at different times), so a node compares its digest with a peer's only on a link of version 8 or more;
    /// version 9 adds ``WireMessage/freshState(_:)`` (message type 16: "the last fresh state I took covers this"), by
    /// which a member suspended for collection shows its peers that it may be pulled from again; version 10 changes
    /// what a digest's row hashes cover once more: a row's columns in the order of their names, not the table's (two
    /// nodes that each added a column first hold them in another order), so a node compares digests only on a link
    /// of version 10 or more.
    public static let maximumVersion: UInt16 = 10
    /// The first version whose digests hash what this build's do (tombstones left out, columns in name order): an
    /// older peer's digest is not compared.
    public static let comparableDigestVersion: UInt16 = 10
    /// The first version whose nodes tell their peers of the fresh state they took (``WireMessage/freshState(_:)``).
    public static let freshStateVersion: UInt16 = 9
    /// The first version whose digests leave tombstones out: older peers' digests are not compared.
    public static let tombstoneFreeDigestVersion: UInt16 = 8
    /// The first version whose nodes announce their commits with ``WireMessage/holding(_:)``.
    public static let holdingVersion: UInt16 = 7
    /// The first version whose nodes take compressed frames (``WireMessage/packed(compressing:)``).
    public static let compressionVersion: UInt16 = 6
    /// The first version whose nodes keep syncing across different schemas.
    public static let schemaChangeVersion: UInt16 = 5
    /// The first version in which a ``SyncRequest`` carries the requester's wall clock.
    public static let clockVersion: UInt16 = 4
    /// The first version in which values may travel in pieces.
    public static let piecesVersion: UInt16 = 2
    /// The first four bytes of every hello: "SHOL".
    public static let magic: UInt32 = 0x5348_4F4C
    /// The default largest frame accepted, in bytes (16 MiB).
    public static let defaultMaximumFrameLength = 16 * 1024 * 1024
    /// The largest first frame a connection accepts (the peer's hello, or its refusal), in bytes: before the hello
    /// nothing is known of the peer, so it cannot make the node buffer a full-size frame (a hello is about 100).
    public static let maximumHelloFrameLength = 64 * 1024
    /// The largest value (its canonical encoding, tag and length included, minus 16 bytes of slack) a node
    /// accepts: ``SQLValue/maximumBytes``, the documented maximum value size.
    public static let maximumValueBytes = SQLValue.maximumBytes
    /// The default target size of a change batch's frame, in bytes (2 MiB): batches are cut by bytes as well
    /// as by count, well under the frame maximum.
    public static let defaultBatchBytes = 2 * 1024 * 1024
    /// Values whose encoding is longer than this travel in ``ValuePiece``s rather than inside their batch.
    public static let defaultInlineValueLimit = 64 * 1024
    /// The size of each piece of a value sent in pieces.
    public static let defaultPieceBytes = 1024 * 1024

    /// The version two nodes use: the highest both speak, or `nil` when their ranges do not meet.
    public static func negotiate(_ local: ClosedRange<UInt16>, _ remote: ClosedRange<UInt16>) -> UInt16? {
        let high = min(local.upperBound, remote.upperBound)
        return high >= max(local.lowerBound, remote.lowerBound) ? high : nil
    }
}

/// Every message of the wire protocol. The byte layout is specified in the ShoalProtocol documentation.
public enum WireMessage: Hashable, Sendable {
    /// The first message each side sends.
    case hello(Hello)
    /// "Send me everything this version vector lacks."
    case syncRequest(SyncRequest)
    /// Changes answering a request, cut at transaction boundaries.
    case changeBatch(ChangeBatchMessage)
    /// The receiver applied a batch.
    case ack(Ack)
    /// Liveness probe; answered by `pong` with the same nonce.
    case ping(UInt64)
    /// The answer to a `ping`, carrying its nonce.
    case pong(UInt64)
    /// A typed refusal; the sender closes the connection after it.
    case reject(Rejection)
    /// Part of a value too large to travel inside its change batch (protocol version 2).
    case valuePiece(ValuePiece)
    /// A step of the join exchange (``JoinMessage``), on a connection that carries nothing else.
    case join(JoinMessage)
    /// Instead of a hello (protocol version 3): the sender only inspects, read-only (``InspectionRequest``); the
    /// connection is no sync link and runs no round.
    case inspect(Hello)
    /// A question of an inspection (protocol version 3).
    case inspectionRequest(InspectionRequest)
    /// Its answer (protocol version 3).
    case inspectionAnswer(InspectionAnswer)
    /// A message encoded ahead of sending, compressed or not (``packed(compressing:)``): its bytes go out as they
    /// are. Decoding never gives one: a compressed frame decodes as the message it holds.
    case encoded(EncodedMessage)
    /// "I now hold this version vector" (protocol version 7), sent at a commit instead of a round: the receiver pulls
    /// when it lacks something of it, and otherwise does nothing.
    case holding(VersionVector)
    /// What each member the sender knows of was last known to hold, and how long ago (protocol version 7): passed on
    /// from node to node, so every node learns what every member holds, also of members it never meets.
    case members([MemberGossip])
    /// "The last fresh state I took covers this version vector" (protocol version 9): a member suspended for
    /// collection by a peer's horizon shows that peer that it took a fresh state holding every delete the peer
    /// collected without it, so the peer pulls from it again.
    case freshState(VersionVector)

    /// The type byte of each message.
    enum Kind: UInt8 {
        case hello = 1
        case syncRequest = 2
        case changeBatch = 3
        case ack = 4
        case ping = 5
        case pong = 6
        case reject = 7
        case valuePiece = 8
        case join = 9
        case inspect = 10
        case inspectionRequest = 11
        case inspectionAnswer = 12
        case compressed = 13
        case holding = 14
        case members = 15
        case freshState = 16
    }
}

/// The handshake: who the sender is and what it speaks.
public struct Hello: Hashable, Sendable {
    /// The protocol versions the sender speaks; both sides use the highest they share
    /// (``WireProtocol/negotiate(_:_:)``).
    public var versions: ClosedRange<UInt16>
    /// Nodes of different clusters refuse each other.
    public var clusterID: String
    /// The sender's site id; a hello carrying the receiver's own is refused as a self connection.
    public var siteID: SiteID
    /// The sender's human-readable name, for status and logs.
    public var nodeName: String
    /// A fingerprint of the replicated tables' schema: the sender's schema position. From protocol version 5 on,
    /// peers whose fingerprints differ keep syncing (each holds what it cannot merge yet); an older peer cannot.
    public var schemaFingerprint: String
    /// The port the sender accepts connections on (0: none), so a peer can dial back later.
    public var listenPort: UInt16

    /// A hello speaking, unless told otherwise, every protocol version this build speaks.
    public init(
        versions: ClosedRange<UInt16> = WireProtocol.minimumVersion...WireProtocol.maximumVersion,
        clusterID: String,
        siteID: SiteID,
        nodeName: String,
        schemaFingerprint: String,
        listenPort: UInt16
    ) {
        self.versions = versions
        self.clusterID = clusterID
        self.siteID = siteID
        self.nodeName = nodeName
        self.schemaFingerprint = schemaFingerprint
        self.listenPort = listenPort
    }
}

/// A request for the changes a version vector lacks.
public struct SyncRequest: Hashable, Sendable {
    /// Chosen by the requester; every batch and acknowledgement of the answer carries it.
    public var requestID: UInt64
    /// Exactly what the requester holds: the answer is every change it lacks.
    public var versionVector: VersionVector
    /// The requester's wall clock when it asked, in milliseconds since the Unix epoch (protocol version 4; `nil`
    /// from older peers): the answering node compares it with its own, to notice that its clock runs ahead of its
    /// peers' and stamp its writes with their time instead.
    public var wallClockMilliseconds: UInt64?

    /// The site the requester writes as (protocol version 4; `nil` from older peers). The answering node learns it
    /// from here, to send back, in its own requests, what it holds of it (``answererHead``).
    public var writingSite: SiteID?
    /// The latest transaction the requester holds of the answerer's writing site (as learned from the answerer's
    /// requests), with its clock (protocol version 4): a transaction's clock is the same wherever it is held, so an
    /// answerer that holds this number with another clock wrote other content under a number its peers hold (it was
    /// restored from an older copy that lost its record of what it had sent).
    public var answererHead: Stamp?

    /// A request for what `versionVector` lacks.
    public init(
        requestID: UInt64,
        versionVector: VersionVector,
        wallClockMilliseconds: UInt64? = nil,
        writingSite: SiteID? = nil,
        answererHead: Stamp? = nil
    ) {
        self.requestID = requestID
        self.versionVector = versionVector
        self.wallClockMilliseconds = wallClockMilliseconds
        self.writingSite = writingSite
        self.answererHead = answererHead
    }
}

/// One batch of changes answering a ``SyncRequest``.
public struct ChangeBatchMessage: Hashable, Sendable {
    /// The request this batch answers.
    public var requestID: UInt64
    /// The batch's position in the answer, from 0: batches must be applied in order, since each one's claim
    /// assumes the ones before it.
    public var sequence: UInt32
    /// Whether this is the last batch of the answer.
    public var isLast: Bool
    /// The sender's estimate of how many changes of the answer are still to come (for progress and ETA).
    public var estimatedRemaining: UInt64
    /// The changes, in order, and what the receiver may claim once it applied them (``ChangeBatch/claim``).
    public var batch: ChangeBatch
    /// The indexes (into `batch.changes`, ascending) of column changes whose value travels in ``ValuePiece``s
    /// sent before this batch; their value inside `batch` is a placeholder (NULL) until the session puts the
    /// reassembled value back.
    public var piecedValues: [UInt32]
    /// The bytes of the frame the batch arrived in (its length prefix and payload as sent, compressed or not), for a
    /// catch-up's progress; set by the frame decoder (ShoalTransport), 0 for a batch made here. Not part of the
    /// message: it is not encoded, and batches that differ only in it are equal.
    public var frameBytes = 0

    /// A batch of the answer to `requestID`: the first (`sequence` 0) and with no pieced values unless told
    /// otherwise.
    public init(
        requestID: UInt64,
        sequence: UInt32 = 0,
        isLast: Bool,
        estimatedRemaining: UInt64 = 0,
        batch: ChangeBatch,
        piecedValues: [UInt32] = []
    ) {
        self.requestID = requestID
        self.sequence = sequence
        self.isLast = isLast
        self.estimatedRemaining = estimatedRemaining
        self.batch = batch
        self.piecedValues = piecedValues
    }
}

extension ChangeBatchMessage {
    /// Whether the two are the same message (``frameBytes``, how it arrived, is left out).
    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.requestID == rhs.requestID && lhs.sequence == rhs.sequence && lhs.isLast == rhs.isLast
            && lhs.estimatedRemaining == rhs.estimatedRemaining && lhs.batch == rhs.batch
            && lhs.piecedValues == rhs.piecedValues
    }

    /// Hashes what ``==`` compares (some of it).
    public func hash(into hasher: inout Hasher) {
        hasher.combine(requestID)
        hasher.combine(sequence)
        hasher.combine(batch)
    }
}

/// A slice of one value that travels apart from its change batch because it is too large to sit inside it.
///
/// The pieces of a value, concatenated, are the value's canonical encoding (`value` in the protocol
/// documentation). They are sent in order, before the batch that holds the change, and each piece carries
/// the total so the receiver can refuse a value beyond its maximum before buffering it.
public struct ValuePiece: Hashable, Sendable {
    /// The request whose answer the value belongs to.
    public var requestID: UInt64
    /// The sequence number of the batch the value belongs to.
    public var sequence: UInt32
    /// The index of the change within that batch.
    public var change: UInt32
    /// The length of the whole encoded value.
    public var totalLength: UInt64
    /// Where this piece starts within the encoded value.
    public var offset: UInt64
    /// This piece's bytes, at most ``SyncSession/Configuration/pieceBytes`` of them.
    public var bytes: [UInt8]

    /// The piece of change `change`'s value, in batch `sequence`, that starts at `offset`.
    public init(requestID: UInt64, sequence: UInt32, change: UInt32, totalLength: UInt64, offset: UInt64, bytes: [UInt8]) {
        self.requestID = requestID
        self.sequence = sequence
        self.change = change
        self.totalLength = totalLength
        self.offset = offset
        self.bytes = bytes
    }
}

/// Acknowledges applied batches.
public struct Ack: Hashable, Sendable {
    /// The request whose answer was applied.
    public var requestID: UInt64
    /// The receiver's version vector after applying.
    public var versionVector: VersionVector
    /// The receiver's state digest, when it computed one (after the last batch).
    public var digest: [UInt8]?

    /// Acknowledges the answer to `requestID`; `digest` only when the receiver computed one.
    public init(requestID: UInt64, versionVector: VersionVector, digest: [UInt8]? = nil) {
        self.requestID = requestID
        self.versionVector = versionVector
        self.digest = digest
    }
}

/// One member's last known version vector, as passed on between nodes (``WireMessage/members(_:)``).
public struct MemberGossip: Hashable, Sendable {
    /// The most entries one message carries.
    public static let maximumCount = 4_096
    /// The longest name passed on, in bytes of UTF-8.
    public static let maximumNameBytes = 64

    /// The member, by the site it writes as.
    public var site: SiteID
    /// Its name, as far as the sender knows it (empty when it does not).
    public var name: String
    /// How long before sending this the member said it held ``versionVector``, in milliseconds.
    public var ageMilliseconds: UInt64
    /// What it held then.
    public var versionVector: VersionVector

    /// `site` (named `name`) held `versionVector` `ageMilliseconds` ago.
    public init(site: SiteID, name: String = "", ageMilliseconds: UInt64, versionVector: VersionVector) {
        self.site = site
        self.name = name
        self.ageMilliseconds = ageMilliseconds
        self.versionVector = versionVector
    }
}

/// Why a peer was refused.
public struct Rejection: Hashable, Sendable, CustomStringConvertible {
    /// The kind of refusal; unknown values from newer peers decode as `.other`.
    public enum Reason: UInt16, Sendable {
        /// Any other reason, and any reason this build does not know.
        case other = 0
        /// The two nodes share no protocol version.
        case versionMismatch = 1
        /// The nodes belong to different clusters.
        case clusterMismatch = 2
        /// The peer has this node's own site id: the node dialled itself.
        case selfConnection = 3
        /// A message could not be decoded, or came out of order (a second hello, a batch not expected).
        case malformedMessage = 4
        /// A frame is longer than the receiver's maximum frame length.
        case frameTooLarge = 5
        /// A message type the receiver does not know.
        case unknownMessageType = 6
        /// The peer was silent too long: no hello within the handshake timeout, or nothing within the idle timeout.
        case timeout = 7
        /// The receiver is at its limit of established, or of still-handshaking, connections.
        case tooManyConnections = 8
        /// Another connection between the same two nodes is kept: the one dialled by the smaller site id.
        case duplicateConnection = 9
        /// The two nodes replicate different schemas (their fingerprints differ).
        case schemaMismatch = 10
        /// The receiver could not apply a batch: a clock too far ahead, an unknown table, a failing disk…
        case applyFailed = 11
        /// A value is larger than the receiver's maximum value size.
        case valueTooLarge = 12
        /// The sender holds a change it cannot send (too large for any frame, or over the maximum value size).
        case unsendableChange = 13
        /// The sender is shutting down (not a failure of either side).
        case shuttingDown = 14
        /// The peer's key is not on the sender's roster, was removed from it, or does not match the site id in its
        /// hello.
        case notAMember = 15
    }

    /// The kind of refusal, for programs.
    public var reason: Reason
    /// For a person to read.
    public var message: String

    /// A refusal for `reason`, explained by `message`.
    public init(_ reason: Reason, _ message: String) {
        self.reason = reason
        self.message = message
    }

    /// `reason: message`.
    public var description: String { "\(reason): \(message)" }
}
