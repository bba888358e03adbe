import CSQLite
import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// A plain SQLite connection, as an application with its own driver would open the file.
final class RawConnection {
    let handle: OpaquePointer

    init(path: String) throws {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let handle else {
            throw ShoalError(code: .sqlite, message: "cannot open \(path)")
        }
        self.handle = handle
        sqlite3_busy_timeout(handle, 10_000)
    }

    deinit { sqlite3_close_v2(handle) }

    /// Runs SQL; throws SQLite's message on failure.
    func exec(_ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &message)
        defer { sqlite3_free(message) }
        guard code == SQLITE_OK else {
            throw ShoalError(code: .sqlite, message: message.map { String(cString: $0) } ?? "SQLite error \(code)")
        }
    }

    /// Inserts `count` rows into items in one transaction with a prepared statement.
    func insertItems(_ range: Range<Int>) throws {
        try exec("BEGIN")
        var statement: OpaquePointer?
        guard
            sqlite3_prepare_v2(handle, "INSERT INTO items(id, name, qty) VALUES (?, ?, ?)", -1, &statement, nil)
                == SQLITE_OK
        else { throw ShoalError(code: .sqlite, message: String(cString: sqlite3_errmsg(handle))) }
        defer { sqlite3_finalize(statement) }
        for id in range {
            sqlite3_bind_int64(statement, 1, Int64(id))
            sqlite3_bind_text(statement, 2, "row \(id)", -1, SQLITE_TRANSIENT)
            sqlite3_bind_int64(statement, 3, Int64(id % 13))
            guard sqlite3_step(statement) == SQLITE_DONE else {
                throw ShoalError(code: .sqlite, message: String(cString: sqlite3_errmsg(handle)))
            }
            sqlite3_reset(statement)
        }
        try exec("COMMIT")
    }
}

/// A file database with the items table (counter `hits`) and a composite-key table, replicated.
func makeFileStore(_ directory: URL, _ name: String) throws -> Store {
    let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
    try makeItems(store)
    try store.execute("CREATE TABLE pairs(a TEXT, b INTEGER, v, PRIMARY KEY(a, b)) WITHOUT ROWID")
    try store.replicate(table: "pairs")
    return store
}

func outboxRows(_ store: Store) throws -> Int {
    var total = 0
    for table in store.capture.tables {
        if case .integer(let count) = try store.execute("SELECT count(*) FROM \(Store.outboxTable(table.id))").rows[0][
            0
        ] {
            total += Int(count)
        }
    }
    return total
}

