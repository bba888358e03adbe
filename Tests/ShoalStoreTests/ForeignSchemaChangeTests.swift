import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// A replicated table altered destructively or dropped by another tool (the `sqlite3` shell) pauses that table, with
/// a message saying what changed and what to do; every command keeps working, every other table keeps flowing both
/// ways, changes for the paused table are held (not refused), nothing is damaged, and `shoal unreplicate` is the way
/// out. (A column added is a schema change that replicates: SchemaEvolutionTests.)
@Suite struct ForeignSchemaChangeTests {
    enum Change: String, CaseIterable, CustomStringConvertible {
        case dropColumn, renameColumn, renameTable, dropTable

        var sql: String {
            switch self {
            case .dropColumn: "ALTER TABLE items DROP COLUMN note"
            case .renameColumn: "ALTER TABLE items RENAME COLUMN note TO remark"
            case .renameTable: "ALTER TABLE items RENAME TO things"
            case .dropTable: "DROP TABLE items"
            }
        }

        /// Words the pause message must contain.
        var described: String {
            switch self {
            case .dropColumn: "column note was dropped"
            case .renameColumn: "column note was renamed to remark"
            case .renameTable, .dropTable: "the table is gone"
            }
        }

        /// The table's name afterwards, if it still exists.
        var tableAfter: String? {
            switch self {
            case .renameTable: "things"
            case .dropTable: nil
            default: "items"
            }
        }

        var description: String { rawValue }
    }

    @Test(arguments: Change.allCases)
    func foreignDDLPausesOnlyThatTableAndUnreplicateIsTheWayOut(_ change: Change) throws {
        let directory = try temporaryDirectory("ddl")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        let peer = directory.appendingPathComponent("b.db").path
        for path in [db, peer] {
            #expect(try shoal("init", "--db", path).status == 0)
            #expect(
                try shoal(
                    "sql",
                    "--db",
                    path,
                    "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, note BLOB, qty REAL DEFAULT 0); "
                        + "CREATE TABLE notes(k TEXT PRIMARY KEY, body TEXT)"
                ).status == 0
            )
            #expect(try shoal("replicate", "--db", path, "items").status == 0)
            #expect(try shoal("replicate", "--db", path, "notes").status == 0)
        }
        // Realistic rows: a few KB of text, a blob of 100 KB, TEXT with a NUL.
        let insert = try shoal(
            "sql",
            "--db",
            db,
            "WITH RECURSIVE n(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM n WHERE value < 200) "
                + "INSERT INTO items(id, name, note, qty) SELECT value, printf('%.*c', 3000, 'x'), "
                + "randomblob(CASE WHEN value = 1 THEN 100000 ELSE 64 END), value * 1.5 FROM n; "
                + "INSERT INTO notes(k, body) VALUES ('a' || char(0) || 'b', 'x' || char(0) || 'y'), ('plain', 'text')"
        )
        #expect(insert.status == 0, "\(insert.stderr)")
        let itemsBefore = try sqlite3Shell(db, "SELECT count(*), sum(length(name)), sum(length(note)) FROM items")
            .stdout

