import ShoalCore
import ShoalProtocol

/// What ``PeerVerifier`` found comparing this replica with a peer's: the rows in which they differ.
public struct VerifyReport: Sendable, Hashable {
    /// How a row differs.
    public enum Difference: String, Sendable, Hashable {
        /// The peer holds the row (alive or deleted), this node does not.
        case missingHere = "missing here"
        /// This node holds the row, the peer does not.
        case missingOnPeer = "missing on the peer"
        /// Both hold it, with different presence, clocks or values.
        case differs
    }

    /// One row that differs.
    public struct Row: Sendable, Hashable {
        /// Its table.
        public var table: String
        /// Its primary key's columns.
        public var keyColumns: [String]
        /// Its primary key.
        public var key: [SQLValue]
        /// How it differs.
        public var difference: Difference

        /// `id=7` (`a=1, b='x'` for a key of several columns).
        public var keyDescription: String {
            zip(keyColumns, key).map { "\($0)=\($1.literal)" }.joined(separator: ", ")
        }
    }

    /// The peer's name.
    public var peerName: String
    /// The peer's site id.
    public var peerSite: SiteID
    /// What this node holds.
    public var localVersionVector: VersionVector
    /// What the peer holds.
    public var peerVersionVector: VersionVector
    /// This node's digest.
    public var localDigest: [UInt8]
    /// The peer's digest.
    public var peerDigest: [UInt8]
    /// Tables compared (replicated on either side).
    public var tables: [String]
    /// Tables whose digests differ.
    public var differingTables: [String]
    /// Tables the peer replicates.
    public var peerTables: [String] = []
    /// The rows that differ, by table and key order, at most the limit asked for.
    public var rows: [Row]
    /// Whether more rows differ than were listed.
    public var truncated: Bool

    /// Whether both hold the same changes: only then must their rows be equal (otherwise a sync in progress explains
    /// differences).
    public var sameVersion: Bool { localVersionVector == peerVersionVector }
    /// Whether the two digests are equal.
    public var sameDigest: Bool { localDigest == peerDigest }
}

extension SQLValue {
    /// The value as SQL would write it: `7`, `'x'`, `X'00ff'`, `NULL`.
    var literal: String {
        switch self {
        case .null: "NULL"
        case .integer(let value): "\(value)"
        case .real(let value): "\(value)"
        case .text(let text): "'\(text.replacingOccurrences(of: "'", with: "''"))'"
        case .invalidText(let bytes), .blob(let bytes):
            "X'" + bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + "'"
        }
    }
}

/// Compares two streams of row hashes, each in the order of its encoded keys (bytewise, as SQLite orders BLOBs),
/// that arrive a page at a time: a merge, so memory holds one page of each side, whatever the table's size.
struct RowHashMerge {
    /// The rows that differ, as (encoded key, difference), in key order.
    private(set) var found: [(key: [UInt8], difference: VerifyReport.Difference)] = []
    private var local: ArraySlice<RowHash> = []
    private var remote: ArraySlice<RowHash> = []
    private(set) var localAfter: [UInt8]?
    private(set) var remoteAfter: [UInt8]?
    private(set) var localDone = false
    private(set) var remoteDone = false

    /// Whether a page of this node's rows is needed before the merge can go on.
    var needsLocal: Bool { local.isEmpty && !localDone }
    /// Whether a page of the peer's rows is needed.
    var needsRemote: Bool { remote.isEmpty && !remoteDone }
    /// Whether both streams ended and every row was compared.
    var isFinished: Bool { localDone && remoteDone && local.isEmpty && remote.isEmpty }

    /// Takes the next page of this node's rows.
    mutating func addLocal(_ rows: [RowHash], isLast: Bool) {
        local += rows
        localAfter = rows.last?.key ?? localAfter
        localDone = isLast
    }

    /// Takes the next page of the peer's rows.
    mutating func addRemote(_ rows: [RowHash], isLast: Bool) {
        remote += rows
        remoteAfter = rows.last?.key ?? remoteAfter
        remoteDone = isLast
    }

    /// Compares what both sides sent so far, as far as it can be compared, until `limit` differences were found.
    mutating func advance(limit: Int) {
        while found.count < limit {
            switch (local.first, remote.first) {
            case (let mine?, let theirs?):
                if mine.key == theirs.key {
                    if mine.hash != theirs.hash { found.append((mine.key, .differs)) }
                    local.removeFirst()
                    remote.removeFirst()
                } else if mine.key.lexicographicallyPrecedes(theirs.key) {
                    found.append((mine.key, .missingOnPeer))
                    local.removeFirst()
                } else {
                    found.append((theirs.key, .missingHere))
                    remote.removeFirst()
                }
            case (let mine?, nil) where remoteDone:
                found.append((mine.key, .missingOnPeer))
                local.removeFirst()
            case (nil, let theirs?) where localDone:
                found.append((theirs.key, .missingHere))
                remote.removeFirst()
            default:
                return
            }
        }
    }
}
