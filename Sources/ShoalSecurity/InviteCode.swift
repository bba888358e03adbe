// Invite codes: 10 characters of Crockford's base32 (50 bits). The first two
// characters (10 bits) identify the invite so that a member can find it; the
// other eight (40 bits) are the secret that both sides feed to CPace.

/// A short code that admits a new device to a cluster.
///
/// A code is 10 characters of Crockford's base32 alphabet
/// (`0123456789ABCDEFGHJKMNPQRSTVWXYZ`, 5 bits each, most significant first):
/// - ``id``: the first 2 characters (10 bits); public, used to look the
///   invite up. Up to 1024 invites can be told apart.
/// - ``secret``: the other 8 characters (40 bits); the CPace password.
///
/// Forty bits are far too few against an offline attack, but CPace allows no
/// offline attack: each online attempt tests one guess, so the member must
/// limit attempts per invite (and expire invites) to keep guessing hopeless.
public struct InviteCode: Sendable, Hashable, CustomStringConvertible {
    /// Crockford's base32 alphabet, in digit order.
    public static let alphabet: [Character] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")

    /// Number of characters in a code.
    public static let length = 10

    /// Number of leading characters that form the ``id``.
    public static let idLength = 2

    /// Number of trailing characters that form the ``secret``.
    public static let secretLength = 8

    /// Number of bits in a code (5 per character).
    static let bitCount = 5 * length

    /// The code as a 50-bit integer, first character in the top bits.
    let value: UInt64

    /// Creates a code from its 50-bit value; the upper 14 bits are ignored.
    init(value: UInt64) {
        self.value = value & ((1 << UInt64(Self.bitCount)) - 1)
    }

    /// Creates a random code with the system's cryptographically secure
    /// random number generator.
    public static func generate() -> InviteCode {
        var generator = SystemRandomNumberGenerator()
        return generate(using: &generator)
    }

    /// Creates a random code with the given random number generator, which
    /// must be cryptographically secure outside of tests.
    public static func generate<Generator: RandomNumberGenerator>(using generator: inout Generator) -> InviteCode {
        InviteCode(value: UInt64.random(in: 0..<(1 << UInt64(bitCount)), using: &generator))
    }

    /// Parses a code typed or pasted by a person.
    ///
    /// Accepts lower and upper case; ignores white space and dashes
    /// (`-`, so `"AB-CDEF-GHJK"` works); reads `I`, `i`, `L` and `l` as `1`
    /// and `O`, `o` as `0`, as Crockford's base32 does.
    ///
    /// - Throws: ``InviteCodeError/invalidCharacter(_:offset:)`` for the
    ///   first character that is none of these (e.g. `U` or punctuation),
    ///   ``InviteCodeError/wrongLength(_:)`` if there are not exactly 10
    ///   code characters.
    public init(parsing text: String) throws(InviteCodeError) {
        var value: UInt64 = 0
        var count = 0
        for (offset, character) in text.enumerated() {
            if character == "-" || character.isWhitespace { continue }
            guard let digit = Self.digitValue(of: character) else {
                throw .invalidCharacter(character, offset: offset)
            }
            count += 1
            // Keep reading after too many characters, to report the count;
            // the shifted-out bits do not matter since the code is rejected.
            value = (value << 5) | UInt64(digit)
        }
        guard count == Self.length else { throw .wrongLength(count) }
        self.init(value: value)
    }

    /// The 10 canonical (upper-case) characters, without separators.
    public var description: String {
        String(characters)
    }

    /// The code grouped for reading aloud or typing, as `XX-XXXX-XXXX`
    /// (``init(parsing:)`` accepts this form).
    public var formatted: String {
        let text = characters
        return String(text[0..<2]) + "-" + String(text[2..<6]) + "-" + String(text[6..<10])
    }

    /// The invite's identifier: the first 2 canonical characters. Not secret.
    public var id: String {
        String(characters.prefix(Self.idLength))
    }

    /// The secret: the ASCII bytes of the last 8 canonical (upper-case)
    /// characters, e.g. `Array("7K3M9Q2P".utf8)`. Use it as the CPace password.
    public var secret: [UInt8] {
        Array(String(characters.suffix(Self.secretLength)).utf8)
    }

    /// The canonical characters, first (most significant) first.
    private var characters: [Character] {
        (0..<Self.length).map { index in
            let shift = UInt64(5 * (Self.length - 1 - index))
            return Self.alphabet[Int((value >> shift) & 0x1F)]
        }
    }

    /// The value of one code character, or `nil` if it is not one.
    private static func digitValue(of character: Character) -> UInt8? {
        guard let ascii = character.asciiValue else { return nil }
        switch ascii {
        case UInt8(ascii: "0")...UInt8(ascii: "9"):
            return ascii - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"):
            let upper = Character(Unicode.Scalar(ascii & ~0x20))
            switch upper {
            case "I", "L": return 1
            case "O": return 0
            default:
                guard let index = alphabet.firstIndex(of: upper) else { return nil }  // "U"
                return UInt8(index)
            }
        default:
            return nil
        }
    }
}

/// Why a string is not a valid invite code.
public enum InviteCodeError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A character that is not in Crockford's base32 alphabet, nor a
    /// separator, nor one of its aliases (I, L for 1; O for 0). The offset
    /// counts characters from the start of the input, separators included.
    case invalidCharacter(Character, offset: Int)
    /// The input held this many code characters instead of 10.
    case wrongLength(Int)

    /// A sentence saying what is wrong, suitable for showing to a person.
    public var description: String {
        switch self {
        case .invalidCharacter(let character, let offset):
            "Invite code contains \"\(character)\" at position \(offset + 1), which is not allowed; use digits and letters other than U."
        case .wrongLength(let count):
            "Invite code has \(count) character\(count == 1 ? "" : "s") but needs exactly \(InviteCode.length)."
        }
    }
}
