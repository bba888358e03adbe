/// One SQLite value, of any of its five storage classes.
///
/// TEXT is held as a Swift `String` when its bytes are valid UTF-8 (NUL bytes included), and as its raw bytes
/// in ``invalidText(_:)`` when they are not, so every value SQLite stores round-trips bit for bit. Build text
/// read from bytes with ``text(bytes:)``, which picks the case: equal bytes always give the same case. Both
/// cases have the same canonical encoding (tag 3, then the bytes), and compare and hash by their bytes.
public enum SQLValue: Sendable, CustomStringConvertible {
    /// SQL NULL.
    case null
    /// A 64-bit signed INTEGER.
    case integer(Int64)
    /// An IEEE 754 REAL, NaN and infinities included.
    case real(Double)
    /// TEXT whose bytes are valid UTF-8 (it may hold NUL characters).
    case text(String)
    /// A BLOB, byte for byte.
    case blob([UInt8])
    /// TEXT whose bytes are not valid UTF-8, exactly as stored. Only ``text(bytes:)`` should make it.
    case invalidText([UInt8])

    /// TEXT from its bytes: ``text(_:)`` when they are valid UTF-8, ``invalidText(_:)`` otherwise.
    public static func text(bytes: some Collection<UInt8>) -> SQLValue {
        if let string = String(validating: bytes, as: UTF8.self) { return .text(string) }
        return .invalidText(Array(bytes))
    }

    /// TEXT from `count` bytes at `start` (SQLite's buffers), without an intermediate copy when they are valid.
    public static func text(start: UnsafePointer<UInt8>?, count: Int) -> SQLValue {
        guard let start, count > 0 else { return .text("") }
        return text(bytes: UnsafeBufferPointer(start: start, count: count))
    }

    /// The largest TEXT or BLOB value, in bytes, that Shoal replicates: 256 MiB. Stores refuse larger values at
    /// write time and peers refuse them on the wire, so no value is accepted and then stuck.
    public static let maximumBytes = 256 * 1024 * 1024

    /// The length of the value's canonical encoding (tag, length and payload), at most: what it costs in a
    /// batch on the wire.
    public var encodedSizeBound: Int {
        switch self {
        case .null: 1
        case .integer, .real: 9
        case .text(let text): 11 + text.utf8.count
        case .invalidText(let bytes): 11 + bytes.count
        case .blob(let bytes): 11 + bytes.count
        }
    }

    /// The bytes a TEXT or BLOB value holds; `nil` for other types.
    public var storedByteCount: Int? {
        switch self {
        case .text(let text): text.utf8.count
        case .invalidText(let bytes), .blob(let bytes): bytes.count
        default: nil
        }
    }

    /// Whether the value is TEXT (of either case).
    public var isText: Bool {
        switch self {
        case .text, .invalidText: true
        default: false
        }
    }

    /// The bytes of a TEXT value (of either case); `nil` for other types.
    public var textBytes: [UInt8]? {
        switch self {
        case .text(let string): Array(string.utf8)
        case .invalidText(let bytes): bytes
        default: nil
        }
    }

    /// The value as SQL shows it, for messages (never logged with row payloads).
    public var description: String {
        switch self {
        case .null: "NULL"
        case .integer(let value): String(value)
        case .real(let value): String(value)
        case .text(let value): value
        // Shown as SQL would build it, so nothing is replaced silently.
        case .invalidText(let bytes): "CAST(x'\(Self.hex(bytes))' AS TEXT)"
        case .blob(let bytes): "x'\(Self.hex(bytes))'"
        }
    }

    private static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var result = [UInt8]()
        result.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            result.append(digits[Int(byte >> 4)])
            result.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: result, as: UTF8.self)
    }

    /// The value as an integer, when it is a number (reals are truncated); `nil` otherwise.
    public var integerValue: Int64? {
        switch self {
        case .integer(let value): value
        case .real(let value) where value.isFinite && abs(value) < 9.2e18: Int64(value)
        default: nil
        }
    }
}

extension SQLValue: Hashable {
    // Reals compare by bit pattern: the digest and merge need byte-for-byte identity, not IEEE equality.
    // TEXT compares by bytes, whichever case holds it.
    /// Equal when both have the same storage class and the same canonical encoding (TEXT compares by its bytes).
    public static func == (lhs: SQLValue, rhs: SQLValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.integer(let a), .integer(let b)): a == b
        case (.real(let a), .real(let b)): a.bitPattern == b.bitPattern
        case (.text(let a), .text(let b)): a.utf8.elementsEqual(b.utf8)
        case (.invalidText(let a), .invalidText(let b)): a == b
        case (.text(let a), .invalidText(let b)), (.invalidText(let b), .text(let a)): a.utf8.elementsEqual(b)
        case (.blob(let a), .blob(let b)): a == b
        default: false
        }
    }

    /// Hashes what ``==`` compares.
    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(0)
        case .integer(let value):
            hasher.combine(1)
            hasher.combine(value)
        case .real(let value):
            hasher.combine(2)
            hasher.combine(value.bitPattern)
        case .text(let value):
            hasher.combine(3)
            hasher.combine(value.utf8.count)
            for byte in value.utf8 { hasher.combine(byte) }
        case .invalidText(let bytes):
            hasher.combine(3)
            hasher.combine(bytes.count)
            for byte in bytes { hasher.combine(byte) }
        case .blob(let bytes):
            hasher.combine(4)
            hasher.combine(bytes)
        }
    }
}

extension SQLValue {
    /// Appends the canonical encoding: a type tag, then the payload (integers and reals as 8 big-endian bytes,
    /// text and blobs length-prefixed). Used for keys, the digest and the store's metadata. TEXT is tag 3 and
    /// its exact bytes, whether or not they are valid UTF-8.
    public func encode(into buffer: inout [UInt8]) {
        switch self {
        case .null:
            buffer.append(0)
        case .integer(let value):
            buffer.append(1)
            buffer.appendBigEndian(UInt64(bitPattern: value))
        case .real(let value):
            buffer.append(2)
            buffer.appendBigEndian(value.bitPattern)
        case .text(let value):
            buffer.append(3)
            buffer.appendVarint(UInt64(value.utf8.count))
            buffer.append(contentsOf: value.utf8)
        case .invalidText(let bytes):
            buffer.append(3)
            buffer.appendVarint(UInt64(bytes.count))
            buffer.append(contentsOf: bytes)
        case .blob(let bytes):
            buffer.append(4)
            buffer.appendVarint(UInt64(bytes.count))
            buffer.append(contentsOf: bytes)
        }
    }

    /// Decodes one canonical value from `reader`.
    public static func decode(from reader: inout ByteReader) throws(ShoalError) -> SQLValue {
        switch try reader.readByte() {
        case 0: return .null
        case 1: return .integer(Int64(bitPattern: try reader.readBigEndianUInt64()))
        case 2: return .real(Double(bitPattern: try reader.readBigEndianUInt64()))
        case 3: return .text(bytes: try reader.readBytes(try reader.readLength()))
        case 4: return .blob(Array(try reader.readBytes(try reader.readLength())))
        case let tag:
            throw ShoalError.corruptMetadata("unknown value tag \(tag)")
        }
    }

    /// Encodes a primary key (one or more values) canonically.
    public static func encodeKey(_ values: [SQLValue]) -> [UInt8] {
        var buffer = [UInt8]()
        for value in values { value.encode(into: &buffer) }
        return buffer
    }
}
