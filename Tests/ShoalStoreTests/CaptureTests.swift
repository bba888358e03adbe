import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

func makeStore(_ clock: ManualWallClock = ManualWallClock(milliseconds: 1_700_000_000_000)) throws -> Store {
    var options = StoreOptions()
    options.clock = clock
    return try Store(path: ":memory:", options: options)
}

func makeItems(_ store: Store) throws {
    try store.execute(
        "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER DEFAULT 0, hits INTEGER DEFAULT 0)"
    )
    try store.replicate(table: "items", counters: ["hits"])
}

/// What a node does for a database awaiting its fresh state (`SyncNode+FreshState.swift`), store to store, once
/// `restored` holds all `peer` holds: takes the peer's word for the rows alive in `restored` that the peer does not hold,
/// then lets its own writes be sent again.
@discardableResult
func takeFreshState(_ restored: Store, from peer: Store) throws -> FreshStateReport {
    var report = FreshStateReport()
    guard try restored.awaitsFreshState() else { return report }
    func keys(_ store: Store, _ table: String) throws -> [[UInt8]] {
        var result: [[UInt8]] = []
        var after: [UInt8]?
        while true {
            let page = try store.rowHashes(of: table, after: after, limit: 100)
            result += page.rows.map(\.key)
            after = page.rows.last?.key
            if page.isLast { return result }
        }
    }
    let peerVector = try peer.versionVector()
    for table in try peer.tableDigests().tables.map(\.name) {
        let theirs = Set(try keys(peer, table))
        let part = try restored.takeFreshState(
            table: table,
            keys: try keys(restored, table).filter { !theirs.contains($0) },
            peerVector: peerVector
        )
        report.removed += part.removed
        report.orphaned += part.orphaned
        report.lifted += part.lifted
        #expect(!part.deferred)
    }
    try restored.freshStateTaken()
    return report
}

/// ``takeFreshState(_:from:)`` when a node would: `store` awaits its fresh state and holds all `peer` holds.
func freshStateIfDue(_ store: Store, from peer: Store) throws {
    guard try store.awaitsFreshState(), try store.versionVector().dominatesOrEquals(peer.versionVector()),
        try peer.versionVector().dominatesOrEquals(store.freshStateFloor())
    else { return }
    try takeFreshState(store, from: peer)
}

/// Every change `from` holds that `to` lacks, applied as the protocol does: batches in order, with claims, the last
/// completing the answer unless an earlier batch withheld something.
@discardableResult
func sync(_ from: Store, _ to: Store) throws -> ApplyReport {
    var total = ApplyReport()
    var received: [SiteID: UInt64] = [:]
    let batches = try from.changes(since: to.versionVector(), maxChangesPerBatch: 7)
    for (index, batch) in batches.enumerated() {
        let report = try to.apply(
            batch.changes,
            claim: batch.claim,
            received: received,
            completing: index == batches.count - 1 && !total.withheldAny
        )
        received.merge(report.acceptedHighest) { max($0, $1) }
        total.fenced.merge(report.fenced, uniquingKeysWith: +)
        total.applied += report.applied
        total.alreadyKnown += report.alreadyKnown
        total.conflicts += report.conflicts
        total.conflictsByTable.merge(report.conflictsByTable, uniquingKeysWith: +)
        total.clockRefusals.merge(report.clockRefusals) { max($0, $1) }
    }
    return total
}

func rows(_ store: Store, _ sql: String = "SELECT * FROM items ORDER BY id") throws -> [[SQLValue]] {
    try store.execute(sql).rows
}

@Suite struct CaptureTests {
    @Test func oneDotPerCommittedTransactionWhateverItHolds() throws {
        let store = try makeStore()
        try makeItems(store)
        let site = store.siteID
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        #expect(try store.versionVector()[site] == 1)
        try store.execute("BEGIN; UPDATE items SET name = 'x' WHERE id < 3; DELETE FROM items WHERE id = 3; COMMIT")
        #expect(try store.versionVector()[site] == 2)
        try store.transaction {
            try store.execute("INSERT INTO items(id, name) VALUES (4, 'd')")
            try store.execute("UPDATE items SET qty = 9 WHERE id = 4")
        }
        #expect(try store.versionVector()[site] == 3)
        try store.execute("SELECT * FROM items")
        try store.execute("UPDATE items SET name = name WHERE id = 1")  // writes nothing new
        #expect(try store.versionVector()[site] == 3)

        let replica = try makeStore()
        try makeItems(replica)
        try sync(store, replica)
        #expect(try rows(replica) == rows(store))
        #expect(try replica.digest() == store.digest())
    }

