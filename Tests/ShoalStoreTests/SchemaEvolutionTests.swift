import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// Schema changes as change sets: a column added on one node reaches the others in order with the data; a node
/// that has not added it yet keeps syncing, holds and forwards its values, and replays them when it appears.
@Suite struct SchemaEvolutionTests {
    /// Three stores on files (so that their rows can be compared outside Shoal), each with `items` replicated.
    private func threeStores(_ directory: URL, manual: Set<String> = []) throws -> [String: Store] {
        var stores: [String: Store] = [:]
        for name in ["a", "b", "c"] {
            var options = StoreOptions()
            options.clock = ManualWallClock(milliseconds: 1_700_000_000_000)
            if manual.contains(name) { options.schemaChanges = .manual }
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path, options: options)
            try store.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER DEFAULT 0)")
            try store.replicate(table: "items")
            stores[name] = store
        }
        return stores
    }

    private func contents(_ directory: URL, _ name: String) throws -> [String: [String]] {
        try SQLiteConnection(path: directory.appendingPathComponent("\(name).db").path).applicationTableContents()
    }

    @Test func aColumnAddedOnOneNodeIsHeldForwardedAndReplayedWhereItIsMissing() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory, manual: ["b"])
        let (a, b, c) = (stores["a"]!, stores["b"]!, stores["c"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two'), (3, 'three')")
        try sync(a, b)
        try sync(a, c)

        // A adds a column through Shoal and writes it; B keeps writing the columns it has.
        #expect(try a.execute("ALTER TABLE items ADD COLUMN colour TEXT DEFAULT 'grey'").rows.isEmpty)
        try a.execute("UPDATE items SET colour = 'red' WHERE id = 1")
        try a.execute("INSERT INTO items(id, name, colour) VALUES (4, 'four', 'blue')")
        try b.execute("UPDATE items SET qty = 7 WHERE id = 2")

        // B follows schema changes by hand: it keeps syncing, holds A's values for the column it lacks.
        try sync(a, b)
        try sync(b, a)
        #expect(try b.execute("SELECT id, name FROM items WHERE id = 4").rows == [[.integer(4), .text("four")]])
        #expect(try b.heldChanges()["items"] ?? 0 >= 2)
        #expect(try b.schemaPosition().pending == ["items.colour"])
        #expect(try a.execute("SELECT qty FROM items WHERE id = 2").rows == [[.integer(7)]])

        // C syncs only through B: it gets the schema change and the values B holds, verbatim.
        try sync(b, c)
        #expect(try c.execute("SELECT id, colour FROM items ORDER BY id").rows == [
            [.integer(1), .text("red")], [.integer(2), .text("grey")], [.integer(3), .text("grey")],
            [.integer(4), .text("blue")],
        ])
        #expect(try c.heldChanges().isEmpty)

        // B's app migrates: its identical ALTER is the same change, and the held values are replayed.
        let before = try b.versionVector()[b.siteID]
        try b.execute("ALTER TABLE items ADD COLUMN colour TEXT DEFAULT 'grey'")
        #expect(try b.versionVector()[b.siteID] == before)
        #expect(try b.heldChanges().isEmpty)
        #expect(try b.schemaConflicts().isEmpty)

        for (from, to) in [(a, b), (b, c), (c, a), (a, c)] { try sync(from, to) }
        #expect(try a.digest() == b.digest())
        #expect(try b.digest() == c.digest())
        #expect(try a.fullScanDigest() == a.digest())
        #expect(try b.fullScanDigest() == b.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
        #expect(try contents(directory, "b") == contents(directory, "c"))
    }

    @Test func twoColumnsAddedAtOnceOnTwoNodesLeaveTheSameDigestAfterEveryWrite() throws {
        // b adds x1 and c adds x2 before either hears of the other: b holds (…, x1, x2), c (…, x2, x1). A row's hash
        // took its columns in the table's order, so once a write set both, the two digests differed for good (found
        // through the dashboard's "add a column" on two nodes at once).
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b, c) = (stores["a"]!, stores["b"]!, stores["c"]!)
        let all = [a, b, c]
        func syncAll() throws {
            for _ in 0..<2 { for from in all { for to in all where to !== from { try sync(from, to) } } }
        }
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        try syncAll()
        try b.execute("ALTER TABLE items ADD COLUMN x1 TEXT DEFAULT 'new'")
        try c.execute("ALTER TABLE items ADD COLUMN x2 TEXT DEFAULT 'new'")
        try syncAll()
        func order(_ store: Store) throws -> [String] {
            try store.execute("SELECT name FROM pragma_table_info('items') ORDER BY cid").rows.compactMap {
                if case .text(let name) = $0[0] { name } else { nil }
            }
        }
        #expect(try order(b) != order(c), "the two nodes hold the columns in the same order: the case is not made")
        try a.execute("UPDATE items SET qty = 10, x1 = 'b', x2 = 'c' WHERE id = 1")
        try b.execute("UPDATE items SET x2 = 'from b' WHERE id = 2")
        try c.execute("INSERT INTO items(id, name, x1, x2) VALUES (3, 'three', 'p', 'q')")
        try syncAll()
        for store in all { #expect(try store.fullScanDigest() == store.digest()) }
        #expect(try a.digest() == b.digest())
        #expect(try b.digest() == c.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
        #expect(try contents(directory, "b") == contents(directory, "c"))
        #expect(try contents(directory, "c")["items"]?.contains { $0.contains("x2=text:" + hex("from b")) } == true)
    }

    private func hex(_ text: String) -> String { text.utf8.map { String(format: "%02X", $0) }.joined() }

    @Test func aDeleteMadeWhileAValueWasHeldWinsAtReplay() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory, manual: ["b"])
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        try sync(a, b)
        try a.execute("ALTER TABLE items ADD COLUMN colour TEXT")
        try a.execute("UPDATE items SET colour = 'red'")
        try sync(a, b)
        // B deletes row 1 while it holds A's colour for it; A writes row 2's colour again, later.
        try b.execute("DELETE FROM items WHERE id = 1")
        try a.execute("UPDATE items SET colour = 'green' WHERE id = 2")
        try sync(a, b)
        try b.execute("ALTER TABLE items ADD COLUMN colour TEXT")
        for (from, to) in [(a, b), (b, a)] { try sync(from, to) }
        #expect(try b.execute("SELECT id, colour FROM items ORDER BY id").rows == [[.integer(2), .text("green")]])
        #expect(try a.digest() == b.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
    }

    @Test func aColumnAddedByAnotherToolIsAdoptedAndReplicated() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        // Another connection (the app's, the sqlite3 shell) adds the column and writes it before Shoal looks.
        let other = try SQLiteConnection(path: directory.appendingPathComponent("a.db").path)
        try other.exec("ALTER TABLE items ADD COLUMN note TEXT")
        try other.exec("UPDATE items SET note = 'written by the app' WHERE id = 1")
        try other.exec("INSERT INTO items(id, name, note) VALUES (2, 'two', 'new')")
        #expect(try a.captureForeignWrites())
        #expect(try a.pausedTables().isEmpty)
        try sync(a, b)
        #expect(try b.execute("SELECT id, note FROM items ORDER BY id").rows == [
            [.integer(1), .text("written by the app")], [.integer(2), .text("new")],
        ])
        #expect(try a.digest() == b.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
    }

    @Test func aTableReplicatedOnANodeThatSyncsReachesItsPeersWithItsRowsAndCounters() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory, manual: ["c"])
        let (a, b, c) = (stores["a"]!, stores["b"]!, stores["c"]!)
        try b.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        try sync(b, a)
        // a syncs with others now: a table it replicates is a schema change, with its counters.
        try a.execute("CREATE TABLE tags(id INTEGER PRIMARY KEY, name TEXT, uses INTEGER NOT NULL DEFAULT 0)")
        try a.execute("INSERT INTO tags(id, name) VALUES (1, 'fresh')")
        try a.replicate(table: "tags", counters: ["uses"])
        try a.execute("UPDATE tags SET uses = uses + 2")
        try sync(a, b)
        #expect(try b.replicatedTables().contains("tags"))
        #expect(try b.execute("SELECT id, name, uses FROM tags").rows == [[.integer(1), .text("fresh"), .integer(2)]])
        try b.execute("UPDATE tags SET uses = uses + 1")
        // c follows by hand: it holds tags' changes until its app creates the table the same way.
        try sync(b, c)
        #expect(try c.heldChanges()["tags"] ?? 0 > 0)
        #expect(try c.schemaPosition().pending == ["tags"])
        try c.execute("CREATE TABLE tags(id INTEGER PRIMARY KEY, name TEXT, uses INTEGER NOT NULL DEFAULT 0)")
        try c.replicate(table: "tags", counters: ["uses"])
        #expect(try c.heldChanges().isEmpty)
        for (from, to) in [(c, a), (a, b), (b, c)] { try sync(from, to) }
        #expect(try c.execute("SELECT uses FROM tags").rows == [[.integer(3)]])
        #expect(try a.digest() == b.digest())
        #expect(try b.digest() == c.digest())
        #expect(try contents(directory, "a") == contents(directory, "c"))
    }

    @Test func unreplicateThenReplicateNeitherOverwritesNewerDataNorBringsADeleteBack() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two'), (3, 'three')")
        try sync(a, b)
        // While b steps out of replicating the table and back in, a deletes one row and updates another.
        try b.unreplicate(table: "items")
        try a.execute("DELETE FROM items WHERE id = 1")
        try a.execute("UPDATE items SET name = 'two, newer' WHERE id = 2")
        try b.replicate(table: "items")
        for (from, to) in [(b, a), (a, b), (b, a)] { try sync(from, to) }
        #expect(try a.execute("SELECT id, name FROM items ORDER BY id").rows == [
            [.integer(2), .text("two, newer")], [.integer(3), .text("three")],
        ])
        #expect(try a.digest() == b.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
    }

    @Test func nonUniqueIndexesStayLocalAndNeverPauseATable() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("CREATE INDEX items_name ON items(name)")
        let other = try SQLiteConnection(path: directory.appendingPathComponent("b.db").path)
        try other.exec("CREATE INDEX items_qty ON items(qty, name)")
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        try b.execute("INSERT INTO items(id, name) VALUES (2, 'two')")
        for (from, to) in [(a, b), (b, a)] { try sync(from, to) }
        #expect(try a.pausedTables().isEmpty && b.pausedTables().isEmpty)
        #expect(try a.schemaPosition().changes == 0)
        #expect(try a.digest() == b.digest())
        #expect(try contents(directory, "a") == contents(directory, "b"))
    }

    @Test func destructiveChangesThroughShoalAreRefusedWithTheWayToDoThem() throws {
        let store = try makeStore()
        try makeItems(store)
        for sql in ["ALTER TABLE items DROP COLUMN name", "ALTER TABLE items RENAME COLUMN name TO label"] {
            #expect {
                try store.execute(sql)
            } throws: { error in
                (error as? ShoalError)?.message.contains("add a new column") == true
            }
        }
        #expect(try store.execute("SELECT name FROM items").columns == ["name"])
    }

    @Test func aCounterColumnAddedOnOneNodeIsACounterEverywhereAndIncrementsAddUp() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory, manual: ["c"])
        let (a, b, c) = (stores["a"]!, stores["b"]!, stores["c"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        for (from, to) in [(a, b), (b, c)] { try sync(from, to) }
        try a.addCounterColumn("likes", to: "items")
        #expect(throws: ShoalError.self) { try a.addCounterColumn("likes", to: "items") }
        #expect(throws: ShoalError.self) { try a.addCounterColumn("x", to: "nowhere") }
        try a.execute("UPDATE items SET likes = likes + 1 WHERE id = 1")
        // The app's own connection increments it too (captured by the triggers, which follow the new column).
        let app = try SQLiteConnection(path: directory.appendingPathComponent("a.db").path)
        try app.exec("UPDATE items SET likes = likes + 2 WHERE id = 1")
        #expect(try a.captureForeignWrites())
        // B takes the change with A's increments; then both increment the same row concurrently.
        try sync(a, b)
        #expect(try b.execute("SELECT likes FROM items WHERE id = 1").rows == [[.integer(3)]])
        try a.execute("UPDATE items SET likes = likes + 2 WHERE id = 1")
        try b.execute("UPDATE items SET likes = likes + 5 WHERE id = 1")
        try b.execute("UPDATE items SET likes = likes - 1 WHERE id = 2")
        for (from, to) in [(a, b), (b, a), (b, c)] { try sync(from, to) }
        for store in [a, b] {
            #expect(try store.execute("SELECT id, likes FROM items ORDER BY id").rows == [
                [.integer(1), .integer(10)], [.integer(2), .integer(-1)],
            ])
        }
        // C follows by hand: the increments (forwarded by B) wait for its own call, then add up the same way.
        #expect(try c.schemaPosition().pending == ["items.likes"])
        #expect(try c.heldChanges()["items"] ?? 0 > 0)
        try c.addCounterColumn("likes", to: "items")
        #expect(try c.schemaPosition().pending.isEmpty && c.schemaConflicts().isEmpty)
        #expect(try c.execute("SELECT id, likes FROM items ORDER BY id").rows == [
            [.integer(1), .integer(10)], [.integer(2), .integer(-1)],
        ])
        try c.execute("UPDATE items SET likes = likes + 100 WHERE id = 2")
        for (from, to) in [(c, b), (b, a), (a, c)] { try sync(from, to) }
        #expect(try a.digest() == (try b.digest()) && (try b.digest()) == (try c.digest()))
        let (contentsA, contentsB, contentsC) = (try contents(directory, "a"), try contents(directory, "b"), try contents(directory, "c"))
        #expect(contentsA == contentsB && contentsB == contentsC)
        #expect(try a.execute("SELECT likes FROM items WHERE id = 2").rows == [[.integer(99)]])
    }

    @Test func aColumnDeclaredDifferentlyFromTheStartHoldsWhatItWouldStoreOtherwiseAndSaysSo() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Store(path: directory.appendingPathComponent("a.db").path)
        let b = try Store(path: directory.appendingPathComponent("b.db").path)
        try a.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, code TEXT, name TEXT)")
        try b.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, code INTEGER, name TEXT)")
        for store in [a, b] { try store.replicate(table: "items") }
        // '0042' is TEXT on a; b's INTEGER column would store it as 42, another value: it is held there.
        try a.execute("INSERT INTO items VALUES (1, '0042', 'one'), (2, 'x7', 'two')")
        try sync(a, b)
        #expect(try b.execute("SELECT id, code, name FROM items ORDER BY id").rows == [
            [.integer(1), .null, .text("one")], [.integer(2), .text("x7"), .text("two")],
        ])
        let conflicts = try b.schemaConflicts()
        #expect(conflicts.count == 1)
        #expect(conflicts.first?.column == "code" && conflicts.first?.heldValues == 1)
        #expect(conflicts.first?.description.contains("differently from the start") == true)
        #expect(try a.schemaConflicts().isEmpty)
    }

    @Test func aRowACheckHereRefusesIsHeldWhileEverythingElseApplies() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Store(path: directory.appendingPathComponent("a.db").path)
        let b = try Store(path: directory.appendingPathComponent("b.db").path)
        let c = try Store(path: directory.appendingPathComponent("c.db").path)
        try a.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, qty INTEGER CHECK (qty >= 0), name TEXT)")
        try b.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, qty INTEGER CHECK (qty >= 0 AND qty < 100), name TEXT)")
        try c.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, qty INTEGER CHECK (qty >= 0), name TEXT)")
        for store in [a, b, c] { try store.replicate(table: "items") }
        try a.execute("INSERT INTO items VALUES (1, 5, 'one'), (2, 500, 'two'), (3, 7, 'three')")
        try sync(a, b)
        // b's stricter CHECK refuses row 2: it is held, and the rest applied; nothing failed.
        #expect(try b.execute("SELECT id, qty FROM items ORDER BY id").rows == [
            [.integer(1), .integer(5)], [.integer(3), .integer(7)],
        ])
        #expect(try b.heldChanges()["items"] ?? 0 > 0)
        #expect(try b.schemaConflicts().contains { $0.table == "items" && $0.heldValues > 0 })
        // An update to a row b has, which its CHECK refuses, leaves the row as it was.
        try a.execute("UPDATE items SET qty = 250 WHERE id = 1")
        try a.execute("UPDATE items SET name = 'three!' WHERE id = 3")
        try sync(a, b)
        #expect(try b.execute("SELECT id, qty, name FROM items ORDER BY id").rows == [
            [.integer(1), .integer(5), .text("one")], [.integer(3), .integer(7), .text("three!")],
        ])
        // What b holds is forwarded verbatim: c, syncing only with b, gets every row as a wrote it.
        try sync(b, c)
        #expect(try c.execute("SELECT id, qty, name FROM items ORDER BY id").rows == (try a.execute("SELECT id, qty, name FROM items ORDER BY id").rows))
        #expect(try c.digest() == (try a.digest()))
    }

    /// An app opens a transaction (a deferred BEGIN, which reads nothing yet) just before another process adds a
    /// column: its first write sees the column, and what it writes there replicates.
    @Test func aTransactionOpenedJustBeforeAnotherProcessAddsAColumnWritesItsNewShape() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        try a.execute("BEGIN")
        let other = try SQLiteConnection(path: directory.appendingPathComponent("a.db").path)
        try other.exec("ALTER TABLE items ADD COLUMN note TEXT")
        try a.execute("INSERT INTO items(id, name, note) VALUES (2, 'two', 'noted')")
        try a.execute("UPDATE items SET note = 'also' WHERE id = 1")
        try a.execute("COMMIT")
        try sync(a, b)
        #expect(try b.execute("SELECT id, name, note FROM items ORDER BY id").rows == [
            [.integer(1), .text("one"), .text("also")], [.integer(2), .text("two"), .text("noted")],
        ])
        #expect(try a.digest() == (try b.digest()))
        #expect(try contents(directory, "a") == (try contents(directory, "b")))
    }

    @Test func theSameColumnAddedWithTwoDefinitionsSettlesOnOneAndReportsIt() throws {
        let directory = try temporaryDirectory("schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let stores = try threeStores(directory)
        let (a, b) = (stores["a"]!, stores["b"]!)
        try a.execute("ALTER TABLE items ADD COLUMN size TEXT")
        try b.execute("ALTER TABLE items ADD COLUMN size INTEGER DEFAULT 0")
        try b.execute("INSERT INTO items(id, name, size) VALUES (1, 'one', 5)")
        for (from, to) in [(a, b), (b, a)] { try sync(from, to) }
        let conflicts = try a.schemaConflicts() + b.schemaConflicts()
        #expect(conflicts.count == 1)
        #expect(conflicts.first?.description.contains("ADD COLUMN") == true)
        // The loser's values are kept where they were written, and reached the other node too.
        #expect(try b.execute("SELECT size FROM items WHERE id = 1").rows == [[.integer(5)]])
        #expect(try a.execute("SELECT size FROM items WHERE id = 1").rows.count == 1)
    }
}

