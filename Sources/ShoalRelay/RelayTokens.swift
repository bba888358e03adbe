import Crypto
import ShoalCore

/// Bearer tokens: 32 random bytes, written `shoal-relay-` and 64 hex digits; the relay keeps their SHA-256 only.
public enum RelayTokens {
    /// Every token starts with this.
    public static let prefix = "shoal-relay-"

    /// A new random token.
    public static func make() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return prefix + hex(bytes)
    }

    /// The hash the relay stores and looks tokens up by.
    public static func hash(_ token: String) -> String {
        hex(Array(SHA256.hash(data: Array(token.utf8))))
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}
