import Testing

@testable import ShoalCore

private let siteA = SiteID(high: 0, low: 0xA)
private let siteB = SiteID(high: 0, low: 0xB)
private let siteC = SiteID(high: 0, low: 0xC)

private func stamp(_ ms: UInt64, _ site: SiteID, _ seq: UInt64, logical: UInt16 = 0) -> Stamp {
    Stamp(hlc: HLC(milliseconds: ms, logical: logical), site: site, seq: seq)
}

private func column(_ value: SQLValue, cl: UInt64 = 1, _ stamp: Stamp, previous: Dot? = nil) -> Change {
    Change(
        table: "t",
        primaryKey: [.integer(1)],
        payload: .column("v", value),
        causalLength: cl,
        stamp: stamp,
        previous: previous
    )
}

private func row(cl: UInt64, _ stamp: Stamp) -> Change {
    Change(table: "t", primaryKey: [.integer(1)], payload: .row, causalLength: cl, stamp: stamp)
}

private func counter(_ increments: UInt64, _ decrements: UInt64, _ stamp: Stamp) -> Change {
    Change(
        table: "t",
        primaryKey: [.integer(1)],
        payload: .counter("n", increments: increments, decrements: decrements),
        causalLength: 1,
        stamp: stamp
    )
}

/// Merges `changes` into a fresh one-column row in the given order.
private func merged(_ changes: [Change]) -> RowState {
    var state = RowState(columnCount: 1)
    for change in changes { _ = state.merge(change, column: change.columnName == nil ? nil : 0) }
    return state
}

@Suite struct MergeRulesTests {
    @Test func aRowHashesTheSameWhateverOrderItsTableHoldsItsColumnsIn() {
        // Two nodes that each added a column first hold (v, x1, x2) and (v, x2, x1): the same row must hash alike.
        let cells: [String: RowState.Cell] = [
            "v": .value(stamp(10, siteA, 1), previous: nil), "x1": .empty,
            "x2": .counter([siteB: CounterEntry(increments: 3, decrements: 1, seq: 2, hlc: HLC(rawValue: 20))]),
        ]
        let values: [String: SQLValue] = ["v": .text("v"), "x1": .text("d"), "x2": .integer(2)]
        func hash(_ columns: [String], state: Bool = true) -> [UInt8] {
            StateDigest.rowHash(
                table: "t",
                primaryKey: [.integer(1)],
                state: state
                    ? RowState(causalLength: 1, lengthStamp: stamp(9, siteC, 1), cells: columns.map { cells[$0]! }) : nil,
                columns: columns,
                values: columns.map { values[$0]! },
                defaults: columns.map { $0 == "x1" ? .text("d") : nil }
            )
        }
        #expect(hash(["v", "x1", "x2"]) == hash(["v", "x2", "x1"]))
        #expect(hash(["v", "x1", "x2"]) == hash(["x2", "x1", "v"]))
        #expect(hash(["v", "x1", "x2"], state: false) == hash(["x1", "x2", "v"], state: false))
        // And the values still count: another value, another hash.
        #expect(hash(["v", "x1", "x2"]) != hash(["v", "x1", "x2"], state: false))
        #expect(StateDigest.nameOrder(["b", "a", "c"]) == [1, 0, 2])
    }

    @Test func laterClockWinsWhateverTheOrder() {
        let older = column(.text("old"), stamp(100, siteB, 1))
        let newer = column(.text("new"), stamp(200, siteA, 1))
        #expect(merged([older, newer]) == merged([newer, older]))
        #expect(merged([older, newer]).cells[0] == .value(newer.stamp, previous: nil))
    }

    @Test func equalClocksResolveBySiteTheSameWayEverywhere() {
        let fromA = column(.text("a"), stamp(100, siteA, 1))
        let fromB = column(.text("b"), stamp(100, siteB, 1))
        let one = merged([fromA, fromB])
        let other = merged([fromB, fromA])
        #expect(one == other)
        #expect(one.cells[0] == .value(fromB.stamp, previous: nil))  // siteB > siteA
    }

