import Testing

@testable import ShoalCore

/// Values every SQLite storage class can hold, at their edges: what must survive every encoding bit for bit.
let edgeValues: [SQLValue] = {
    var values: [SQLValue] = [
        .null, .integer(.min), .integer(.max), .integer(0), .integer(-1),
        .text(""), .text("a"), .text("a\u{0}b"), .text("\u{0}"), .text("x\u{0}y\u{0}"), .text("héllo \"q\" \\ \n\t\r"),
        .text("\u{1}\u{1f}\u{7f} 😀 \u{2028}"), .text(String(repeating: "ü", count: 5_000)),
        .blob([]), .blob([0]), .blob([0, 255, 10, 13]), .blob((0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }),
        SQLValue.text(bytes: [0x61, 0xFF, 0x62]), SQLValue.text(bytes: [0xFF]), SQLValue.text(bytes: [0xC3]),
        SQLValue.text(bytes: [0x00, 0x80, 0x00]), SQLValue.text(bytes: [0xED, 0xA0, 0x80]),  // an encoded surrogate
        SQLValue.text(bytes: [0xF4, 0x90, 0x80, 0x80]),  // beyond U+10FFFF
        SQLValue.text(bytes: [0xC0, 0xAF]),  // overlong
    ]
    let reals: [Double] = [
        0, -0.0, 1, -1, 0.1, 1.0 / 3, .infinity, -.infinity, .greatestFiniteMagnitude, -.greatestFiniteMagnitude,
        .leastNonzeroMagnitude, -.leastNonzeroMagnitude, .leastNormalMagnitude, .leastNormalMagnitude.nextDown,
        Double(bitPattern: 0x3FF0_0000_0000_0001), 1e300, 1e-300, 9_007_199_254_740_992.nextUp, 123_456_789.125e-7,
        Double(Int64.max), Double(Int64.min), 1e-5, 5e22,
    ]
    values += reals.map(SQLValue.real)
    return values
}()

@Suite struct SQLValueTests {
    @Test func textFromBytesPicksOneCaseForEqualBytes() {
        #expect(SQLValue.text(bytes: Array("héllo\u{0}".utf8)) == .text("héllo\u{0}"))
        if case .text = SQLValue.text(bytes: Array("héllo\u{0}".utf8)) {} else { Issue.record("valid UTF-8 is .text") }
        guard case .invalidText(let bytes) = SQLValue.text(bytes: [0x61, 0xFF]) else {
            Issue.record("invalid UTF-8 must keep its bytes")
            return
        }
        #expect(bytes == [0x61, 0xFF])
        // Equality and hashing go by bytes, whichever case holds them.
        #expect(SQLValue.invalidText(Array("ab".utf8)) == .text("ab"))
        #expect(Set([SQLValue.invalidText(Array("ab".utf8)), .text("ab")]).count == 1)
        #expect(SQLValue.text(bytes: [0x61, 0xFF]) != .text("a\u{FFFD}"))
        #expect(SQLValue.text(bytes: [0x61, 0xFF]) != .blob([0x61, 0xFF]))
        #expect(SQLValue.text("a") != SQLValue.text("a\u{0}"))
    }

    @Test func everyValueRoundTripsThroughTheCanonicalEncoding() throws {
        for value in edgeValues {
            var bytes: [UInt8] = []
            value.encode(into: &bytes)
            var reader = ByteReader(bytes)
            let decoded = try SQLValue.decode(from: &reader)
            #expect(reader.isAtEnd)
            #expect(decoded == value, "\(value)")
            var again: [UInt8] = []
            decoded.encode(into: &again)
            #expect(again == bytes)
            if case .real(let real) = value, case .real(let back) = decoded {
                #expect(real.bitPattern == back.bitPattern)
            }
        }
    }

    @Test func textEncodesItsExactBytesWhateverTheCase() {
        var valid: [UInt8] = []
        SQLValue.text("a\u{0}b").encode(into: &valid)
        #expect(valid == [3, 3, 0x61, 0, 0x62])
        var invalid: [UInt8] = []
        SQLValue.text(bytes: [0x61, 0xFF]).encode(into: &invalid)
        #expect(invalid == [3, 2, 0x61, 0xFF])
        // Different stored bytes, different keys: 'a' and 'a'||char(0)||'b' never share metadata.
        #expect(SQLValue.encodeKey([.text("a")]) != SQLValue.encodeKey([.text("a\u{0}b")]))
    }

    @Test func aLengthBeyondTheBufferIsRefusedNotTrapped() {
        for bytes: [UInt8] in [
            [3, 5, 0x61], [4, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
            [3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7F], [9], [],
        ] {
            var reader = ByteReader(bytes)
            #expect(throws: ShoalError.self) { try SQLValue.decode(from: &reader) }
        }
    }

    @Test func theDigestCoversExactlyTheStoredBytes() {
        func digest(_ value: SQLValue) -> StateDigest {
            var digest = StateDigest()
            var state = RowState(columnCount: 1)
            let stamp = Stamp(hlc: HLC(rawValue: 1), site: SiteID(high: 1, low: 1), seq: 1)
            _ = state.merge(
                Change(
                    table: "t",
                    primaryKey: [.integer(1)],
                    payload: .column("c", value),
                    causalLength: 1,
                    stamp: stamp
                ),
                column: 0
            )
            digest.addRow(table: "t", primaryKey: [.integer(1)], state: state, columns: ["c"], values: [value])
            return digest
        }
        let digests = edgeValues.map(digest)
        // Every distinct value (by bytes) gives a distinct digest; -0.0 and 0.0 differ, so do text and blob.
        #expect(Set(digests).count == Set(edgeValues).count)
        #expect(digest(.real(0)) != digest(.real(-0.0)))
        #expect(digest(.text("x")) != digest(.text("x\u{0}y")))
        #expect(digest(SQLValue.text(bytes: [0x78, 0xFF])) != digest(.text("x\u{FFFD}")))
    }
}
