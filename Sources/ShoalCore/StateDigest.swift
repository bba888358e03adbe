import Crypto

extension SiteID {
    /// The site that stands for `content` rather than for a database: the first 16 bytes of its SHA-256, so the
    /// same content names the same site on every node (the counter values a table was seeded with).
    public static func derived(from content: [UInt8]) -> SiteID {
        SiteID(bytes: Array(SHA256.hash(data: content)).prefix(16))!
    }
}

/// An order-independent hash of a whole replicated state: the sum, modulo 2^256, of one SHA-256 per row.
///
/// Adding rows in any order gives the same digest; two nodes have converged exactly when their digests match.
public struct StateDigest: Hashable, Sendable, CustomStringConvertible {
    private var limbs: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
    /// How many rows (alive or deleted) were added.
    public private(set) var rowCount: UInt64 = 0

    /// The digest of an empty state.
    public init() {}

    /// Equal when both the hash sum and the row count are.
    public static func == (lhs: StateDigest, rhs: StateDigest) -> Bool {
        lhs.limbs == rhs.limbs && lhs.rowCount == rhs.rowCount
    }

    /// Hashes what ``==`` compares.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(limbs.0)
        hasher.combine(limbs.1)
        hasher.combine(limbs.2)
        hasher.combine(limbs.3)
        hasher.combine(rowCount)
    }

    /// A digest from its 32 bytes (see ``bytes``) and row count, as stored.
    public init?(bytes: [UInt8], rowCount: UInt64) {
        guard bytes.count == 32 else { return nil }
        var words: [UInt64] = [0, 0, 0, 0]
        for (index, byte) in bytes.enumerated() { words[index / 8] = words[index / 8] << 8 | UInt64(byte) }
        limbs = (words[0], words[1], words[2], words[3])
        self.rowCount = rowCount
    }

    /// Adds one row: its table, key, metadata and the values of its non-key columns.
    public mutating func addRow(
        table: String,
        primaryKey: [SQLValue],
        state: RowState,
        columns: [String],
        values: [SQLValue]
    ) {
        add(
            rowHash: Self.rowHash(table: table, primaryKey: primaryKey, state: state, columns: columns, values: values)
        )
    }

    /// Adds a row by its hash (``rowHash(table:primaryKey:state:columns:values:)``).
    public mutating func add(rowHash: [UInt8]) {
        add(Self.words(rowHash))
        rowCount += 1
    }

    /// Takes out a row added before by its hash: the digest is then as if it had never been added.
    public mutating func subtract(rowHash: [UInt8]) {
        let words = Self.words(rowHash)
        var borrow: UInt64 = 0
        (limbs.3, borrow) = Self.subtract(limbs.3, words[3], borrow)
        (limbs.2, borrow) = Self.subtract(limbs.2, words[2], borrow)
        (limbs.1, borrow) = Self.subtract(limbs.1, words[1], borrow)
        (limbs.0, _) = Self.subtract(limbs.0, words[0], borrow)
        rowCount &-= 1
    }

    /// Adds every row of another digest (of disjoint rows, e.g. another table).
    public mutating func add(_ other: StateDigest) {
        add([other.limbs.0, other.limbs.1, other.limbs.2, other.limbs.3])
        rowCount += other.rowCount
    }

    /// Whether a row counts in the digest: every row but a tombstone (a deleted row whose data row is gone, as it
    /// should be). Tombstones are collected at different times on different nodes (once every member holds the
    /// delete): a node that collected one and a node that still keeps it hold the same rows, so the same digest.
    public static func counts(_ state: RowState?, hasData: Bool) -> Bool {
        hasData || state?.isAlive != false
    }

    /// The SHA-256 of one row: its table, key, metadata, whether the table holds a data row for it, and that
    /// row's stored values.
    ///
    /// `state` is nil for a data row Shoal holds no metadata for, and `values` nil when the table holds no data
    /// row for the key: both are hashed apart from any row with metadata, and from a row whose values are all
    /// NULL, so that two files whose rows differ in any way never share a digest. A deleted row's values are
    /// hashed too when its data row is (wrongly) there.
    ///
    /// A column never written in the row's life (an empty cell) that holds its declared default (`defaults`, `nil`
    /// where it is not a constant) adds nothing: adding a column to a table leaves every row's hash as it was, and
    /// a node that has not added it yet hashes its rows the same.
    ///
    /// Columns are hashed in the order of their names (`order`: ``nameOrder(_:)`` of `columns`, which the caller may
    /// pass in, computed once per table), not in the table's: two nodes that added two columns in turn, each its own
    /// first, hold them in another order, and the same row must hash the same on both.
    public static func rowHash(
        table: String,
        primaryKey: [SQLValue],
        state: RowState?,
        columns: [String],
        values: [SQLValue]?,
        defaults: [SQLValue?] = [],
        order: [Int]? = nil
    ) -> [UInt8] {
        let order = order ?? nameOrder(columns)
        var bytes = [UInt8]()
        bytes.reserveCapacity(64 + (values?.count ?? 0) * 24)
        SQLValue.text(table).encode(into: &bytes)
        bytes.appendVarint(UInt64(primaryKey.count))
        for value in primaryKey { value.encode(into: &bytes) }
        if let state {
            bytes.append(1)
            bytes.appendVarint(state.causalLength)
            Self.encode(state.lengthStamp, into: &bytes)
            for index in order where state.isAlive && index < state.cells.count {
                let cell = state.cells[index]
                if case .empty = cell { continue }
                SQLValue.text(columns[index]).encode(into: &bytes)
                switch cell {
                case .empty:
                    break
                case .value(let stamp, _):
                    bytes.append(1)
                    Self.encode(stamp, into: &bytes)
                case .counter(let entries):
                    bytes.append(2)
                    for (site, entry) in entries.sorted(by: { $0.key < $1.key }) {
                        bytes.appendBigEndian(site.high)
                        bytes.appendBigEndian(site.low)
                        bytes.appendVarint(entry.seq)
                        bytes.appendVarint(entry.increments)
                        bytes.appendVarint(entry.decrements)
                    }
                }
            }
        } else {
            bytes.append(0)
        }
        if let values {
            bytes.append(1)
            func hash(_ index: Int) {
                let value = values[index]
                let written: Bool =
                    if let state, state.isAlive, index < state.cells.count, state.cells[index] != .empty { true } else { false }
                if !written, index < defaults.count, let declared = defaults[index], declared == value { return }
                SQLValue.text(index < columns.count ? columns[index] : "").encode(into: &bytes)
                value.encode(into: &bytes)
            }
            for index in order where index < values.count { hash(index) }
            // A value beyond the columns named (none, as the store reads rows) is hashed after them, by position.
            for index in min(columns.count, values.count)..<values.count { hash(index) }
        } else {
            bytes.append(0)
        }
        return Array(SHA256.hash(data: bytes))
    }

    /// The positions of `columns` in the order of their names (byte order of their UTF-8), the order a row's columns
    /// are hashed in.
    public static func nameOrder(_ columns: [String]) -> [Int] {
        columns.indices.sorted { Array(columns[$0].utf8).lexicographicallyPrecedes(Array(columns[$1].utf8)) }
    }

    private static func words(_ hash: [UInt8]) -> [UInt64] {
        var words: [UInt64] = [0, 0, 0, 0]
        for (index, byte) in hash.prefix(32).enumerated() { words[index / 8] = words[index / 8] << 8 | UInt64(byte) }
        return words
    }

    private mutating func add(_ words: [UInt64]) {
        var carry: UInt64 = 0
        (limbs.3, carry) = Self.add(limbs.3, words[3], carry)
        (limbs.2, carry) = Self.add(limbs.2, words[2], carry)
        (limbs.1, carry) = Self.add(limbs.1, words[1], carry)
        (limbs.0, _) = Self.add(limbs.0, words[0], carry)
    }

    private static func subtract(_ a: UInt64, _ b: UInt64, _ borrow: UInt64) -> (UInt64, UInt64) {
        let (partial, underflow1) = a.subtractingReportingOverflow(b)
        let (difference, underflow2) = partial.subtractingReportingOverflow(borrow)
        return (difference, (underflow1 ? 1 : 0) + (underflow2 ? 1 : 0))
    }

    private static func add(_ a: UInt64, _ b: UInt64, _ carry: UInt64) -> (UInt64, UInt64) {
        let (partial, overflow1) = a.addingReportingOverflow(b)
        let (sum, overflow2) = partial.addingReportingOverflow(carry)
        return (sum, (overflow1 ? 1 : 0) + (overflow2 ? 1 : 0))
    }

    private static func encode(_ stamp: Stamp?, into bytes: inout [UInt8]) {
        guard let stamp else {
            bytes.append(0)
            return
        }
        bytes.append(1)
        bytes.appendBigEndian(stamp.hlc.rawValue)
        bytes.appendBigEndian(stamp.site.high)
        bytes.appendBigEndian(stamp.site.low)
        bytes.appendVarint(stamp.seq)
    }

    /// The 32 bytes (big-endian sum), as sent to peers.
    public var bytes: [UInt8] {
        var result: [UInt8] = []
        for limb in [limbs.0, limbs.1, limbs.2, limbs.3] { result.appendBigEndian(limb) }
        return result
    }

    /// 64 hexadecimal digits.
    public var hex: String {
        [limbs.0, limbs.1, limbs.2, limbs.3].map { limb in
            let digits = String(limb, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }.joined()
    }

    /// The digest as hex (``hex``).
    public var description: String { hex }
}
