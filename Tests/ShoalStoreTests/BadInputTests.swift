import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// The code of the ShoalError `body` throws; `nil` if it throws nothing (or something else).
func code(_ body: () throws -> Void) -> ShoalError.Code? {
    do {
        try body()
        return nil
    } catch let error as ShoalError {
        return error.code
    } catch {
        return nil
    }
}

@Suite struct BadInputTests {
    @Test func tablesThatCannotBeReplicatedAreRefusedWithTheReason() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE nokey(a, b)")
        #expect(code { try store.replicate(table: "nokey") } == .noPrimaryKey)
        try store.execute("CREATE TABLE strict_col(id INTEGER PRIMARY KEY, a TEXT NOT NULL)")
        #expect(code { try store.replicate(table: "strict_col") } == .unsupportedSchema)
        try store.execute("CREATE TABLE uniq(id INTEGER PRIMARY KEY, email TEXT UNIQUE)")
        #expect(code { try store.replicate(table: "uniq") } == .unsupportedSchema)
        #expect(code { try store.replicate(table: "missing") } == .notReplicated)
        try store.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, n INTEGER)")
        #expect(code { try store.replicate(table: "c", counters: ["id"]) } == .unknownColumn)
        #expect(code { try store.replicate(table: "c", counters: ["nope"]) } == .unknownColumn)
        #expect(try store.replicatedTables().isEmpty)
    }

    /// Changes for a table or a column this database does not have (yet) are held, not refused: the rest applies,
    /// and they are merged once the table or column appears (see SchemaEvolutionTests for the whole story).
    @Test func unknownTablesAndColumnsAreHeldAndReplayedWhenTheyAppear() throws {
        let source = try makeStore()
        try source.execute(
            "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER DEFAULT 0, hits INTEGER DEFAULT 0, extra)"
        )
        try source.replicate(table: "items", counters: ["hits"])
        try source.execute("CREATE TABLE other(id INTEGER PRIMARY KEY, v)")
        try source.replicate(table: "other")
        try source.execute("INSERT INTO items(id, name, extra) VALUES (1, 'a', 'more')")
        try source.execute("INSERT INTO other VALUES (1, 'x')")
        let target = try makeStore()
        try makeItems(target)
        let changes = try source.changes(since: VersionVector()).flatMap(\.changes)
        #expect(try target.apply(changes).applied == changes.count)
        #expect(try rows(target, "SELECT id, name FROM items") == [[.integer(1), .text("a")]])
        #expect(try target.heldChanges() == ["items": 1, "other": 1])
        #expect(try target.digest() == target.fullScanDigest())
        // Adding the column and replicating the table each merge what was held for them.
        try target.execute("ALTER TABLE items ADD COLUMN extra")
        try target.execute("CREATE TABLE other(id INTEGER PRIMARY KEY, v)")
        try target.replicate(table: "other")
        #expect(try target.replayHeldValues() == 0)
        #expect(try target.heldChanges().isEmpty)
        #expect(try rows(target, "SELECT id, name, extra FROM items") == [[.integer(1), .text("a"), .text("more")]])
        #expect(try rows(target, "SELECT * FROM other") == [[.integer(1), .text("x")]])
        #expect(try target.digest() == target.fullScanDigest())
    }

    /// Found by fuzzing (Tools/Fuzz/Corpus/apply/crash-null-key): a NULL key value reached SQLite, which refused
    /// it mid-apply (a composite key) or would have picked a rowid for it (an INTEGER PRIMARY KEY).
    @Test func keysNoNodeCanWriteAreRefusedWithNothingApplied() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("CREATE TABLE pairs(a TEXT, b INTEGER, v, PRIMARY KEY(a, b)) WITHOUT ROWID")
        try store.replicate(table: "pairs")
        let before = try store.digest()
        let site = SiteID(high: 1, low: 2)
        func keyed(_ table: String, _ key: [SQLValue]) -> Change {
            Change(
                table: table,
                primaryKey: key,
                payload: .column(table == "items" ? "name" : "v", .text("x")),
                causalLength: 1,
                stamp: Stamp(hlc: HLC(milliseconds: 1_700_000_000_000, logical: 0), site: site, seq: 1)
            )
        }
        #expect(code { try store.apply([keyed("pairs", [.text("a"), .null])]) } == .malformedStream)
        #expect(code { try store.apply([keyed("items", [.null])]) } == .malformedStream)
        #expect(code { try store.apply([keyed("items", [.text("a")])]) } == .malformedStream)
        #expect(code { try store.apply([keyed("items", [.real(1.5)])]) } == .malformedStream)
        // Found by fuzzing too (Tools/Fuzz/Corpus/apply/crash-huge-seq): a seq beyond Int64.max was stored as a
        // negative integer, and reading the version vector back trapped.
        var huge = keyed("items", [.integer(2)])
        huge.stamp = Stamp(hlc: huge.stamp.hlc, site: site, seq: UInt64(Int64.max) + 1)
        #expect(code { try store.apply([huge]) } == .malformedStream)
        #expect(try store.digest() == before)
        #expect(try store.versionVector().isEmpty)
        let good: [Change] = [keyed("items", [.integer(1)]), keyed("pairs", [.text("a"), .integer(1)])]
        try store.apply(good)
        #expect(try store.execute("SELECT count(*) FROM items").rows == [[.integer(1)]])
    }

    /// Found by fuzzing (Tools/Fuzz/Corpus/apply/crash-digest-mismatch): a value the column's affinity converts
    /// (a REAL into a TEXT column) was stored converted, so the cell no longer matched the merge metadata and the
    /// maintained digest differed from a full scan. Such values come only from a column declared differently (the
    /// same column added with two definitions): they are held as they were written, never stored converted.
    @Test func valuesTheColumnWouldConvertAreHeldNeverStoredConverted() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE t(k TEXT PRIMARY KEY, s TEXT, i INTEGER, r REAL, n NUMERIC, b BLOB, u)")
        try store.replicate(table: "t")
        let site = SiteID(high: 1, low: 2)
        func change(_ column: String, _ value: SQLValue, key: SQLValue = .text("k")) -> Change {
            Change(
                table: "t",
                primaryKey: [key],
                payload: .column(column, value),
                causalLength: 1,
                stamp: Stamp(hlc: HLC(milliseconds: 1_700_000_000_000, logical: 0), site: site, seq: 1)
            )
        }
        let converted: [(String, SQLValue)] = [
            ("s", .real(-8.37e298)), ("s", .integer(3)), ("i", .text(" 12 ")), ("i", .real(2)), ("i", .real(-0.0)),
            ("r", .integer(2)), ("r", .real(-0.0)), ("r", .text("1e5")), ("n", .text("-.5")), ("u", .real(.nan)),
        ]
        for (column, value) in converted {
            #expect(code { try store.apply([change(column, value)]) } == nil, "\(column) \(value)")
        }
        #expect(try rows(store, "SELECT s, i, r, n, b, u FROM t") == [Array(repeating: .null, count: 6)])
        // One held value per column: the values of one column share a clock, so the first is kept.
        #expect(try store.heldChanges()["t"] == 5)
        #expect(try store.digest() == store.fullScanDigest())
        try store.execute("DELETE FROM t")
        let afterHeld = try store.digest()
        #expect(code { try store.apply([change("s", .text("x"), key: .real(2.5))]) } == .unsupportedSchema)
        #expect(try store.digest() == afterHeld)
        #expect(try store.versionVector()[site] == 0)
        let kept: [(String, SQLValue)] = [
            ("s", .text("12")), ("s", .blob([1])), ("i", .text("12abc")), ("i", .real(2.5)), ("i", .text("1e")),
            ("r", .real(2)), ("r", .real(.infinity)), ("n", .integer(.max)), ("b", .real(-0.0)), ("u", .text("7")),
        ]
        for (index, (column, value)) in kept.enumerated() {
            try store.apply([change(column, value, key: .text("row\(index)"))])
        }
        #expect(try store.fullScanDigest() == (try store.digest()))

        // What a local write stores, SQLite already converted: the same schema on both sides always applies.
        let source = try makeStore()
        try source.execute("CREATE TABLE t(k TEXT PRIMARY KEY, s TEXT, i INTEGER, r REAL, n NUMERIC, b BLOB, u)")
        try source.replicate(table: "t")
        try source.execute("INSERT INTO t VALUES (1, 2.5, '12', 2, ' 3.5 ', -0.0, 'x'), ('b', 3, 2.0, -0.0, '7', 1, 2)")
        try source.execute("UPDATE t SET r = 5, i = '9' WHERE k = '1'")
        let target = try makeStore()
        try target.execute("CREATE TABLE t(k TEXT PRIMARY KEY, s TEXT, i INTEGER, r REAL, n NUMERIC, b BLOB, u)")
        try target.replicate(table: "t")
        try target.apply(try source.changes(since: VersionVector()).flatMap(\.changes))
        #expect(try target.digest() == (try source.digest()))
        #expect(try target.fullScanDigest() == (try target.digest()))
    }

    @Test func aMalformedStreamNamesTheLineAndAppliesNothing() throws {
        let source = try makeStore()
        try makeItems(source)
        try source.execute("INSERT INTO items(id, name) VALUES (1, 'a'), (2, 'b')")
        var lines = [
            ChangeStream.headerLine(
                .init(site: source.siteID, since: VersionVector(), claim: try source.versionVector())
            )
        ]
        let changes = try source.changes(since: VersionVector()).flatMap(\.changes)
        lines += changes.map(ChangeStream.line(for:))
        lines.append(ChangeStream.trailerLine(count: changes.count))
        var broken = lines
        broken[3] = String(broken[3].dropLast(5))
        #expect {
            try ChangeStream.parse(lines: broken.map { Substring($0) })
        } throws: { ($0 as! ShoalError).message.hasPrefix("line 4:") }
        #expect(code { _ = try ChangeStream.parse(lines: lines.dropLast().map { Substring($0) }) } == .truncatedStream)
        let parsed = try ChangeStream.parse(lines: lines.map { Substring($0) })
        let target = try makeStore()
        try makeItems(target)
        try target.apply(parsed.changes, claim: parsed.claim, since: parsed.since)
        #expect(try target.digest() == source.digest())
    }

    @Test func ourOwnChangesReplayedBackAreHarmlessButForgedOnesAreRefused() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        try store.execute("UPDATE items SET name = 'b' WHERE id = 1")
        let before = try store.digest()
        let own = try store.changes(since: VersionVector())
        for batch in own { try store.apply(batch.changes, claim: batch.claim) }
        #expect(try store.digest() == before)
        var forged = own[0].changes[0]
        forged.stamp.seq = 99
        #expect(code { try store.apply([forged]) } == .siteConflict)
        #expect(code { try store.apply([], claim: VersionVector([store.siteID: 50])) } == .siteConflict)
        #expect(try store.digest() == before)
    }

    @Test func clocksBeyondTheDriftBoundAreRefusedAndLocalTimeIsNotDragged() throws {
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let future = ManualWallClock(milliseconds: 1_700_000_000_000 + 3_600_000)
        let store = try makeStore(clock)
        let ahead = try makeStore(future)
        try makeItems(store)
        try makeItems(ahead)
        try ahead.execute("INSERT INTO items(id, name) VALUES (1, 'from the future')")
        let refused = try sync(ahead, store)
        #expect(refused.applied == 0 && refused.clockRefusals.keys.sorted() == [ahead.siteID])
        #expect(try rows(store).isEmpty)
        #expect(try store.versionVector()[ahead.siteID] == 0)
        try store.execute("INSERT INTO items(id, name) VALUES (2, 'now')")
        let stamp = try store.changes(since: VersionVector()).flatMap(\.changes).first!.stamp
        #expect(stamp.hlc.milliseconds == 1_700_000_000_000)
        // Once local time catches up, the same changes are accepted.
        clock.advance(by: 3_600_000)
        try sync(ahead, store)
        #expect(try rows(store).count == 2)
    }

    @Test func aStreamCutForAVersionWeDoNotHoldIsRefused() throws {
        let a = try makeStore()
        let b = try makeStore()
        try makeItems(a)
        try makeItems(b)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        try a.execute("INSERT INTO items(id, name) VALUES (2, 'b')")
        let since = VersionVector([a.siteID: 1])
        let batches = try a.changes(since: since)
        #expect(code { try b.apply(batches[0].changes, claim: batches[0].claim, since: since) } == .streamNotApplicable)
        #expect(try b.versionVector().isEmpty)
    }

    /// Rewrites the header's claim of a stream file.
    private func forgeClaim(_ file: URL, _ edit: (inout [String: UInt64]) -> Void) throws {
        var lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n").map(String.init)
        var header = try JSONDecoder().decode(ChangeStream.Header.self, from: Data(lines[0].utf8))
        edit(&header.claim)
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        lines[0] = String(decoding: try encoder.encode(header), as: UTF8.self)
        try (lines.joined(separator: "\n") + "\n").write(to: file, atomically: true, encoding: .utf8)
    }

    @Test func aRaisedClaimInAStreamFileIsClippedToWhatItCarries() throws {
        let directory = try temporaryDirectory("claim")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db")
        let b = directory.appendingPathComponent("b.db")
        for db in [a, b] {
            try shoal(["init", "--db", db.path])
            try shoal(["sql", "--db", db.path, "CREATE TABLE t(k INTEGER PRIMARY KEY, v)"])
            try shoal(["replicate", "--db", db.path, "t"])
        }
        for k in 1...3 { try shoal(["sql", "--db", a.path, "INSERT INTO t VALUES (\(k), 'v\(k)')"]) }
        let siteA = try Store(path: a.path).siteID
        let stranger = SiteID.random()
        let file = directory.appendingPathComponent("stream.jsonl")
        try shoal(["changes", "--db", a.path]).write(to: file, atomically: true, encoding: .utf8)
        try forgeClaim(file) { claim in
            claim[siteA.hex] = 1_000
            claim[stranger.hex] = 50
        }
        let said = try shoal(["apply", "--db", b.path, file.path])
        #expect(said.contains("applied: 3"))
        // b holds a's changes 1 to 3, and claims exactly that: not 1,000, and nothing of a site it never saw.
        #expect(try Store(path: b.path).versionVector() == VersionVector([siteA: 3]))

        // a writes more; honest exchanges from b's own status deliver all of it.
        for k in 4...6 { try shoal(["sql", "--db", a.path, "INSERT INTO t VALUES (\(k), 'v\(k)')"]) }
        let status = try shoal(["status", "--db", b.path, "--json"])
        try pipeChanges(from: a, to: b, since: status)
        let storeB = try Store(path: b.path)
        #expect(try storeB.execute("SELECT count(*) FROM t").rows == [[.integer(6)]])
        #expect(try storeB.versionVector() == VersionVector([siteA: 6]))
        #expect(try storeB.digest() == Store(path: a.path).digest())
        // In sync now: a file holding b's status, or the stream file's header, asks for nothing more.
        let statusFile = directory.appendingPathComponent("status.json")
        try shoal(["status", "--db", b.path, "--json"]).write(to: statusFile, atomically: true, encoding: .utf8)
        let nothing = try shoal(["changes", "--db", a.path, "--since", statusFile.path])
        #expect(nothing.split(separator: "\n").count == 2, "a header and the end line")
    }

    @Test func aClaimWithoutChangesAdvancesNothingOnTheLivePathEither() throws {
        let a = try makeStore()
        let b = try makeStore()
        try makeItems(a)
        try makeItems(b)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        try a.execute("INSERT INTO items(id, name) VALUES (2, 'b')")
        let batches = try a.changes(since: VersionVector())
        var raised = batches.last!.claim
        raised.advance(a.siteID, to: 40)
        raised.advance(SiteID.random(), to: 9)
        try b.apply([], claim: raised)
        #expect(try b.versionVector().isEmpty)
        try b.apply(batches.flatMap(\.changes), claim: raised)
        #expect(try b.versionVector() == VersionVector([a.siteID: 2]))
        // Later writes still arrive through the ordinary exchange.
        try a.execute("INSERT INTO items(id, name) VALUES (3, 'c')")
        try sync(a, b)
        #expect(try b.versionVector() == a.versionVector())
        #expect(try b.digest() == a.digest())
    }

    @Test func aStreamWhoseChangesWereCompactedAwayStillCatchesTheReceiverUp() throws {
        let a = try makeStore()
        let b = try makeStore()
        try makeItems(a)
        try makeItems(b)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'first')")
        for round in 1...5 { try a.execute("UPDATE items SET name = 'name \(round)' WHERE id = 1") }
        try a.execute("INSERT INTO items(id, name) VALUES (2, 'other')")
        try a.execute("UPDATE items SET name = 'last' WHERE id = 2")
        while try !a.compactLog(maxEntries: 3).reachedEnd {}
        let batches = try a.changes(since: VersionVector())
        let carried = Set(batches.flatMap(\.changes).map(\.stamp.seq))
        #expect(carried.count < 8, "compaction left every transaction")
        for batch in batches { try b.apply(batch.changes, claim: batch.claim) }
        #expect(try b.versionVector() == a.versionVector())
        #expect(try b.digest() == a.digest())
    }

    @Test func aSiteWhoseLastWritesWereOverwrittenIsClaimedByAWholeAnswer() throws {
        let a = try makeStore()
        let c = try makeStore()
        let b = try makeStore()
        for store in [a, b, c] { try makeItems(store) }
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'from a')")
        try sync(a, b)
        try a.execute("UPDATE items SET name = 'edited on a' WHERE id = 1")
        try sync(a, c)
        try c.execute("UPDATE items SET name = 'from c' WHERE id = 1")
        // c relays a's second transaction only as overwritten: nothing of it travels, so b cannot claim it from the
        // changes, though it holds everything that transaction left; an answer that ends short claims it nowhere.
        let answer = try c.changes(since: b.versionVector())
        for batch in answer { try b.apply(batch.changes, claim: batch.claim) }
        #expect(try b.digest() == c.digest())
        #expect(try b.versionVector()[c.siteID] == 1)
        #expect(try b.versionVector()[a.siteID] == 1)
        // The same answer arriving whole claims it: its last batch covers it.
        try b.apply([], claim: answer.last!.claim, completing: true)
        #expect(try b.versionVector()[a.siteID] == 2)
        // a writes again: b receives it and now holds a's whole history.
        try a.execute("INSERT INTO items(id, name) VALUES (2, 'more')")
        try sync(c, a)
        try sync(a, b)
        #expect(try b.versionVector()[a.siteID] == 3)
        #expect(try b.digest() == a.digest())
    }

    @Test func aStreamCutShortAppliesNothingThoughItsFirstChunksWereMerged() throws {
        let directory = try temporaryDirectory("cut")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db")
        let b = directory.appendingPathComponent("b.db")
        for db in [a, b] {
            try shoal(["init", "--db", db.path])
            try shoal(["sql", "--db", db.path, "CREATE TABLE t(k INTEGER PRIMARY KEY, v)"])
            try shoal(["replicate", "--db", db.path, "t"])
        }
        // More changes than one chunk (20,000), so apply has merged some before it meets the cut.
        try shoal([
            "sql", "--db", a.path,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000) "
                + "INSERT INTO t SELECT i, 'value ' || i FROM n",
        ])
        let full = try shoal(["changes", "--db", a.path])
        let lines = full.split(separator: "\n")
        let before = try Store(path: b.path).digest()
        for (name, cut) in [
            ("no end line", lines.dropLast().joined(separator: "\n") + "\n"),
            ("cut inside a line", lines.prefix(45_000).joined(separator: "\n") + "\n" + lines[45_000].prefix(20)),
            (
                "a bad line late",
                (lines.prefix(40_000) + ["{\"t\":1}"] + lines.dropFirst(40_000)).joined(separator: "\n")
            ),
        ] {
            let file = directory.appendingPathComponent("cut.jsonl")
            try cut.write(to: file, atomically: true, encoding: .utf8)
            #expect(throws: ShoalError.self, "\(name)") { try shoal(["apply", "--db", b.path, file.path]) }
            let store = try Store(path: b.path)
            #expect(try store.digest() == before, "\(name)")
            #expect(try store.execute("SELECT count(*) FROM t").rows == [[.integer(0)]], "\(name)")
            #expect(try store.versionVector().isEmpty, "\(name)")
        }
        let file = directory.appendingPathComponent("whole.jsonl")
        try full.write(to: file, atomically: true, encoding: .utf8)
        #expect(try shoal(["apply", "--db", b.path, file.path]).contains("applied: 50000"))
        #expect(try Store(path: b.path).digest() == Store(path: a.path).digest())
    }

    @Test func anAppliedValueOverTheMaximumIsRefusedWhole() throws {
        let source = try makeStore()
        try source.execute("CREATE TABLE kv(k INTEGER PRIMARY KEY, v)")
        try source.replicate(table: "kv")
        try source.execute("INSERT INTO kv VALUES (1, 'small')")
        var changes = try source.changes(since: VersionVector()).flatMap(\.changes)
        guard let index = changes.firstIndex(where: { $0.columnName == "v" }) else {
            Issue.record("no column change to forge")
            return
        }
        changes[index].payload = .column("v", .blob([UInt8](repeating: 7, count: SQLValue.maximumBytes + 1)))
        let target = try makeStore()
        try target.execute("CREATE TABLE kv(k INTEGER PRIMARY KEY, v)")
        try target.replicate(table: "kv")
        #expect(code { try target.apply(changes) } == .valueTooLarge)
        #expect(try target.execute("SELECT count(*) FROM kv").rows == [[.integer(0)]])
    }
}
