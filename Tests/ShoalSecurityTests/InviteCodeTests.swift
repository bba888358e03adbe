import ShoalTestSupport
import Testing
@testable import ShoalSecurity

@Suite("InviteCode")
struct InviteCodeTests {
    @Test("generated codes have 10 canonical characters and round-trip")
    func roundTrip() throws {
        var rng = SplitMix(state: 30)
        let alphabet = Set(InviteCode.alphabet)
        for _ in 0..<2000 {
            let code = InviteCode.generate(using: &rng)
            let text = code.description
            #expect(text.count == 10)
            #expect(text.allSatisfy(alphabet.contains))
            #expect(try InviteCode(parsing: text) == code)
            #expect(try InviteCode(parsing: text.lowercased()) == code)
            #expect(try InviteCode(parsing: code.formatted) == code)
            #expect(code.id == String(text.prefix(2)))
            #expect(code.secret == Array(text.suffix(8).utf8))
        }
        let system = InviteCode.generate()
        #expect(try InviteCode(parsing: system.description) == system)
    }

    @Test("random codes differ")
    func randomness() {
        let codes = Set((0..<200).map { _ in InviteCode.generate() })
        #expect(codes.count == 200)  // 50 bits: a collision here is ~2^-35 likely
    }

    @Test("values map to characters most significant first")
    func encoding() throws {
        #expect(InviteCode(value: 0).description == "0000000000")
        #expect(InviteCode(value: (1 << 50) - 1).description == "ZZZZZZZZZZ")
        #expect(InviteCode(value: 1 << 50).description == "0000000000")  // masked to 50 bits
        #expect(InviteCode(value: 31 << 45 | 1).description == "Z000000001")
        let code = try InviteCode(parsing: "AB-CDEF-GHJK")
        #expect(code.description == "ABCDEFGHJK")
        #expect(code.formatted == "AB-CDEF-GHJK")
        #expect(code.id == "AB")
        #expect(code.secret == Array("CDEFGHJK".utf8))
        #expect(code.value == (10 << 45 | 11 << 40 | 12 << 35 | 13 << 30 | 14 << 25 | 15 << 20 | 16 << 15 | 17 << 10 | 18 << 5 | 19))
    }

    @Test("parsing is lenient the way Crockford's base32 is")
    func lenientParsing() throws {
        let canonical = try InviteCode(parsing: "1100000000")
        #expect(try InviteCode(parsing: "IlOo000000") == canonical)
        #expect(try InviteCode(parsing: "L1O0 0000-00") == canonical)
        #expect(try InviteCode(parsing: " 11-00 00 00\t00\n") == canonical)
        #expect(try InviteCode(parsing: "abcdefghjk") == InviteCode(parsing: "ABCDEFGHJK"))
        #expect(try InviteCode(parsing: "--AB--CDEF--GHJK--").description == "ABCDEFGHJK")
    }

    @Test("bad characters are reported with their position")
    func invalidCharacters() {
        #expect(throws: InviteCodeError.invalidCharacter("U", offset: 3)) { try InviteCode(parsing: "ABCU EFGHJK") }
        #expect(throws: InviteCodeError.invalidCharacter("u", offset: 0)) { try InviteCode(parsing: "uBCDEFGHJK") }
        #expect(throws: InviteCodeError.invalidCharacter("!", offset: 10)) { try InviteCode(parsing: "ABCDEFGHJK!") }
        #expect(throws: InviteCodeError.invalidCharacter("_", offset: 2)) { try InviteCode(parsing: "AB_CDEFGHJK") }
        #expect(throws: InviteCodeError.invalidCharacter("é", offset: 1)) { try InviteCode(parsing: "Aé00000000") }
        #expect(throws: InviteCodeError.invalidCharacter("Ａ", offset: 0)) { try InviteCode(parsing: "ＡB00000000") }
        let message = InviteCodeError.invalidCharacter("U", offset: 3).description
        #expect(message.contains("\"U\"") && message.contains("position 4"))
    }

    @Test("wrong lengths are reported with the count")
    func wrongLength() {
        #expect(throws: InviteCodeError.wrongLength(0)) { try InviteCode(parsing: "") }
        #expect(throws: InviteCodeError.wrongLength(0)) { try InviteCode(parsing: " - ") }
        #expect(throws: InviteCodeError.wrongLength(9)) { try InviteCode(parsing: "ABCDEFGHJ") }
        #expect(throws: InviteCodeError.wrongLength(11)) { try InviteCode(parsing: "ABCDEFGHJKM") }
        #expect(throws: InviteCodeError.wrongLength(40)) { try InviteCode(parsing: String(repeating: "Z", count: 40)) }
        #expect(InviteCodeError.wrongLength(9).description.contains("9 characters"))
        #expect(InviteCodeError.wrongLength(1).description.contains("1 character "))
    }
}
