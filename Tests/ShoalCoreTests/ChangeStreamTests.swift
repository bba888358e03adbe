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
        let values: [SQLValue] = [
            .null, .integer(.min), .integer(.max), .integer(0), .real(0.1), .real(-0.0), .real(.infinity),
            .real(Double(bitPattern: 0x3FF0_0000_0000_0001)), .real(1e300), .text(""), .text("héllo \"q\" \n"),
            .blob([]), .blob([0, 255, 10, 13]),
        ]
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
}
