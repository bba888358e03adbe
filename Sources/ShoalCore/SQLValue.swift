/// One SQLite value, of any of its five storage classes.
public enum SQLValue: Sendable, CustomStringConvertible {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])

    public var description: String {
        switch self {
        case .null: "NULL"
        case .integer(let value): String(value)
        case .real(let value): String(value)
        case .text(let value): value
        case .blob(let bytes):
            "x'"
                + bytes.map { byte in
                    let digits = String(byte, radix: 16)
                    return digits.count == 1 ? "0" + digits : digits
                }.joined() + "'"
        }
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
    public static func == (lhs: SQLValue, rhs: SQLValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.integer(let a), .integer(let b)): a == b
        case (.real(let a), .real(let b)): a.bitPattern == b.bitPattern
        case (.text(let a), .text(let b)): a.utf8.elementsEqual(b.utf8)
        case (.blob(let a), .blob(let b)): a == b
        default: false
        }
    }

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
            hasher.combine(Array(value.utf8))
        case .blob(let bytes):
            hasher.combine(4)
            hasher.combine(bytes)
        }
    }
}

extension SQLValue {
    /// Appends the canonical encoding: a type tag, then the payload (integers and reals as 8 big-endian bytes,
    /// text and blobs length-prefixed). Used for keys, the digest and the store's metadata.
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
        case 3:
            let count = try reader.readVarint()
            return .text(String(decoding: try reader.readBytes(Int(count)), as: UTF8.self))
        case 4:
            let count = try reader.readVarint()
            return .blob(Array(try reader.readBytes(Int(count))))
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
