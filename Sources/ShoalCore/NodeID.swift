/// Who a node is: the SHA-256 of its public key (the key's DER SubjectPublicKeyInfo), not of its certificate, so
/// re-issuing a certificate or its expiry never changes it.
///
/// People see it in base32 (RFC 4648 alphabet, no padding), 52 characters in groups of four
/// (`MFRG-GZDF-…`); logs use the first two groups (``short``). Parsing takes either case, with or without the
/// dashes and spaces.
public struct NodeID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 32 bytes of the hash.
    public let bytes: [UInt8]

    /// A node id from exactly 32 bytes; `nil` for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 32 else { return nil }
        self.bytes = Array(bytes)
    }

    /// Parses the grouped or plain base32 form (52 characters once dashes and spaces are dropped); `nil` for
    /// anything else.
    public init?(parsing text: some StringProtocol) {
        let characters = text.uppercased().filter { $0 != "-" && $0 != " " }
        guard characters.count == 52, let bytes = Base32.decode(characters), bytes.count == 32 else { return nil }
        self.bytes = bytes
    }

    /// The whole id, grouped by four: what a person compares or types.
    public var description: String {
        let plain = Base32.encode(bytes)
        return stride(from: 0, to: plain.count, by: 4).map { start in
            let from = plain.index(plain.startIndex, offsetBy: start)
            return String(plain[from..<plain.index(from, offsetBy: min(4, plain.count - start))])
        }.joined(separator: "-")
    }

    /// The first two groups (40 bits): enough to tell nodes apart in a log line.
    public var short: String { String(description.prefix(9)) }

    /// Ordered by their bytes.
    public static func < (lhs: NodeID, rhs: NodeID) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// RFC 4648 base32 without padding, upper case.
enum Base32 {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".utf8)

    static func encode(_ bytes: [UInt8]) -> String {
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count * 8 + 4) / 5)
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                output.append(alphabet[Int(buffer >> UInt32(bits) & 31)])
            }
        }
        if bits > 0 { output.append(alphabet[Int(buffer << UInt32(5 - bits) & 31)]) }
        return String(decoding: output, as: UTF8.self)
    }

    /// `nil` for a character outside the alphabet, or leftover bits that are not zero (a non-canonical form).
    static func decode(_ text: String) -> [UInt8]? {
        var output: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for character in text.utf8 {
            guard let value = alphabet.firstIndex(of: character) else { return nil }
            buffer = buffer << 5 | UInt32(value)
            bits += 5
            if bits >= 8 {
                bits -= 8
                output.append(UInt8(truncatingIfNeeded: buffer >> UInt32(bits)))
                buffer &= (1 << UInt32(bits)) - 1
            }
        }
        guard buffer == 0 else { return nil }
        return output
    }
}