@Suite struct ForeignWriteTests {
    @Test func theSqlite3ShellsWritesReachAnotherDatabaseThroughChangesAndApply() throws {
        let directory = try temporaryDirectory("foreign-shell")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (100, 'own', 1)")
        let shellWrites = [
            "INSERT INTO items(id, name, qty, hits) VALUES (1, 'one', 1, 3), (2, 'two', 2, 0), (3, 'three', 3, 7)",
            "UPDATE items SET name = 'uno', hits = hits + 4 WHERE id = 1",
            "DELETE FROM items WHERE id = 3",
            "UPDATE items SET id = 20 WHERE id = 2",
            "BEGIN; INSERT INTO pairs VALUES ('x', 1, randomblob(5000)), ('x', 2, 2.5), ('y', 1, NULL), "
                + "('z', -9223372036854775808, 9223372036854775807); UPDATE items SET qty = qty * 10; "
                + "DELETE FROM pairs WHERE a = 'y'; UPDATE pairs SET a = 'w' WHERE a = 'z'; COMMIT",
            "UPDATE items SET name = 'own, edited' WHERE id = 100",
            "INSERT OR REPLACE INTO items(id, name, hits) VALUES (1, 'replaced', 10)",
        ]
        for sql in shellWrites {
            let result = try sqlite3Shell(a.path, sql)
            #expect(result.status == 0, "\(sql): \(result.stderr)")
        }
        let shoal = try shoalExecutable()
        let changes = try runProcess(shoal, ["changes", "--db", a.path])
        #expect(changes.status == 0, "\(changes.stderr)")
        let applied = try runProcess(shoal, ["apply", "--db", b.path], input: Data(changes.stdout.utf8))
        #expect(applied.status == 0, "\(applied.stderr)")
        let digestA = try runProcess(shoal, ["digest", "--db", a.path]).stdout
        let digestB = try runProcess(shoal, ["digest", "--db", b.path]).stdout
        #expect(digestA == digestB && digestA.contains("rows:"))
        let query = "SELECT id, name, qty, hits FROM items ORDER BY id"
        #expect(try rows(b, query) == rows(a, query))
        #expect(
            try rows(b, query) == [
                [.integer(1), .text("replaced"), .integer(0), .integer(10)],
                [.integer(20), .text("two"), .integer(20), .integer(0)],
                [.integer(100), .text("own, edited"), .integer(10), .integer(0)],
            ]
        )
        let pairs = "SELECT a, b, v, typeof(v) FROM pairs ORDER BY a, b"
        #expect(try rows(b, pairs) == rows(a, pairs))
        #expect(try rows(b, pairs).count == 3)
        // The replaced row's counter moved from 7 to 10 on a: b holds the same count, not 7 + 10.
        #expect(try b.digest() == a.digest())
        #expect(try outboxRows(a) == 0)
    }

    @Test func aSecondConnectionsTransactionIsOneDotAndRolledBackWorkLeavesNothing() throws {
        let directory = try temporaryDirectory("foreign-raw")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let raw = try RawConnection(path: a.path)
        try raw.exec("BEGIN; INSERT INTO items(id, name) VALUES (1, 'gone'); ROLLBACK")
        #expect(try a.captureForeignWrites() == false)
        #expect(try a.versionVector()[a.siteID] == 0)

        // One transaction over two tables, with an update of a row it inserted: one dot, not split.
        try raw.exec(
            "BEGIN; INSERT INTO items(id, name) VALUES (1, 'a'), (2, 'b'); INSERT INTO pairs VALUES ('k', 1, 'v'); "
                + "UPDATE items SET name = 'a2' WHERE id = 1; COMMIT"
        )
        #expect(try a.captureForeignWrites())
        #expect(try a.versionVector()[a.siteID] == 1)
        #expect(try rows(a, "SELECT count(*) FROM shoal_log WHERE site = 1 AND seq = 1") == [[.integer(2)]])
        #expect(try a.captureForeignWrites() == false)

        let b = try makeFileStore(directory, "b")
        try sync(a, b)
        #expect(try rows(b) == rows(a))
        #expect(try b.digest() == a.digest())
    }

    @Test func aForeignTransactionOfAHundredThousandRowsIsOneChangeSet() throws {
        let directory = try temporaryDirectory("foreign-bulk")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        try a.execute("INSERT INTO items(id, name) VALUES (-1, 'before')")
        try RawConnection(path: a.path).insertItems(0..<100_000)
        #expect(try a.captureForeignWrites())
        #expect(try a.versionVector()[a.siteID] == 2)
        #expect(try rows(a, "SELECT count(*) FROM shoal_log WHERE site = 1 AND seq = 2") == [[.integer(1)]])
        #expect(try rows(a, "SELECT count(*) FROM shoal_clock_1") == [[.integer(100_001)]])
        let items = a.capture.tables[a.capture.tableNumbers["items"]!]
        for id in [0, 54_321, 99_999] {
            let state = try a.loadState(table: items, key: [.integer(Int64(id))])
            #expect(state?.isAlive == true && state?.holds(Dot(site: a.siteID, seq: 2)) == true)
        }
        #expect(try outboxRows(a) == 0)
    }

    @Test func aTableWithOneColumnBesidesItsKeyTakesForeignUpdates() throws {
        // Key-value tables: the outbox's change mask of a single column is one comparison.
        let directory = try temporaryDirectory("foreign-kv")
        defer { try? FileManager.default.removeItem(at: directory) }
        var stores: [Store] = []
        for name in ["a", "b"] {
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v TEXT)")
            try store.replicate(table: "kv")
            stores.append(store)
        }
        let (a, b) = (stores[0], stores[1])
        for sql in ["INSERT INTO kv VALUES ('x', '1'), ('y', '1')", "UPDATE kv SET v = '2' WHERE k = 'x'"] {
            #expect(try sqlite3Shell(a.path, sql).status == 0)
        }
        for batch in try a.changes(since: b.versionVector()) { try b.apply(batch.changes, claim: batch.claim) }
        #expect(try rows(b, "SELECT * FROM kv ORDER BY k") == [[.text("x"), .text("2")], [.text("y"), .text("1")]])
        #expect(try a.digest() == b.digest())
    }

    @Test func aForeignCounterWriteOfInt64MinIsCountedNotACrash() throws {
        let directory = try temporaryDirectory("foreign-min")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'x')")
        #expect(try sqlite3Shell(a.path, "UPDATE items SET hits = -9223372036854775808 WHERE id = 1").status == 0)
        for batch in try a.changes(since: b.versionVector()) { try b.apply(batch.changes, claim: batch.claim) }
        #expect(try rows(b, "SELECT hits FROM items") == [[.integer(.min)]])
        #expect(try a.digest() == b.digest())
    }

    @Test func aForeignDeleteThenAPeersUpdateKeepsTheRowDeletedOnBoth() throws {
        let directory = try temporaryDirectory("foreign-delete")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'kept'), (2, 'doomed')")
        try sync(a, b)
        #expect(try sqlite3Shell(a.path, "DELETE FROM items WHERE id = 2").status == 0)
        try b.execute("UPDATE items SET name = 'edited on b', hits = hits + 1 WHERE id = 2")
        try sync(a, b)
        try sync(b, a)
        let expected: [[SQLValue]] = [[.integer(1), .text("kept")]]
        #expect(try rows(a, "SELECT id, name FROM items ORDER BY id") == expected)
        #expect(try rows(b, "SELECT id, name FROM items ORDER BY id") == expected)
        #expect(try a.digest() == b.digest())
    }

    @Test func foreignAndOwnWritesInterleavedOnOneRowConverge() throws {
        let directory = try temporaryDirectory("foreign-interleave")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        let raw = try RawConnection(path: a.path)
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'own', 1)")
        try raw.exec("UPDATE items SET name = 'foreign', hits = hits + 2 WHERE id = 1")
        // Not drained yet: the store's own transaction stamps the foreign write first, then its own.
        try a.execute("UPDATE items SET name = 'own again', qty = qty + 1, hits = hits + 3 WHERE id = 1")
        try raw.exec("UPDATE items SET qty = 40 WHERE id = 1")
        try sync(a, b)
        try raw.exec("DELETE FROM items WHERE id = 1")
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'reborn')")
        try raw.exec("UPDATE items SET hits = hits + 5 WHERE id = 1")
        // The foreign delete, committed before the store's re-insert, is a change set of its own, stamped first: the
        // re-insert begins a new life of the row.
        #expect(try rows(a) == [[.integer(1), .text("reborn"), .integer(0), .integer(5)]])
        try b.execute("UPDATE items SET qty = 7, hits = hits + 1 WHERE id = 1")  // concurrent with all of that
        try sync(a, b)
        try sync(b, a)
        #expect(try rows(a) == rows(b))
        // b's update was to the life the delete ended: the delete wins over it, and the new life keeps only its own.
        #expect(try rows(a) == [[.integer(1), .text("reborn"), .integer(0), .integer(5)]])
        #expect(try a.digest() == b.digest())
        #expect(try outboxRows(a) == 0)
    }

    @Test func upsertsIgnoredInsertsAndReplacesKeepCountersExact() throws {
        let directory = try temporaryDirectory("foreign-upsert")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, hits) VALUES (1, 'a', 5), (2, 'b', 1)")
        try sync(a, b)
        let raw = try RawConnection(path: a.path)
        // The BEFORE INSERT note of the existing row is dropped when no insert of that key follows.
        try raw.exec("INSERT OR IGNORE INTO items(id, name, hits) VALUES (1, 'ignored', 100)")
        try raw.exec(
            "INSERT INTO items(id, name, hits) VALUES (2, 'x', 0) "
                + "ON CONFLICT(id) DO UPDATE SET hits = hits + 10, name = 'upserted'"
        )
        try raw.exec("REPLACE INTO items(id, name, hits) VALUES (1, 'replaced', 2)")
        try b.execute("UPDATE items SET hits = hits + 1 WHERE id IN (1, 2)")  // concurrent increments
        try sync(a, b)
        try sync(b, a)
        let expected: [[SQLValue]] = [
            [.integer(1), .text("replaced"), .integer(3)], [.integer(2), .text("upserted"), .integer(12)],
        ]
        #expect(try rows(a, "SELECT id, name, hits FROM items ORDER BY id") == expected)
        #expect(try rows(b, "SELECT id, name, hits FROM items ORDER BY id") == expected)
        #expect(try a.digest() == b.digest())
    }

    @Test func remoteChangesAppliedByShoalDoNotEchoIntoTheOutbox() throws {
        let directory = try temporaryDirectory("foreign-echo")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, hits) VALUES (1, 'x', 4), (2, 'y', 0)")
        try a.execute("DELETE FROM items WHERE id = 2")
        try sync(a, b)
        #expect(try outboxRows(b) == 0)
        #expect(try b.captureForeignWrites() == false)
        #expect(try b.versionVector()[b.siteID] == 0)
    }

    @Test func databasesReplicatedBeforeTheOutboxGetItsTriggersOnOpen() throws {
        let directory = try temporaryDirectory("foreign-migrate")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("old.db").path
        do {
            let store = try makeFileStore(directory, "old")
            try store.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        }
        // Remove the triggers and their mark as an earlier version would have left the file.
        let raw = try RawConnection(path: path)
        try raw.exec(
            "DELETE FROM shoal_meta WHERE key = 'capture_triggers'; "
                + (try sqlite3Shell(path, "SELECT name FROM sqlite_schema WHERE type = 'trigger'").stdout)
                .split(separator: "\n").map { "DROP TRIGGER \($0);" }.joined()
        )
        let store = try Store(path: path)
        try raw.exec("INSERT INTO items(id, name) VALUES (2, 'b')")
        #expect(try store.captureForeignWrites())
        #expect(try store.rowState(table: "items", primaryKey: [.integer(2)])?.isAlive == true)
    }

    @Test func usersCannotChangeShoalsTriggersThroughTheStore() throws {
        let store = try makeStore()
        try makeItems(store)
        for sql in [
            "DROP TRIGGER shoal_capture_1_insert", "CREATE TRIGGER shoal_x AFTER INSERT ON items BEGIN SELECT 1; END",
        ] {
            #expect {
                try store.execute(sql)
            } throws: { ($0 as! ShoalError).code == .unsupportedSchema }
        }
        // Users' own triggers still fire on Shoal's connection, TEMP ones too.
        try store.execute("CREATE TABLE audit(n)")
        try store.execute(
            "CREATE TEMP TRIGGER scratch AFTER INSERT ON items BEGIN INSERT INTO audit VALUES (-NEW.id); END"
        )
        try store.execute("INSERT INTO items(id, name) VALUES (6, 'x')")
        try store.execute("CREATE TRIGGER mine AFTER INSERT ON items BEGIN INSERT INTO audit VALUES (NEW.id); END")
        try store.execute("INSERT INTO items(id, name) VALUES (7, 'x')")
        #expect(try rows(store, "SELECT n FROM audit ORDER BY n") == [[.integer(-7)], [.integer(-6)], [.integer(7)]])
    }

    @Test func aTriggerCreatedByAnotherConnectionFiresOnShoalsWrites() throws {
        let directory = try temporaryDirectory("foreign-trigger")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try makeFileStore(directory, "a")
        try store.execute("CREATE TABLE audit(n)")
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'before')")
        let created = try sqlite3Shell(
            store.path,
            "CREATE TRIGGER mine AFTER UPDATE ON items BEGIN INSERT INTO audit VALUES (NEW.id); END"
        )
        #expect(created.status == 0)
        try store.execute("UPDATE items SET name = 'after' WHERE id = 1")
        #expect(try rows(store, "SELECT n FROM audit") == [[.integer(1)]])
        #expect(try outboxRows(store) == 0)  // Shoal's own capture triggers still skip its connection
        #expect(try sqlite3Shell(store.path, "DROP TRIGGER mine").status == 0)
        try store.execute("UPDATE items SET name = 'again' WHERE id = 1")
        #expect(try rows(store, "SELECT n FROM audit") == [[.integer(1)]])
    }
}
