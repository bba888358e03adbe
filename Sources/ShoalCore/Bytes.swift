extension Array where Element == UInt8 {
    /// Appends `value` as an unsigned LEB128 varint.
    public mutating func appendVarint(_ value: UInt64) {
        var remaining = value
        while remaining >= 0x80 {
            append(UInt8(truncatingIfNeeded: remaining) | 0x80)
            remaining >>= 7
        }
        append(UInt8(remaining))
    }

    /// Appends `value` as 8 big-endian bytes.
    public mutating func appendBigEndian(_ value: UInt64) {
        for shift in stride(from: 56, through: 0, by: -8) { append(UInt8(truncatingIfNeeded: value >> shift)) }
    }
}

/// Reads the store's binary encodings; every read is bounds-checked and throws on truncation.
public struct ByteReader {
    @usableFromInline let bytes: [UInt8]
    /// The next position to read.
    public private(set) var offset: Int

    /// How many bytes there are in all.
    public var count: Int { bytes.count }

    /// Reads `bytes` from the start.
    public init(_ bytes: [UInt8]) {
        self.bytes = bytes
        self.offset = 0
    }

    /// Whether everything has been read.
    public var isAtEnd: Bool { offset >= bytes.count }

    /// Reads one byte.
    public mutating func readByte() throws(ShoalError) -> UInt8 {
        guard offset < bytes.count else { throw ShoalError.corruptMetadata("truncated encoding") }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// Reads an unsigned LEB128 varint of at most 64 bits.
    public mutating func readVarint() throws(ShoalError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let byte = try readByte()
            guard shift < 64 else { throw ShoalError.corruptMetadata("varint too long") }
            result |= UInt64(byte & 0x7f) << shift
            if byte < 0x80 { return result }
            shift += 7
        }
    }

    /// Reads a varint length, refusing one longer than what is left (so no count can overflow or trap).
    public mutating func readLength() throws(ShoalError) -> Int {
        let length = try readVarint()
        guard length <= UInt64(bytes.count - offset) else { throw ShoalError.corruptMetadata("truncated encoding") }
        return Int(length)
    }

    /// Reads 8 big-endian bytes.
    public mutating func readBigEndianUInt64() throws(ShoalError) -> UInt64 {
        guard bytes.count - offset >= 8 else { throw ShoalError.corruptMetadata("truncated encoding") }
        var value: UInt64 = 0
        for index in offset..<(offset + 8) { value = value << 8 | UInt64(bytes[index]) }
        offset += 8
        return value
    }

    /// Reads the next `count` bytes, without copying them.
    public mutating func readBytes(_ count: Int) throws(ShoalError) -> ArraySlice<UInt8> {
        guard count >= 0, bytes.count - offset >= count else { throw ShoalError.corruptMetadata("truncated encoding") }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }
}
