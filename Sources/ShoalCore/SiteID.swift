/// The random 16-byte identity of one database, created once and persisted.
///
/// Site ids order by their bytes, big-endian, so that ties between equal clocks resolve the same way on every node.
public struct SiteID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The first 8 bytes, big-endian.
    public let high: UInt64
    /// The last 8 bytes, big-endian.
    public let low: UInt64

    /// Creates a site id from its two big-endian halves.
    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// Creates a site id from exactly 16 bytes; `nil` for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 16 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in bytes.enumerated() {
            if index < 8 {
                high = high << 8 | UInt64(byte)
            } else {
                low = low << 8 | UInt64(byte)
            }
        }
        self.init(high: high, low: low)
    }

    /// Parses 32 hexadecimal digits; `nil` for anything else.
    public init?(hex: some StringProtocol) {
        guard hex.utf8.count == 32, let high = UInt64(hex.prefix(16), radix: 16),
            let low = UInt64(hex.suffix(16), radix: 16)
        else { return nil }
        self.init(high: high, low: low)
    }

    /// A new random site id.
    public static func random() -> SiteID {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }

    /// A new random site id drawn from `generator` (tests use seeded generators).
    public static func random(using generator: inout some RandomNumberGenerator) -> SiteID {
        SiteID(high: generator.next(), low: generator.next())
    }

    /// The 16 bytes, big-endian.
    public var bytes: [UInt8] {
        var result = [UInt8]()
        result.reserveCapacity(16)
        for shift in stride(from: 56, through: 0, by: -8) { result.append(UInt8(truncatingIfNeeded: high >> shift)) }
        for shift in stride(from: 56, through: 0, by: -8) { result.append(UInt8(truncatingIfNeeded: low >> shift)) }
        return result
    }

    /// 32 lowercase hexadecimal digits.
    public var hex: String {
        Self.hex16(high) + Self.hex16(low)
    }

    /// The 32 lowercase hex digits.
    public var description: String { hex }

    /// Orders as the 128-bit numbers compare.
    public static func < (lhs: SiteID, rhs: SiteID) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }

    private static func hex16(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}

extension String {
    /// The string with control characters, line and paragraph separators and bidirectional overrides replaced by
    /// "?", at most `limit` characters: for anything a peer names itself before it is shown in a log or a status
    /// (a name with an escape sequence or a newline would forge lines).
    public func printable(limit: Int = 64) -> String {
        String(
            String.UnicodeScalarView(
                unicodeScalars.prefix(limit * 2).map { scalar in
                    switch scalar.properties.generalCategory {
                    case .control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .privateUse,
                        .unassigned:
                        "?"
                    default: scalar
                    }
                }
            ).prefix(limit)
        )
    }
}
