import ShoalCore

/// A question of a read-only inspection (protocol version 3): what `shoal verify --peer` asks a peer to find the
/// rows in which two replicas differ, without shipping any row.
///
/// An inspection runs on a connection of its own, opened with ``WireMessage/inspect(_:)`` instead of a hello: the
/// peer checks it as it checks a hello (cluster, site, versions, and with TLS its key against the roster) but keeps it
/// apart from its sync links, runs no round on it, and writes nothing for it. The asker first compares the digest
/// of each table (``Query/tables``), then pages through the row hashes of the tables whose digests differ
/// (``Query/rows(table:after:limit:)``), in key order, and compares them with its own.
public struct InspectionRequest: Hashable, Sendable {
    /// What is asked.
    public enum Query: Hashable, Sendable {
        /// The version vector, the digest and every replicated table's digest.
        case tables
        /// At most `limit` row hashes of `table`, in the order of their encoded keys (bytewise), after the encoded
        /// key `after` (from the first one when nil).
        case rows(table: String, after: [UInt8]?, limit: UInt32)
    }

    /// Chosen by the asker; the answer carries it.
    public var requestID: UInt64
    /// What is asked.
    public var query: Query

    /// A request `requestID` asking `query`.
    public init(requestID: UInt64, query: Query) {
        self.requestID = requestID
        self.query = query
    }
}

/// One replicated table as the digest sees it.
public struct TableSummary: Hashable, Sendable {
    /// The table's name.
    public var name: String
    /// Its primary key's columns, in key order (to show a key as `id=7`).
    public var keyColumns: [String]
    /// The table's part of the state digest (its ``StateDigest/bytes``).
    public var digest: [UInt8]
    /// The rows (alive or deleted) it covers.
    public var rows: UInt64

    /// A summary of `name`.
    public init(name: String, keyColumns: [String], digest: [UInt8], rows: UInt64) {
        self.name = name
        self.keyColumns = keyColumns
        self.digest = digest
        self.rows = rows
    }
}

/// The hash of one row (its presence, clocks and values) under its encoded primary key.
public struct RowHash: Hashable, Sendable {
    /// The primary key, encoded (``SQLValue/encodeKey(_:)``).
    public var key: [UInt8]
    /// The row's hash, as the state digest adds it.
    public var hash: [UInt8]

    /// The hash of the row whose encoded key is `key`.
    public init(key: [UInt8], hash: [UInt8]) {
        self.key = key
        self.hash = hash
    }
}

/// The answer to an ``InspectionRequest``.
public struct InspectionAnswer: Hashable, Sendable {
    /// What is answered.
    public enum Content: Hashable, Sendable {
        /// What the peer holds, its digest, and each replicated table's summary (paused tables are left out, as
        /// the digest leaves them out).
        case tables(versionVector: VersionVector, digest: [UInt8], tables: [TableSummary])
        /// A page of row hashes of `table`; `isLast` when no row follows it.
        case rows(table: String, rows: [RowHash], isLast: Bool)
    }

    /// The request answered.
    public var requestID: UInt64
    /// The answer.
    public var content: Content

    /// The answer to request `requestID`.
    public init(requestID: UInt64, content: Content) {
        self.requestID = requestID
        self.content = content
    }
}

extension WireProtocol {
    /// The first version that answers inspections (``InspectionRequest``).
    public static let inspectionVersion: UInt16 = 3
    /// The most row hashes one page of an inspection carries.
    public static let maximumInspectionPage: UInt32 = 4_096
}