        let ddl = try sqlite3Shell(db, change.sql)
        if change == .dropColumn {
            // The capture triggers name every column, so SQLite itself refuses to drop one: nothing changes.
            #expect(ddl.status != 0 && ddl.stderr.contains("shoal_capture"), "\(ddl.stderr)")
            let status = try shoal("status", "--db", db)
            #expect(status.status == 0 && !status.stdout.contains("paused"), "\(status.stdout)")
            #expect(try sqlite3Shell(db, "SELECT count(*), sum(length(name)), sum(length(note)) FROM items").stdout
                == itemsBefore)
            return
        }
        #expect(ddl.status == 0, "\(ddl.stderr)")

        // Every command still works.
        let status = try shoal("status", "--db", db)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("paused"))
        #expect(status.stdout.contains("replication of table items is paused: \(change.described)"))
        #expect(status.stdout.contains("shoal unreplicate items"))
        #expect(status.stdout.contains("notes: 2 rows"))
        let json = try shoal("status", "--db", db, "--json")
        #expect(json.status == 0)
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let paused = object?["paused_tables"] as? [[String: Any]]
        #expect(paused?.count == 1 && paused?.first?["name"] as? String == "items")

        #expect(try shoal("sql", "--db", db, "SELECT 1").status == 0)
        let otherWrite = try shoal("sql", "--db", db, "INSERT INTO notes(k, body) VALUES ('after', 'still replicated')")
        #expect(otherWrite.status == 0, "\(otherWrite.stderr)")
        if let table = change.tableAfter, table == "items" {
            // Writes through Shoal to the paused table are refused (they could not be replicated), reads work.
            let write = try shoal("sql", "--db", db, "UPDATE \(table) SET name = 'lost?' WHERE id = 2")
            #expect(write.status != 0)
            #expect(write.stderr.contains("paused"))
            #expect(try shoal("sql", "--db", db, "SELECT count(*) FROM \(table)").stdout.contains("200"))
        }

        let changes = try shoal("changes", "--db", db)
        #expect(changes.status == 0, "\(changes.stderr)")
        #expect(changes.stdout.contains("\"notes\""))
        #expect(!changes.stdout.contains("\"items\""), "a paused table is not sent")
        let digest = try shoal("digest", "--db", db, "--full")
        #expect(digest.status == 0, "\(digest.stderr)")
        #expect(digest.stdout.contains("rows: 3"), "the digest covers notes only: \(digest.stdout)")
        #expect(try shoal("compact", "--db", db).status == 0)
        let replicateAgain = try shoal("replicate", "--db", db, "items")
        #expect(replicateAgain.status != 0 && replicateAgain.stderr.contains("is paused"), "\(replicateAgain.stderr)")
        #expect(try shoal("conflicts", "--db", db).status == 0)

        // Apply: the peer's notes come in; a stream holding the paused table's rows applies too, those rows held.
        let peerNotes = try shoal("sql", "--db", peer, "INSERT INTO notes(k, body) VALUES ('from b', 'hello')")
        #expect(peerNotes.status == 0)
        let stream = directory.appendingPathComponent("b.jsonl").path
        try shoal("changes", "--db", peer).stdout.write(toFile: stream, atomically: true, encoding: .utf8)
        let applied = try shoal("apply", "--db", db, stream)
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(try shoal("sql", "--db", db, "SELECT body FROM notes WHERE k = 'from b'").stdout.contains("hello"))
        #expect(try shoal("sql", "--db", peer, "INSERT INTO items(id, name) VALUES (999, 'from b')").status == 0)
        try shoal("changes", "--db", peer).stdout.write(toFile: stream, atomically: true, encoding: .utf8)
        let held = try shoal("apply", "--db", db, stream)
        #expect(held.status == 0, "\(held.stderr)")
        #expect(try Store(path: db).heldChanges()["items"] ?? 0 > 0)

        // Nothing was damaged: the paused table's rows are as they were.
        if change == .renameColumn || change == .renameTable {
            let after = try sqlite3Shell(
                db,
                "SELECT count(*), sum(length(name)), sum(length(\(change == .renameColumn ? "remark" : "note"))) "
                    + "FROM \(change.tableAfter!)"
            ).stdout
            #expect(after == itemsBefore)
        }

        // The way out: unreplicate keeps the table and its rows; then it can be replicated again.
        let unreplicate = try shoal("unreplicate", "--db", db, "items")
        #expect(unreplicate.status == 0, "\(unreplicate.stderr)")
        let cleared = try shoal("status", "--db", db)
        #expect(!cleared.stdout.contains("paused"))
        #expect(!cleared.stdout.contains("  items: "), "no longer among the tables (what peers sent for it stays held)")
        #expect(try shoal("unreplicate", "--db", db, "items").status != 0, "it is no longer replicated")
        if let table = change.tableAfter {
            #expect(try shoal("sql", "--db", db, "SELECT count(*) FROM \(table)").stdout.contains("200"))
            let again = try shoal("replicate", "--db", db, table)
            #expect(again.status == 0, "\(again.stderr)")
            #expect(try shoal("sql", "--db", db, "UPDATE \(table) SET name = 'after' WHERE id = 2").status == 0)
            let digestAfter = try shoal("digest", "--db", db, "--full")
            #expect(digestAfter.status == 0, "\(digestAfter.stderr)")
            // The peer's row held while the table was paused is merged once it is replicated under its name again;
            // and replicated on a database that syncs with others, the table is a schema change (one more row).
            let rowsAfter = change == .renameColumn ? 206 : 205
            #expect(digestAfter.stdout.contains("rows: \(rowsAfter)"), "\(digestAfter.stdout)")
            let changesAfter = try shoal("changes", "--db", db).stdout
            #expect(changesAfter.contains("\"\(table)\""))
        } else {
            #expect(try shoal("digest", "--db", db, "--full").status == 0)
        }
        // The local sequence never went backwards: a new write gets a new dot peers have not seen.
        let vector = try Store(path: db).versionVector()
        #expect(vector[try Store(path: db).siteID] >= 3)
    }

    @Test func restoringTheShapeResumesReplication() throws {
        let directory = try temporaryDirectory("ddl-undo")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        let store = try Store(path: db)
        try store.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT)")
        try store.replicate(table: "items")
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        let fingerprint = try store.schemaFingerprint()
        #expect(try sqlite3Shell(db, "CREATE UNIQUE INDEX items_name ON items(name)").status == 0)
        // Peers are not turned away over a local pause: the fingerprint is the one the table was replicated with.
        #expect(try store.schemaFingerprint() == fingerprint)
        let paused = try store.pausedTables()
        #expect(paused.map(\.name) == ["items"])
        #expect(try store.replicatedTables().isEmpty)
        // Read while paused: the row written before the pause waits to be folded in once the table resumes.
        #expect(try store.digest().rowCount == 0)
        #expect(throws: ShoalError.self) { try store.execute("INSERT INTO items(id, name) VALUES (2, 'two')") }
        #expect(try sqlite3Shell(db, "DROP INDEX items_name").status == 0)
        #expect(try store.pausedTables().isEmpty)
        try store.execute("INSERT INTO items(id, name) VALUES (2, 'two')")
        #expect(try store.digest() == store.fullScanDigest())
        #expect(try store.digest().rowCount == 2)
    }

    @Test func aUniqueIndexOrARebuildByAnotherToolPausesTheTable() throws {
        let directory = try temporaryDirectory("ddl-unique")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        #expect(try shoal("init", "--db", db).status == 0)
        #expect(try shoal("sql", "--db", db, "CREATE TABLE t(id INTEGER PRIMARY KEY, email TEXT, name TEXT)").status == 0)
        #expect(try shoal("replicate", "--db", db, "t").status == 0)
        #expect(try shoal("sql", "--db", db, "INSERT INTO t VALUES (1, 'a@x', 'A')").status == 0)

        // A unique index could make an apply's REPLACE delete another row unseen: the table pauses.
        #expect(try sqlite3Shell(db, "CREATE UNIQUE INDEX by_email ON t(email)").status == 0)
        var status = try shoal("status", "--db", db)
        #expect(status.stdout.contains("has a unique constraint (by_email)"), "\(status.stdout)")
        #expect(try shoal("sql", "--db", db, "INSERT INTO t VALUES (2, 'b@x', 'B')").status != 0)
        #expect(try sqlite3Shell(db, "DROP INDEX by_email").status == 0)
        status = try shoal("status", "--db", db)
        #expect(!status.stdout.contains("paused"), "dropping the index resumes it: \(status.stdout)")

        // A rebuild (copy, drop, rename) takes the capture triggers with the old table: the table pauses rather
        // than miss the writes made after it.
        let rebuild =
            "BEGIN; CREATE TABLE t2(id INTEGER PRIMARY KEY, email TEXT, name TEXT); INSERT INTO t2 SELECT * FROM t; "
            + "DROP TABLE t; ALTER TABLE t2 RENAME TO t; COMMIT; INSERT INTO t VALUES (3, 'c@x', 'C')"
        #expect(try sqlite3Shell(db, rebuild).status == 0)
        status = try shoal("status", "--db", db)
        #expect(status.stdout.contains("dropped and created again by another tool"), "\(status.stdout)")
        #expect(try shoal("unreplicate", "--db", db, "t").status == 0)
        #expect(try shoal("replicate", "--db", db, "t").status == 0)
        let changes = try shoal("changes", "--db", db).stdout
        #expect(changes.contains("c@x"), "the row written after the rebuild is replicated once resolved")
    }
}
