import ShoalTestSupport
/// Helpers shared by the tests.

/// Decodes a hex string (no prefix, even length) to bytes; whitespace is ignored.
func hex(_ text: String) -> [UInt8] {
    let digits = Array(text.filter { !$0.isWhitespace }.utf8)
    precondition(digits.count % 2 == 0, "odd hex length")
    func nibble(_ c: UInt8) -> UInt8 {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
        default: preconditionFailure("not a hex digit")
        }
    }
    return stride(from: 0, to: digits.count, by: 2).map { nibble(digits[$0]) << 4 | nibble(digits[$0 + 1]) }
}

/// Encodes bytes as lower-case hex.
func hexString(_ bytes: some Sequence<UInt8>) -> String {
    let digits = Array("0123456789abcdef")
    return String(bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0x0F)]] })
}

/// Converts RFC 9380 style "0x…" big-endian integers to 32 little-endian bytes.
func littleEndianFromBigEndianHex(_ text: String) -> [UInt8] {
    var digits = text.hasPrefix("0x") ? String(text.dropFirst(2)) : text
    digits = String(repeating: "0", count: max(0, 64 - digits.count)) + digits
    return hex(digits).reversed()
}

extension SplitMix {
    /// `count` bytes from the generator.
    mutating func bytes(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in UInt8.random(in: 0...255, using: &self) }
    }
}
