import CSQLite
import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

@Suite struct RefusedWriteTests {
    @Test func countersRefuseAnythingButIntegersFromShoalsConnection() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("INSERT INTO items(id, name, hits) VALUES (1, 'a', 9223372036854775807), (2, 'b', 0)")
        let version = try store.versionVector()
        for sql in [
            "UPDATE items SET hits = 'abc' WHERE id = 2",
            "UPDATE items SET hits = hits + 1 WHERE id = 1",  // Int64.max + 1: SQLite makes it a REAL
            "UPDATE items SET hits = NULL WHERE id = 2",
            "UPDATE items SET hits = 2.5 WHERE id = 2",
            "UPDATE items SET hits = x'01' WHERE id = 2",
            "INSERT INTO items(id, name, hits) VALUES (3, 'c', 'many')",
            "INSERT INTO items(id, name, hits) VALUES (3, 'c', NULL)",
        ] {
            var refusal: ShoalError?
            do { try store.execute(sql) } catch { refusal = error }
            #expect(refusal?.code == .counterNotInteger, "\(sql)")
            #expect(refusal?.message.contains("items.hits") == true)
        }
        // In an explicit transaction the whole transaction is rolled back, with or without users' triggers
        // (with one, the counter's own trigger refuses the write; without, the pre-update hook does).
        for withUserTrigger in [false, true] {
            if withUserTrigger {
                try store.execute("CREATE TABLE audit(n)")
                try store.execute(
                    "CREATE TRIGGER mine AFTER UPDATE ON items BEGIN INSERT INTO audit VALUES (NEW.id); END"
                )
            }
            try store.execute("BEGIN")
            try store.execute("UPDATE items SET name = 'undone' WHERE id = 2")
            var refusal: ShoalError?
            do { try store.execute("UPDATE items SET hits = 'x' WHERE id = 2") } catch { refusal = error }
            #expect(refusal?.code == .counterNotInteger)
            #expect(refusal?.message.contains("transaction was rolled back") == true)
            #expect(code { try store.execute("COMMIT") } == .sqlite)  // nothing left to commit
            #expect(try rows(store, "SELECT name, hits FROM items WHERE id = 2") == [[.text("b"), .integer(0)]])
        }
        #expect(try rows(store, "SELECT count(*) FROM audit") == [[.integer(0)]])
        #expect(try rows(store, "SELECT hits FROM items WHERE id = 1") == [[.integer(Int64.max)]])
        #expect(try store.versionVector()[store.siteID] == version[store.siteID])
        // '7' in an INTEGER column is stored as the integer 7: accepted.
        try store.execute("UPDATE items SET hits = '7' WHERE id = 2")
        #expect(
            try rows(store, "SELECT hits, typeof(hits) FROM items WHERE id = 2") == [[.integer(7), .text("integer")]]
        )
    }

    @Test func countersRefuseAnythingButIntegersFromOtherConnections() throws {
        let directory = try temporaryDirectory("counter-foreign")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try makeFileStore(directory, "a")
        try store.execute("INSERT INTO items(id, name, hits) VALUES (1, 'a', 9223372036854775807)")
        let raw = try RawConnection(path: store.path)
        for sql in [
            "UPDATE items SET hits = 'abc'", "UPDATE items SET hits = hits + 1", "UPDATE items SET hits = NULL",
            "UPDATE items SET hits = 2.5", "INSERT INTO items(id, name, hits) VALUES (2, 'b', 1.5)",
        ] {
            #expect(throws: ShoalError.self, "\(sql)") { try raw.exec(sql) }
            let shell = try sqlite3Shell(store.path, sql)
            #expect(shell.status != 0 && shell.stderr.contains("counter column items.hits takes integers only"))
        }
        #expect(try store.captureForeignWrites() == false)
        #expect(try rows(store, "SELECT id, hits FROM items") == [[.integer(1), .integer(Int64.max)]])
    }

    @Test func onlyIntegerColumnsWithAnIntegerDefaultCanBeCounters() throws {
        let store = try makeStore()
        try store.execute(
            "CREATE TABLE c(id INTEGER PRIMARY KEY, t TEXT DEFAULT 0, r REAL DEFAULT 0, bare, nodefault INTEGER, "
                + "ok INTEGER DEFAULT 0, big BIGINT DEFAULT (-1))"
        )
        for column in ["t", "r", "bare", "nodefault"] {
            var refusal: ShoalError?
            do { try store.replicate(table: "c", counters: [column]) } catch { refusal = error }
            #expect(refusal?.code == .unsupportedSchema, "\(column)")
            #expect(refusal?.message.contains("c.\(column)") == true)
        }
        #expect(try store.replicatedTables().isEmpty)
        try store.execute("INSERT INTO c(id, ok) VALUES (1, 'x')")
        #expect(code { try store.replicate(table: "c", counters: ["ok", "big"]) } == .counterNotInteger)
        try store.execute("UPDATE c SET ok = 3")
        try store.replicate(table: "c", counters: ["ok", "big"])
        #expect(try store.replicatedTables() == ["c"])
    }

    @Test func valuesOverTheMaximumAreRefusedFromShoalsConnection() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("CREATE TABLE blobs(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "blobs")
        let maximum = Store.maximumValueBytes
        let version = try store.versionVector()
        for sql in [
            "INSERT INTO blobs VALUES ('a', zeroblob(\(maximum + 1)))",
            "INSERT INTO items(id, name) VALUES (1, CAST(zeroblob(\(maximum + 1)) AS TEXT))",
            "INSERT INTO blobs VALUES (CAST(zeroblob(\(maximum + 1)) AS TEXT), 1)",
        ] {
            var refusal: ShoalError?
            do { try store.execute(sql) } catch { refusal = error }
            #expect(refusal?.code == .valueTooLarge, "\(sql)")
            #expect(refusal?.message.contains("\(maximum + 1) bytes") == true)
        }
        #expect(try rows(store, "SELECT count(*) FROM blobs") == [[.integer(0)]])
        #expect(try rows(store, "SELECT count(*) FROM items") == [[.integer(0)]])
        // An update too; inside a transaction, the whole transaction is undone (SQLite had stored the rows).
        try store.execute("INSERT INTO blobs VALUES ('small', 1)")
        try store.execute("BEGIN")
        try store.execute("INSERT INTO blobs VALUES ('other', 2)")
        #expect(code { try store.execute("UPDATE blobs SET v = zeroblob(\(maximum + 1))") } == .valueTooLarge)
        #expect(try rows(store, "SELECT k, v FROM blobs") == [[.text("small"), .integer(1)]])
        #expect(code { try store.execute("COMMIT") } == .sqlite)  // no transaction is open any more
        #expect(try store.versionVector()[store.siteID] == version[store.siteID] + 1)
        // Exactly the maximum is accepted and captured.
        try store.execute("INSERT INTO blobs VALUES ('max', zeroblob(\(maximum)))")
        #expect(try rows(store, "SELECT length(v) FROM blobs WHERE k = 'max'") == [[.integer(Int64(maximum))]])
        #expect(try store.rowState(table: "blobs", primaryKey: [.text("max")])?.isAlive == true)
    }

    @Test func oversizedArgumentsAndDefaultsAreRefusedToo() throws {
        let store = try makeStore()
        let maximum = Store.maximumValueBytes
        try store.execute("CREATE TABLE blobs(k TEXT PRIMARY KEY, v, d DEFAULT (zeroblob(\(maximum + 1))))")
        try store.execute("CREATE TABLE plain(k)")
        try store.replicate(table: "blobs")
        // A statement that only copies its arguments is checked through its arguments.
        let insert = try store.prepare("INSERT INTO blobs(k, v, d) VALUES (?, ?, 0)")
        #expect(code { try insert.execute([.text("big"), .blob(Array(repeating: 7, count: maximum + 1))]) } == .valueTooLarge)
        try insert.execute([.text("small"), .blob([1, 2, 3])])
        // A default computed by an expression is checked on every insert.
        #expect(code { try store.execute("INSERT INTO blobs(k, v) VALUES ('default', 1)") } == .valueTooLarge)
        // Unreplicated tables take anything SQLite does.
        try store.execute("INSERT INTO plain VALUES (zeroblob(\(maximum + 1)))")
        #expect(try rows(store, "SELECT k FROM blobs") == [[.text("small")]])
    }

    @Test func valuesOverTheMaximumAreRefusedFromOtherConnections() throws {
        let directory = try temporaryDirectory("size-foreign")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try makeFileStore(directory, "a")
        let raw = try RawConnection(path: store.path)
        let maximum = Store.maximumValueBytes
        try raw.exec("INSERT INTO pairs VALUES ('small', 1, 1)")
        for sql in [
            "INSERT INTO pairs VALUES ('a', 1, zeroblob(\(maximum + 1)))",
            "UPDATE pairs SET v = CAST(zeroblob(\(maximum + 1)) AS TEXT)",
        ] {
            #expect(throws: ShoalError.self, "\(sql)") { try raw.exec(sql) }
        }
        let shell = try sqlite3Shell(store.path, "INSERT INTO items(id, name) VALUES (5, zeroblob(\(maximum + 1)))")
        #expect(shell.status != 0 && shell.stderr.contains("larger than the maximum of \(maximum) bytes"))
        try raw.exec("INSERT INTO pairs VALUES ('max', 1, zeroblob(\(maximum)))")
        #expect(try store.captureForeignWrites())
        #expect(
            try rows(store, "SELECT a, length(v) FROM pairs ORDER BY a") == [
                [.text("max"), .integer(Int64(maximum))], [.text("small"), .integer(1)],
            ]
        )
        #expect(try store.rowState(table: "pairs", primaryKey: [.text("max"), .integer(1)])?.isAlive == true)
    }

    @Test func valuesOfTwentyAndSixtyFourMegabytesAreCapturedAndReplicated() throws {
        let directory = try temporaryDirectory("size-big")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO pairs VALUES ('own', 20, randomblob(20000000))")
        try RawConnection(path: a.path).exec("INSERT INTO pairs VALUES ('foreign', 64, randomblob(64000000))")
        try sync(a, b)
        let query = "SELECT a, b, length(v), hex(substr(v, 1, 16)), hex(substr(v, -16)) FROM pairs ORDER BY a"
        #expect(try rows(b, query) == rows(a, query))
        #expect(try rows(b, query).count == 2)
        #expect(try b.digest() == a.digest())
    }
}
