import Crypto

/// An order-independent hash of a whole replicated state: the sum, modulo 2^256, of one SHA-256 per row.
///
/// Adding rows in any order gives the same digest; two nodes have converged exactly when their digests match.
public struct StateDigest: Hashable, Sendable, CustomStringConvertible {
    private var limbs: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
    /// How many rows (alive or deleted) were added.
    public private(set) var rowCount: UInt64 = 0

    public init() {}

    public static func == (lhs: StateDigest, rhs: StateDigest) -> Bool {
        lhs.limbs == rhs.limbs && lhs.rowCount == rhs.rowCount
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(limbs.0)
        hasher.combine(limbs.1)
        hasher.combine(limbs.2)
        hasher.combine(limbs.3)
        hasher.combine(rowCount)
    }

    /// Adds one row: its table, key, metadata and the values of its non-key columns.
    public mutating func addRow(
        table: String,
        primaryKey: [SQLValue],
        state: RowState,
        columns: [String],
        values: [SQLValue]
    ) {
        var bytes = [UInt8]()
        bytes.reserveCapacity(64 + values.count * 24)
        SQLValue.text(table).encode(into: &bytes)
        bytes.appendVarint(UInt64(primaryKey.count))
        for value in primaryKey { value.encode(into: &bytes) }
        bytes.appendVarint(state.causalLength)
        Self.encode(state.lengthStamp, into: &bytes)
        for (index, cell) in state.cells.enumerated() where state.isAlive {
            SQLValue.text(columns[index]).encode(into: &bytes)
            switch cell {
            case .empty:
                bytes.append(0)
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
            values[index].encode(into: &bytes)
        }
        add(SHA256.hash(data: bytes))
    }

    private mutating func add(_ hash: SHA256.Digest) {
        var words: [UInt64] = [0, 0, 0, 0]
        for (index, byte) in hash.enumerated() { words[index / 8] = words[index / 8] << 8 | UInt64(byte) }
        var carry: UInt64 = 0
        (limbs.3, carry) = Self.add(limbs.3, words[3], carry)
        (limbs.2, carry) = Self.add(limbs.2, words[2], carry)
        (limbs.1, carry) = Self.add(limbs.1, words[1], carry)
        (limbs.0, _) = Self.add(limbs.0, words[0], carry)
        rowCount += 1
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

    public var description: String { hex }
}