/// A node killed (SIGKILL) while it adds a column and replays the values it held for it: afterwards the column is
/// either not there with every value still held, or there with every value merged, never half of them.
@Suite struct SchemaReplayCrashTests {
    @Test func aReplayKilledAtRandomPointsIsAllOrNothing() throws {
        let directory = try temporaryDirectory("replay-crash")
        defer { try? FileManager.default.removeItem(at: directory) }
        let rowCount = 5_000
        let source = try Store(path: directory.appendingPathComponent("source.db").path)
        try source.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, extra TEXT)")
        try source.replicate(table: "items")
        try source.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(rowCount)) "
                + "INSERT INTO items SELECT i, 'item ' || i, printf('%.200c', 'e') || i FROM n"
        )
        let template = directory.appendingPathComponent("template.db")
        do {
            let target = try Store(path: template.path)
            try target.execute("CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT)")
            try target.replicate(table: "items")
            try sync(source, target)
            #expect(try target.heldChanges() == ["items": rowCount])
        }
        let executable = try shoalExecutable()
        var outcomes: [String: Int] = [:]
        for round in 0..<6 {
            let database = directory.appendingPathComponent("target\(round).db")
            for suffix in ["", "-wal", "-shm"] {
                let from = template.path + suffix
                if FileManager.default.fileExists(atPath: from) { try FileManager.default.copyItem(atPath: from, toPath: database.path + suffix) }
            }
            let process = Process()
            process.executableURL = executable
            process.arguments = ["sql", "--db", database.path, "ALTER TABLE items ADD COLUMN extra TEXT"]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            // Killed at a point spread over the command's life (opening, the ALTER, adoption, replay, after).
            usleep(useconds_t(round * 35_000))
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            let connection = try SQLiteConnection(path: database.path)
            let hasColumn = try !connection.rows("SELECT 1 FROM pragma_table_info('items') WHERE name = 'extra'").isEmpty
            let merged = hasColumn
                ? try connection.rows("SELECT count(*) FROM items WHERE extra IS NOT NULL").first?.first?.integerValue ?? 0 : 0
            #expect(merged == 0 || merged == Int64(rowCount), "round \(round): \(merged) of \(rowCount) values merged")
            // Opened again (as the next command or node start does), it finishes what was begun.
            let reopened = try Store(path: database.path)
            let held = try reopened.heldChanges()["items"] ?? 0
            if hasColumn {
                #expect(held == 0, "round \(round): the column is here, yet \(held) values are still held")
                #expect(try reopened.execute("SELECT count(*) FROM items WHERE extra IS NOT NULL").rows == [[.integer(Int64(rowCount))]])
            } else {
                #expect(held == rowCount, "round \(round): no column, and \(held) of \(rowCount) held")
            }
            #expect(try reopened.verify().isConsistent, "round \(round)")
            outcomes[hasColumn ? "column" : "no column", default: 0] += 1
        }
        #expect(outcomes.count >= 1)
    }
}
