import Foundation
import Testing

@testable import ShoalCore

@Suite struct ChangeStreamTests {
    private let site = SiteID(high: 0xABCD, low: 42)

    private func stream(_ changes: [Change]) -> [Substring] {
        var lines = [
            ChangeStream.headerLine(.init(site: site, since: VersionVector(), claim: VersionVector([site: 3])))
        ]
        lines += changes.map(ChangeStream.line(for:))
        lines.append(ChangeStream.trailerLine(count: changes.count))
        return lines.map { Substring($0) }
    }

    @Test func everyValueTypeRoundTripsExactly() throws {
        let values = edgeValues
        let changes =
            values.enumerated().map { index, value in
                Change(
                    table: "t",
                    primaryKey: [.text("k"), .integer(Int64(index))],
                    payload: .column("c", value),
                    causalLength: 1,
                    stamp: Stamp(hlc: HLC(rawValue: .max - 5), site: site, seq: UInt64(index + 1)),
                    previous: index.isMultiple(of: 2) ? Dot(site: site, seq: 9) : nil
                )
            } + [
                Change(
                    table: "t",
                    primaryKey: [.blob([1])],
                    payload: .row,
                    causalLength: 4,
                    stamp: Stamp(hlc: HLC(rawValue: 1), site: site, seq: 1)
                ),
                Change(
                    table: "t",
                    primaryKey: [.real(2.5)],
                    payload: .counter("n", increments: .max, decrements: 3),
                    causalLength: 1,
                    stamp: Stamp(hlc: HLC(rawValue: 1), site: site, seq: 2)
                ),
            ]
        let parsed = try ChangeStream.parse(lines: stream(changes))
        #expect(parsed.changes == changes)
        // Bit for bit: reals by bit pattern, text by bytes and by case.
        for (sent, received) in zip(changes, parsed.changes) {
            switch (sent.payload, received.payload) {
            case (.column(_, .real(let a)), .column(_, .real(let b))): #expect(a.bitPattern == b.bitPattern)
            case (.column(_, .text(let a)), .column(_, .text(let b))): #expect(Array(a.utf8) == Array(b.utf8))
            case (.column(_, .invalidText(let a)), .column(_, .invalidText(let b))): #expect(a == b)
            case (.column(_, let a), .column(_, let b)): #expect(a == b)
            default: break
            }
        }
        #expect(parsed.site == site && parsed.claim == VersionVector([site: 3]))
    }