    @Test func reapplyingAChangeIsKnownAndChangesNothing() {
        var state = RowState(columnCount: 1)
        let change = column(.integer(1), stamp(100, siteA, 1))
        #expect(
            state.merge(change, column: 0) == .applied(lifeChanged: true, overwritten: nil, overwrittenPrevious: nil)
        )
        let snapshot = state
        #expect(state.merge(change, column: 0) == .known)
        #expect(state == snapshot)
    }

    @Test func aLosingChangeReportsTheWinner() {
        var state = merged([column(.integer(2), stamp(200, siteA, 2), previous: Dot(site: siteB, seq: 1))])
        let outcome = state.merge(column(.integer(1), stamp(100, siteB, 1)), column: 0)
        #expect(outcome == .stale(winner: stamp(200, siteA, 2), winnerPrevious: Dot(site: siteB, seq: 1)))
    }

    @Test func aDeleteWinsOverAConcurrentUpdateInEitherOrder() {
        let insert = column(.text("x"), stamp(100, siteA, 1))
        let delete = row(cl: 2, stamp(150, siteA, 2))
        // B updated the row without seeing the delete, and with a later clock.
        let update = column(.text("y"), stamp(900, siteB, 1))
        for order in [[insert, delete, update], [insert, update, delete], [update, delete, insert]] {
            let state = merged(order)
            #expect(!state.isAlive)
            #expect(state.causalLength == 2)
            #expect(state.cells[0] == .empty)
        }
    }

    @Test func onlyAnInsertAfterTheDeleteRevivesTheRowAndNoGhostReturns() {
        let insert = column(.text("x"), stamp(100, siteA, 1))
        let delete = row(cl: 2, stamp(150, siteA, 2))
        let reinsertRow = row(cl: 3, stamp(300, siteB, 1))
        let reinsertValue = column(.text("again"), cl: 3, stamp(300, siteB, 1))
        // A late update from the first life must not resurrect the old value.
        let lateUpdate = column(.text("ghost"), cl: 1, stamp(999, siteC, 1))
        let expected = merged([insert, delete, reinsertRow, reinsertValue])
        #expect(expected.isAlive && expected.causalLength == 3)
        #expect(expected.cells[0] == .value(reinsertValue.stamp, previous: nil))
        for order in [
            [lateUpdate, reinsertValue, delete, insert, reinsertRow],
            [reinsertValue, reinsertRow, lateUpdate, insert, delete],
            [delete, lateUpdate, reinsertRow, reinsertValue, insert],
        ] {
            #expect(merged(order) == expected)
        }
    }

    @Test func concurrentDeletesConvergeOnOneLengthStamp() {
        let deleteA = row(cl: 2, stamp(100, siteA, 2))
        let deleteB = row(cl: 2, stamp(100, siteB, 2))
        #expect(merged([deleteA, deleteB]) == merged([deleteB, deleteA]))
        #expect(merged([deleteA, deleteB]).lengthStamp == deleteB.stamp)
    }

    @Test func countersFromSeveralSitesAddUp() {
        let changes = [
            counter(1, 0, stamp(100, siteA, 1)),
            counter(3, 0, stamp(120, siteA, 2)),  // A's running total supersedes its earlier one
            counter(2, 0, stamp(90, siteB, 1)),
            counter(5, 1, stamp(80, siteC, 1)),
        ]
        let state = merged(changes)
        #expect(state.counterValue(0) == 3 + 2 + 4)
        #expect(merged(changes.reversed()) == state)
        var again = state
        #expect(again.merge(changes[0], column: 0) == .stale(winner: nil, winnerPrevious: nil))
        #expect(again.merge(changes[1], column: 0) == .known)
    }

    @Test func localWritesFollowTheSameRules() {
        var state = RowState(columnCount: 2)
        let isCounter = [false, true]
        state.recordLocalWrite(
            existedBefore: false,
            existsAfter: true,
            changed: [true, true],
            counterDelta: [0, 5],
            isCounter: isCounter,
            stamp: stamp(100, siteA, 1)
        )
        #expect(state.causalLength == 1 && state.lengthStamp == nil && state.counterValue(1) == 5)
        state.recordLocalWrite(
            existedBefore: true,
            existsAfter: true,
            changed: [true, false],
            counterDelta: [0, -2],
            isCounter: isCounter,
            stamp: stamp(110, siteA, 2)
        )
        #expect(state.cells[0] == .value(stamp(110, siteA, 2), previous: Dot(site: siteA, seq: 1)))
        #expect(state.counterValue(1) == 3)
        state.recordLocalWrite(
            existedBefore: true,
            existsAfter: false,
            changed: [false, false],
            counterDelta: [0, -3],
            isCounter: isCounter,
            stamp: stamp(120, siteA, 3)
        )
        #expect(
            state.causalLength == 2 && state.lengthStamp == stamp(120, siteA, 3) && state.cells == [.empty, .empty]
        )
        state.recordLocalWrite(
            existedBefore: false,
            existsAfter: true,
            changed: [true, true],
            counterDelta: [0, 1],
            isCounter: isCounter,
            stamp: stamp(130, siteA, 4)
        )
        #expect(state.causalLength == 3 && state.lengthStamp == stamp(130, siteA, 4) && state.counterValue(1) == 1)
    }

    @Test func metadataRoundTripsThroughItsBinaryForm() throws {
        struct Sites: SiteIndexing {
            var list: [SiteID] = []
            mutating func index(of site: SiteID) -> UInt64 {
                if let index = list.firstIndex(of: site) { return UInt64(index) }
                list.append(site)
                return UInt64(list.count - 1)
            }
            func site(at index: UInt64) throws(ShoalError) -> SiteID { list[Int(index)] }
        }
        var sites = Sites()
        let state = RowState(
            causalLength: 3,
            lengthStamp: stamp(5, siteC, 9),
            cells: [
                .value(stamp(10, siteA, 1), previous: Dot(site: siteB, seq: 4)), .empty,
                .counter([siteA: CounterEntry(increments: 7, decrements: 2, seq: 3, hlc: HLC(rawValue: 77))]),
                .value(stamp(11, siteB, 2, logical: 3), previous: nil),
            ]
        )
        let bytes = state.encoded(sites: &sites)
        #expect(try RowState(encoded: bytes, columnCount: 4, sites: sites) == state)
        #expect(throws: ShoalError.self) { try RowState(encoded: bytes, columnCount: 3, sites: sites) }
        #expect(throws: ShoalError.self) {
            try RowState(encoded: Array(bytes.dropLast()), columnCount: 4, sites: sites)
        }

        // Columns written together: each cell after the first with the same stamp (and no previous dot) is one byte;
        // a cell with another stamp, a previous dot, or after an empty or counter cell still reads right.
        let together = stamp(20, siteA, 5)
        let row = RowState(
            causalLength: 1,
            lengthStamp: nil,
            cells: [
                .value(together, previous: nil), .value(together, previous: nil), .empty,
                .value(together, previous: nil), .value(stamp(21, siteB, 1), previous: nil),
                .value(stamp(21, siteB, 1), previous: Dot(site: siteA, seq: 4)),
                .counter([siteA: CounterEntry(increments: 1, decrements: 0, seq: 5, hlc: together.hlc)]),
                .value(stamp(21, siteB, 1), previous: nil),
            ]
        )
        let compact = row.encoded(sites: &sites)
        #expect(try RowState(encoded: compact, columnCount: 8, sites: sites) == row)
        let cell = RowState.Cell.value(together, previous: nil)
        let one = RowState(causalLength: 1, lengthStamp: nil, cells: [cell]).encoded(sites: &sites)
        let three = RowState(causalLength: 1, lengthStamp: nil, cells: [cell, cell, cell]).encoded(sites: &sites)
        #expect(three.count == one.count + 2, "\(one.count) bytes for one column, \(three.count) for three")
        // Metadata written before the compact form (each stamp whole) still reads.
        var spelled: [UInt8] = [1, 0, 2, 1]
        spelled.appendBigEndian(together.hlc.rawValue)
        spelled += [UInt8(sites.index(of: siteA)), 5, 1]
        spelled.appendBigEndian(together.hlc.rawValue)
        spelled += [UInt8(sites.index(of: siteA)), 5]
        #expect(
            try RowState(encoded: spelled, columnCount: 2, sites: sites)
                == RowState(causalLength: 1, lengthStamp: nil, cells: [cell, cell])
        )
        // A repeated stamp with no value cell before it is corrupt, not a crash.
        #expect(throws: ShoalError.self) { try RowState(encoded: [1, 0, 1, 4], columnCount: 1, sites: sites) }
    }

    @Test func theDigestIgnoresOrderButSeesEveryDifference() {
        let state = merged([column(.real(1.5), stamp(100, siteA, 1))])
        var forward = StateDigest()
        var backward = StateDigest()
        let rows: [(Int64, SQLValue)] = [(1, .real(1.5)), (2, .null), (3, .blob([0, 1])), (4, .text("x"))]
        for (key, value) in rows {
            forward.addRow(table: "t", primaryKey: [.integer(key)], state: state, columns: ["v"], values: [value])
        }
        for (key, value) in rows.reversed() {
            backward.addRow(table: "t", primaryKey: [.integer(key)], state: state, columns: ["v"], values: [value])
        }
        #expect(forward == backward)
        var different = StateDigest()
        for (key, value) in rows {
            let changed = key == 1 ? SQLValue.real(-1.5) : value
            different.addRow(table: "t", primaryKey: [.integer(key)], state: state, columns: ["v"], values: [changed])
        }
        #expect(different != forward)
        #expect(forward.rowCount == 4 && forward.hex.count == 64)
    }
}