    @Test func rolledBackWorkIsNeverCaptured() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("BEGIN; INSERT INTO items(id, name) VALUES (1, 'gone'); ROLLBACK")
        try store.execute(
            "BEGIN; INSERT INTO items(id, name) VALUES (2, 'kept'); SAVEPOINT s; "
                + "INSERT INTO items(id, name) VALUES (3, 'undone'); ROLLBACK TO s; RELEASE s; COMMIT"
        )
        // A failing multi-row statement is undone by SQLite, and its captured rows with it.
        #expect(throws: ShoalError.self) {
            try store.execute("INSERT INTO items(id, name) VALUES (4, 'x'), (2, 'duplicate')")
        }
        let replica = try makeStore()
        try makeItems(replica)
        try sync(store, replica)
        #expect(try rows(replica, "SELECT id, name FROM items") == [[.integer(2), .text("kept")]])
        #expect(try replica.digest() == store.digest())
    }

    @Test func updatingAPrimaryKeyIsADeleteAndAnInsert() throws {
        let store = try makeStore()
        try makeItems(store)
        let replica = try makeStore()
        try makeItems(replica)
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        try sync(store, replica)
        try store.execute("UPDATE items SET id = 5 WHERE id = 1")
        try sync(store, replica)
        #expect(try rows(replica, "SELECT id, name FROM items") == [[.integer(5), .text("a")]])
        #expect(try replica.status().tables[0].tombstones == 1)
        #expect(try replica.digest() == store.digest())
    }

    /// `shoal status` counts a table's tombstones from one walk of its clock table's b-tree (the cells of its pages);
    /// checked against plain counts for a rowid clock table and one without rowid (whose interior pages hold rows too),
    /// each large enough to have interior pages.
    @Test func statusCountsRowsAndTombstonesOfEveryKeyShape() throws {
        let directory = try temporaryDirectory("status-counts")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try Store(path: directory.appendingPathComponent("a.db").path)
        try store.execute("CREATE TABLE one(id INTEGER PRIMARY KEY, v BLOB)")
        try store.execute("CREATE TABLE two(a TEXT, b INTEGER, v BLOB, PRIMARY KEY(a, b))")
        try store.replicate(table: "one")
        try store.replicate(table: "two")
        try store.execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20000) "
                + "INSERT INTO one SELECT i, randomblob(40) FROM s"
        )
        try store.execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20000) "
                + "INSERT INTO two SELECT 'key ' || (i % 7), i, randomblob(40) FROM s"
        )
        try store.execute("DELETE FROM one WHERE id % 10 = 3")
        try store.execute("DELETE FROM two WHERE b % 8 = 1")
        let status = try store.status()
        for (name, deleted) in [("one", 2_000), ("two", 2_500)] {
            let table = try #require(status.tables.first { $0.name == name })
            let clockTable = try #require(store.capture.tables.first { $0.name == name }?.clockTable)
            let interior = try store.connection.scalar(
                "SELECT count(*) FROM dbstat WHERE name = ? AND pagetype = 'internal'", [.text(clockTable)]
            )
            #expect(try #require(interior.integerValue) > 0, "\(name): the clock table has interior pages")
            let tracked = try #require(try store.connection.scalar("SELECT count(*) FROM \(clockTable)").integerValue)
            #expect(table.rows == 20_000 - deleted)
            #expect(table.tombstones == deleted)
            #expect(table.rows + table.tombstones == Int(tracked))
            #expect(try #require(table.metadataBytes) >= Int64(tracked) * 3)
        }
    }

    @Test func rowsAlreadyThereBecomeChangesAndCompositeKeysWork() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE pairs(a TEXT, b INTEGER, v, PRIMARY KEY(a, b))")
        try store.execute("INSERT INTO pairs VALUES ('x', 1, 10), ('x', 2, x'00ff'), ('y', 1, NULL)")
        try store.replicate(table: "pairs")
        try store.replicate(table: "pairs")  // idempotent
        try store.execute("UPDATE pairs SET v = 2.5 WHERE a = 'y'")
        let replica = try makeStore()
        try replica.execute("CREATE TABLE pairs(a TEXT, b INTEGER, v, PRIMARY KEY(a, b))")
        try replica.replicate(table: "pairs")
        try sync(store, replica)
        #expect(
            try rows(replica, "SELECT * FROM pairs ORDER BY a, b") == rows(store, "SELECT * FROM pairs ORDER BY a, b")
        )
        #expect(try replica.digest() == store.digest())
    }

    @Test func bulkTransactionsReviveTombstonesAndMixTables() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)")
        try store.replicate(table: "notes")
        let insertNote = try store.prepare("INSERT INTO notes(id, body) VALUES (?, ?)")
        let insertItem = try store.prepare("INSERT INTO items(id, name, hits) VALUES (?, ?, ?)")
        try store.transaction {
            for id in 0..<150 {
                try insertNote.execute([.integer(Int64(id)), .text("first \(id)")])
                try insertItem.execute([.integer(Int64(id)), .text("item"), .integer(2)])
            }
        }
        let replica = try makeStore()
        try makeItems(replica)
        try replica.execute("CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)")
        try replica.replicate(table: "notes")
        try sync(store, replica)
        try store.execute("DELETE FROM notes WHERE id % 2 = 0")
        // Re-insert everything in one transaction: tombstones (even ids) sit inside full insert batches,
        // and keys arrive out of order at the end.
        try store.transaction {
            for id in stride(from: 0, to: 140, by: 2) {
                try insertNote.execute([.integer(Int64(id)), .text("second \(id)")])
            }
            for id in [145, 141, 149, 143] {
                try store.execute("UPDATE notes SET body = 'edited' WHERE id = ?", [.integer(Int64(id))])
            }
            try insertNote.execute([.integer(1_000), .text("late")])
            try insertNote.execute([.integer(140), .text("back")])
        }
        try sync(store, replica)
        #expect(try rows(replica, "SELECT * FROM notes ORDER BY id") == rows(store, "SELECT * FROM notes ORDER BY id"))
        #expect(try rows(replica, "SELECT count(*) FROM notes") == [[.integer(147)]])  // 150, less 142...148 still deleted, plus 1000
        #expect(try replica.digest() == store.digest())
        let notes = store.capture.tables[store.capture.tableNumbers["notes"]!]
        #expect(try store.loadState(table: notes, key: [.integer(2)])?.causalLength == 3)
        #expect(try store.loadState(table: notes, key: [.integer(1)])?.causalLength == 1)
        #expect(try store.loadState(table: notes, key: [.integer(142)])?.causalLength == 2)
    }

    /// A bulk insert's new rows are noted as bare rowids while nothing else was written; every other write of the
    /// same transaction (a failed statement, a statement of two rows, an update or delete of a noted row, a key
    /// out of order, a delete of an older row) still folds as before.
    @Test func aBulkInsertNotedAsBareRowidsMixesWithEveryOtherWriteOfItsTransaction() throws {
        let directory = try temporaryDirectory("capture-bare-rowids")
        let store = try makeFileStore(directory, "a")
        let replica = try makeFileStore(directory, "b")
        for database in [store, replica] {
            try database.execute(
                "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT NOT NULL DEFAULT '' CHECK (length(body) < 20))"
            )
            try database.replicate(table: "notes")
        }
        let insert = try store.prepare("INSERT INTO notes(id, body) VALUES (?, ?)")
        try store.execute("INSERT INTO notes(id, body) VALUES (1000, 'older'), (1001, 'older too')")
        let before = try store.versionVector()[store.siteID]
        try store.transaction {
            for id in 1...300 { try insert.execute([.integer(Int64(id)), .text("n \(id)")]) }
            // The CHECK refuses the statement's second row: SQLite undoes its first, the capture forgets both.
            #expect(throws: ShoalError.self) {
                try store.execute(
                    "INSERT INTO notes(id, body) VALUES (301, 'ok'), (302, 'a body far too long for the check')"
                )
            }
            try store.execute("UPDATE notes SET body = 'edited' WHERE id = 7")
            try store.execute("DELETE FROM notes WHERE id = 9")
            try store.execute("INSERT INTO notes(id, body) VALUES (400, 'a'), (401, 'b')")
            try insert.execute([.integer(350), .text("out of order")])
            try store.execute("DELETE FROM notes WHERE id = 1000")
        }
        #expect(try store.versionVector()[store.siteID] == before + 1)
        let notes = store.capture.tables[store.capture.tableNumbers["notes"]!]
        #expect(try store.loadState(table: notes, key: [.integer(9)]) == nil)
        #expect(try store.loadState(table: notes, key: [.integer(301)]) == nil)
        #expect(try store.loadState(table: notes, key: [.integer(1000)])?.isAlive == false)
        _ = try sync(store, replica)
        let (a, b) = (directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db"))
        #expect(try SQLiteConnection(path: a.path).applicationTableContents()["notes"]?.count == 300 - 1 + 3 + 1)
        #expect(try sameContents(a, b))
        #expect(
            try rows(replica, "SELECT body FROM notes WHERE id IN (7, 350) ORDER BY id")
                == [[.text("edited")], [.text("out of order")]]
        )
        #expect(try replica.digest() == store.digest())
    }

    @Test func untypedKeysAndValuesKeepTheirExactType() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE loose(k PRIMARY KEY, v)")
        try store.replicate(table: "loose")
        try store.execute("INSERT INTO loose VALUES ('1', 1.0), (1, '1'), (x'01', 2.5)")
        let replica = try makeStore()
        try replica.execute("CREATE TABLE loose(k PRIMARY KEY, v)")
        try replica.replicate(table: "loose")
        try sync(store, replica)
        let query = "SELECT k, typeof(k), v, typeof(v) FROM loose ORDER BY typeof(k), k"
        #expect(try rows(replica, query) == rows(store, query))
        #expect(try rows(replica, query).count == 3)
        #expect(try replica.digest() == store.digest())
        try store.execute("UPDATE loose SET v = 3.0 WHERE k = '1'")
        try replica.execute("UPDATE loose SET v = 4.0 WHERE k = '1'")
        try sync(store, replica)
        let logged = try replica.conflicts() + store.conflicts()
        #expect(logged.contains { $0.localValue == .real(4.0) || $0.remoteValue == .real(4.0) })
    }

    @Test func concurrentCounterIncrementsAddUpAndConflictsAreLogged() throws {
        let a = try makeStore()
        let b = try makeStore()
        try makeItems(a)
        try makeItems(b)
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'a', 1)")
        try sync(a, b)
        try a.execute("UPDATE items SET hits = hits + 1, name = 'from a' WHERE id = 1")
        try b.execute("UPDATE items SET hits = hits + 2, name = 'from b' WHERE id = 1")
        try b.execute("UPDATE items SET hits = hits + 2 WHERE id = 1")
        let first = try sync(a, b)
        try sync(b, a)
        #expect(try rows(a) == rows(b))
        #expect(try rows(a, "SELECT hits FROM items") == [[.integer(5)]])
        #expect(try a.digest() == b.digest())
        // One of the two sides recorded the name conflict, with both values.
        let conflicts = try a.conflicts() + b.conflicts()
        #expect(first.conflicts + (try a.conflictCount()) >= 1)
        // The report counts them by table too (the node's metrics do).
        #expect(first.conflictsByTable == (first.conflicts > 0 ? ["items": first.conflicts] : [:]))
        #expect(
            conflicts.contains {
                $0.column == "name" && Set([$0.localValue, $0.remoteValue]) == [.text("from a"), .text("from b")]
            }
        )
        // A causal successor is not a conflict.
        try a.execute("UPDATE items SET name = 'settled' WHERE id = 1")
        #expect(try sync(a, b).conflicts == 0)
    }

    @Test func schemaChangesOfReplicatedTablesAndWritesToMetadataAreRefused() throws {
        let store = try makeStore()
        try makeItems(store)
        for sql in [
            "DROP TABLE items", "ALTER TABLE items RENAME COLUMN name TO label", "ALTER TABLE items DROP COLUMN qty",
            "DELETE FROM shoal_log", "DROP TABLE shoal_meta",
        ] {
            #expect {
                try store.execute(sql)
            } throws: { ($0 as! ShoalError).code == .unsupportedSchema }
        }
    }
}