    @Test func aMalformedLineIsNamed() {
        var lines = stream([
            Change(
                table: "t",
                primaryKey: [.integer(1)],
                payload: .row,
                causalLength: 2,
                stamp: Stamp(hlc: HLC(rawValue: 1), site: site, seq: 1)
            )
        ])
        lines.insert("{\"t\": \"x\", \"k\": [1]}", at: 2)
        #expect {
            try ChangeStream.parse(lines: Array(lines))
        } throws: { error in
            let error = error as! ShoalError
            return error.code == .malformedStream && error.message.hasPrefix("line 3:")
        }
    }

    @Test func aStreamWithoutItsTrailerIsTruncated() {
        let lines = stream([]).dropLast()
        #expect {
            try ChangeStream.parse(lines: Array(lines))
        } throws: { ($0 as! ShoalError).code == .truncatedStream }
        #expect {
            try ChangeStream.parse(lines: [])
        } throws: { ($0 as! ShoalError).code == .truncatedStream }
    }

    @Test func aStreamCutInsideALineIsTruncated() {
        let change = Change(
            table: "t",
            primaryKey: [.integer(1)],
            payload: .column("c", .text("x")),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: 1), site: site, seq: 1)
        )
        var lines = stream([change, change]).dropLast()
        lines[lines.index(before: lines.endIndex)] = lines.last!.dropLast(7)
        #expect {
            try ChangeStream.parse(lines: Array(lines))
        } throws: { error in
            let error = error as! ShoalError
            return error.code == .truncatedStream && error.message.contains("middle of line 3")
        }
    }

    @Test func aColumnWriteOnADeletedRowIsRefused() {
        let change = Change(
            table: "t",
            primaryKey: [.integer(1)],
            payload: .column("c", .null),
            causalLength: 2,
            stamp: Stamp(hlc: HLC(rawValue: 1), site: site, seq: 1)
        )
        #expect {
            try ChangeStream.parse(lines: stream([change]))
        } throws: { ($0 as! ShoalError).code == .malformedStream }
    }

    private func column(_ value: SQLValue) -> Change {
        Change(
            table: "t",
            primaryKey: [value],
            payload: .column("c", value),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: 7), site: site, seq: 1)
        )
    }

    @Test func specialValuesHaveTheirDocumentedForms() {
        let nul = ChangeStream.line(for: column(.text("x\u{0}y")))
        #expect(nul.contains(#""v":"x\u0000y""#))
        let invalid = ChangeStream.line(for: column(SQLValue.text(bytes: [0x61, 0xFF, 0x62])))
        #expect(invalid.contains(#""v":{"text_base64":"Yf9i"}"#))
        #expect(ChangeStream.line(for: column(.real(-0.0))).contains(#""v":{"real":-0.0}"#))
        #expect(ChangeStream.line(for: column(.real(-.infinity))).contains(#""v":{"real":"-inf"}"#))
        #expect(ChangeStream.line(for: column(.real(.leastNonzeroMagnitude))).contains(#""v":{"real":5e-324}"#))
        // Each line is plain JSON that another tool can read.
        for line in [nul, invalid] {
            #expect((try? JSONSerialization.jsonObject(with: Data(line.utf8))) != nil)
        }
    }

    @Test func linesWrittenByOtherToolsAreReadExactly() throws {
        // Escapes (including a surrogate pair), spaces and key order as any JSON writer may produce them.
        let hexSite = site.hex
        let text =
            #"{ "v" : "a\u0000\ud83d\ude00\/", "t":"t", "k":[ -9223372036854775808 ], "cl":1, "h":5, "#
            + #""s":"\#(hexSite)", "q":2, "c":"c", "p":"\#(hexSite):1" }"#
        let parsed = try ChangeStream.parse(lines: streamLines(text))
        #expect(parsed.changes.first?.payload == .column("c", .text("a\u{0}😀/")))
        #expect(parsed.changes.first?.primaryKey == [.integer(.min)])
        #expect(parsed.changes.first?.previous == Dot(site: site, seq: 1))
    }

    private func streamLines(_ changeLine: String) -> [Substring] {
        [
            ChangeStream.headerLine(.init(site: site, since: VersionVector(), claim: VersionVector([site: 3]))),
            changeLine, ChangeStream.trailerLine(count: 1),
        ].map { Substring($0) }
    }

    @Test func textThatIsNotUTF8IsRefusedNeverReplaced() {
        let good = ChangeStream.line(for: column(.text("aéb")))
        var bytes = Array(good.utf8)
        // Cut the é in half: a string holding a stray byte.
        let index = bytes.firstIndex(of: 0xC3)!
        bytes.remove(at: index)
        let broken = String(decoding: bytes, as: UTF8.self)  // holds U+FFFD now, as String(decoding:) would
        #expect(broken.contains("\u{FFFD}"))
        var line = Array(good.utf8)
        line.remove(at: index)
        let header = Array(
            ChangeStream.headerLine(.init(site: site, since: VersionVector(), claim: VersionVector())).utf8
        )
        var parser = ChangeStream.Parser()
        #expect {
            try header.withUnsafeBufferPointer { (buffer) throws(ShoalError) in try parser.consume(line: buffer) }
            try line.withUnsafeBufferPointer { (buffer) throws(ShoalError) in try parser.consume(line: buffer) }
        } throws: { ($0 as? ShoalError)?.code == .malformedStream }
        // A lone surrogate escape is not text either.
        let lone = ChangeStream.line(for: column(.text("a"))).replacingOccurrences(
            of: #""v":"a""#,
            with: #""v":"\ud800""#
        )
        #expect {
            try ChangeStream.parse(lines: streamLines(lone))
        } throws: { ($0 as? ShoalError)?.code == .malformedStream }
    }

    @Test func badValuesAreRefusedWithTheLine() {
        for value in [
            #"{"real":"one"}"#, #"{"blob":"**"}"#, #"{"text_base64":"@"}"#, #"{"date":1}"#, #"{}"#, "1.5", "true",
            "99999999999999999999", #"{"real":1,"blob":""}"#,
        ] {
            let line = ChangeStream.line(for: column(.null)).replacingOccurrences(
                of: #""v":null"#,
                with: #""v":"# + value
            )
            #expect {
                try ChangeStream.parse(lines: streamLines(line))
            } throws: { error in
                let error = error as! ShoalError
                return error.code == .malformedStream && error.message.hasPrefix("line 2:")
            }
        }
    }

    @Test func aVersionVectorIsReadFromAnyOfItsForms() throws {
        let vector = VersionVector([site: 12, SiteID(high: 1, low: 2): 3])
        let plain = ChangeStream.json(vector)
        #expect(try ChangeStream.parseVersionVector(json: plain) == vector)
        let header = ChangeStream.headerLine(.init(site: site, since: VersionVector(), claim: vector))
        #expect(try ChangeStream.parseVersionVector(json: header) == vector)
        let status =
            #"{"conflicts":0,"digest":"00","name":null,"peers":null,"running":false,"site":"\#(site.hex)","#
            + #""tables":[{"counters":[],"name":"t","rows":1,"tombstones":0}],"version_vector":\#(plain)}"#
        #expect(try ChangeStream.parseVersionVector(json: status) == vector)
        #expect(try ChangeStream.parseVersionVector(json: " {} ") == VersionVector())
        for bad in ["", "{", "[]", #"{"x":1}"#, #"{"\#(site.hex)":-1}"#, #"{"\#(site.hex)":1.5}"#, plain + "x"] {
            #expect {
                try ChangeStream.parseVersionVector(json: bad)
            } throws: { ($0 as? ShoalError)?.code == .invalidArgument }
        }
    }
}
