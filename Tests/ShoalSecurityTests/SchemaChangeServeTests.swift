import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// Schema changes across live `shoal serve` processes over TLS: a chain a ← b ← c (c reaches a only through b).
/// A column added on a (through `shoal sql`) and one added on c (by the sqlite3 shell) reach every node while every
/// node keeps writing, and the three files end up with the same rows, compared outside Shoal.
/// Starts `shoal serve` on `path` over TLS, dialling `peer` if given; returns once it listens (and, dialling, once the
/// peer connected), with the address it listens on. The caller stops it.
private func serve(
    _ path: String,
    dialing peer: String? = nil,
    _ options: [String] = []
) async throws -> (node: RunningProcess, address: String) {
    let node = try RunningProcess(
        try shoalExecutable(),
        ["serve", "--db", path, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"]
            + (peer.map { ["--peer", $0] } ?? []) + options
    )
    guard let listening = await node.line(within: 30, { $0.hasPrefix("listening on") }) else {
        node.stop()
        throw TestSetupError("\(path) did not start: \(node.output)")
    }
    if peer != nil {
        #expect(await node.line(within: 30) { $0.contains("peer connected") } != nil, "\(node.output)")
    }
    return (node, String(listening.dropFirst("listening on ".count)))
}

/// Starts a chain of nodes on `paths`, each dialling the one before (with `options[path]` added to its command).
private func serveChain(_ paths: [String], options: [String: [String]] = [:]) async throws -> [RunningProcess] {
    var nodes: [RunningProcess] = []
    var previous: String?
    for path in paths {
        do {
            let (node, address) = try await serve(path, dialing: previous, options[path] ?? [])
            nodes.append(node)
            previous = address
        } catch {
            for node in nodes { node.stop() }
            throw error
        }
    }
    return nodes
}

@Suite struct SchemaChangeServeTests {
    @Test func columnsAddedOnTheEndsOfAChainReachEveryNodeWhileAllKeepWriting() async throws {
        let directory = try temporaryDirectory("schema-serve")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        for path in paths {
            #expect(try shoal("sql", "--db", path, "CREATE TABLE notes(id TEXT PRIMARY KEY, body TEXT)").status == 0)
            #expect(try shoal("replicate", "--db", path, "notes").status == 0)
        }
        let nodes = try await serveChain(paths)
        defer { for node in nodes { node.stop() } }
        let (a, b, c) = (paths[0], paths[1], paths[2])
        for (index, path) in paths.enumerated() {
            #expect(try shoal("sql", "--db", path, "INSERT INTO kv VALUES ('before-\(index)', \(index))").status == 0)
        }
        // b's and c's apps keep writing every table, through their own sqlite3 connections, before, during and after
        // a's app update.
        func bAndCWrite(_ round: Int) throws {
            for (path, name) in [(b, "b"), (c, "c")] {
                let sql = "INSERT INTO notes VALUES ('\(name)-\(round)', 'round \(round)'); "
                    + "UPDATE kv SET v = \(round) WHERE k = 'before-\(name == "b" ? 1 : 2)'"
                #expect(try sqlite3Shell(path, sql).status == 0)
            }
        }
        for round in 0..<4 { try bAndCWrite(round) }
        // a's app update adds a column and writes it; b and c keep writing the columns they have.
        let alter = try shoal("sql", "--db", a, "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'")
        #expect(alter.status == 0, "\(alter.stderr)")
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('from-a', 1, 'red')").status == 0)
        #expect(try shoal("sql", "--db", b, "INSERT INTO kv(k, v) VALUES ('from-b', 2)").status == 0)
        #expect(try shoal("sql", "--db", c, "UPDATE kv SET v = 30 WHERE k = 'before-0'").status == 0)
        for round in 4..<8 { try bAndCWrite(round) }
        // c's column comes from the sqlite3 shell, behind Shoal's back, once b's row reached c (through b).
        let reached = try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(c, "SELECT count(*) FROM kv WHERE k = 'from-b'").stdout == "1\n"
        }
        #expect(reached)
        #expect(try sqlite3Shell(c, "ALTER TABLE kv ADD COLUMN note TEXT").status == 0)
        #expect(try sqlite3Shell(c, "UPDATE kv SET note = 'checked' WHERE k = 'from-b'").status == 0)

        func contents(_ path: String) throws -> [String: [String]] {
            try SQLiteConnection(path: path).applicationTableContents()
        }
        let converged = try await waitUntil(within: 60, checkingEvery: 200) {
            let all = try paths.map(contents)
            let columns = try paths.map { try SQLiteConnection(path: $0).rows("SELECT name FROM pragma_table_info('kv')") }
            let notes = try paths.map { try sqlite3Shell($0, "SELECT count(*) FROM notes").stdout }
            return all.allSatisfy { $0 == all[0] } && columns.allSatisfy { $0.count == 4 }
                && notes.allSatisfy { $0 == "16\n" }
        }
        let described = try paths.map { "\($0): \(try contents($0))" }.joined(separator: "\n")
        #expect(converged, "\(described)\n\(nodes.map(\.output))")
        let row = try SQLiteConnection(path: a).rows("SELECT v, colour, note FROM kv WHERE k = 'from-b'")
        #expect(row == [[.integer(2), .text("grey"), .text("checked")]])
        for path in paths {
            let status = try shoal("status", "--db", path)
            #expect(status.stdout.contains("schema:     2 schema changes"), "\(status.stdout)")
            #expect(!status.stdout.contains("held:"), "\(status.stdout)")
        }
    }

    /// A node that was off while its peers went through three app updates (a column, a new table with rows, a counter
    /// column) catches up on all three, with the data written meanwhile, when it comes back.
    @Test func aNodeOfflineThroughThreeSchemaChangesCatchesUpOnAll() async throws {
        let directory = try temporaryDirectory("schema-offline")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let (a, b, c) = (paths[0], paths[1], paths[2])
        var nodes: [RunningProcess] = []
        defer { for node in nodes { node.stop() } }
        func start(_ path: String, dialing peer: String?) async throws -> String {
            let (node, address) = try await serve(path, dialing: peer)
            nodes.append(node)
            return address
        }
        // c writes a row while it is still off; a and b run.
        #expect(try shoal("sql", "--db", c, "INSERT INTO kv VALUES ('from-c', 3)").status == 0)
        let addressB = try await start(b, dialing: nil)
        _ = try await start(a, dialing: addressB)
        for step in [
            ["sql", "--db", a, "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'"],
            ["sql", "--db", a, "INSERT INTO kv(k, v, colour) VALUES ('first-a', 0, 'red')"],
        ] {
            let result = try shoal(arguments: step)
            #expect(result.status == 0, "\(step): \(result.stderr)")
        }
        // b replicates its new table once it syncs with a (a database that never synced has no schema history).
        let bSynced = try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(b, "SELECT colour FROM kv WHERE k = 'first-a'").stdout == "red\n"
        }
        #expect(bSynced)
        let steps: [[String]] = [
            ["sql", "--db", b, "CREATE TABLE notes(id TEXT PRIMARY KEY, body TEXT)"],
            ["replicate", "--db", b, "notes"],
            ["sql", "--db", b, "INSERT INTO notes VALUES ('n1', 'first'), ('n2', 'second')"],
            ["replicate", "--db", a, "kv", "--add-counter", "hits"],
            ["sql", "--db", a, "INSERT INTO kv(k, v, colour) VALUES ('from-a', 1, 'blue')"],
            ["sql", "--db", a, "UPDATE kv SET hits = hits + 4 WHERE k = 'from-a'"],
        ]
        for step in steps {
            let result = try shoal(arguments: step)
            #expect(result.status == 0, "\(step): \(result.stderr)")
        }
        let bHasAll = try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(b, "SELECT hits FROM kv WHERE k = 'from-a'").stdout == "4\n"
        }
        #expect(bHasAll)
        // c comes back, reaching a only through b, and increments the counter it did not have when it went off.
        _ = try await start(c, dialing: addressB)
        let caughtUp = try await waitUntil(within: 60, checkingEvery: 200) {
            try sqlite3Shell(c, "SELECT hits FROM kv WHERE k = 'from-a'").stdout == "4\n"
        }
        #expect(caughtUp, "\(nodes.map(\.output))")
        #expect(try shoal("sql", "--db", c, "UPDATE kv SET hits = hits + 1 WHERE k = 'from-a'").status == 0)
        func contents(_ path: String) throws -> [String: [String]] {
            try SQLiteConnection(path: path).applicationTableContents()
        }
        let converged = try await waitUntil(within: 60, checkingEvery: 200) {
            let all = try paths.map(contents)
            let hits = try sqlite3Shell(a, "SELECT hits FROM kv WHERE k = 'from-a'").stdout
            return all.allSatisfy { $0 == all[0] } && hits == "5\n"
        }
        let described = try paths.map { "\($0): \(try contents($0))" }.joined(separator: "\n")
        #expect(converged, "\(described)\n\(nodes.map(\.output))")
        #expect(try sqlite3Shell(c, "SELECT k, colour FROM kv WHERE k = 'from-c'").stdout == "from-c|grey\n")
        #expect(try sqlite3Shell(c, "SELECT count(*) FROM notes").stdout == "2\n")
        for path in paths {
            let status = try shoal("status", "--db", path)
            #expect(status.stdout.contains("schema:     3 schema changes"), "\(status.stdout)")
            #expect(!status.stdout.contains("held:"), "\(status.stdout)")
        }
    }

    /// Two devices make schema changes of their own while apart, then sync live: the same column with the same definition (one
    /// change), the same column with two definitions (one wins everywhere, the loser says what to run), and a rename
    /// by the sqlite3 shell of a second table on one of them (that table pauses there; the other keeps flowing both
    /// ways).
    @Test func concurrentSchemaChangesOnTwoLiveNodesSettleAndARenameElsewherePausesOnlyItsTable() async throws {
        let directory = try temporaryDirectory("schema-concurrent")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let (a, b) = (paths[0], paths[1])
        for path in paths {
            #expect(try shoal("sql", "--db", path, "CREATE TABLE notes(id TEXT PRIMARY KEY, body TEXT)").status == 0)
            #expect(try shoal("replicate", "--db", path, "notes").status == 0)
        }
        // Both devices update their app while apart (each then holds the other's change as a peer's).
        for (path, size) in [(a, "TEXT"), (b, "INTEGER DEFAULT 0")] {
            #expect(try shoal("sql", "--db", path, "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'").status == 0)
            #expect(try shoal("sql", "--db", path, "ALTER TABLE kv ADD COLUMN size \(size)").status == 0)
        }
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('from-a', 1, 'red', 'large')").status == 0)
        #expect(try shoal("sql", "--db", b, "INSERT INTO kv VALUES ('from-b', 2, 'blue', 5)").status == 0)
        let nodes = try await serveChain(paths)
        defer { for node in nodes { node.stop() } }
        // Each side's status ends up with 2 schema changes in all, and size is reported as a conflict: by the side
        // whose definition lost, and by a side that holds a value of the other's it would store as another.
        let settled = try await waitUntil(within: 60, checkingEvery: 200) {
            let statuses = try paths.map { try shoal("status", "--db", $0).stdout }
            let conflicts = statuses.filter { $0.contains("schema conflict") && $0.contains("kv.size") }
            let counts = try paths.map { try sqlite3Shell($0, "SELECT count(*) FROM kv").stdout }
            return statuses.allSatisfy { $0.contains("schema:     2 schema changes") } && !conflicts.isEmpty
                && counts == ["2\n", "2\n"]
        }
        let statuses = try paths.map { try shoal("status", "--db", $0).stdout }.joined(separator: "\n---\n")
        #expect(settled, "\(statuses)")
        #expect(try sqlite3Shell(b, "SELECT colour FROM kv WHERE k = 'from-a'").stdout == "red\n")

        // The sqlite3 shell renames notes on b: notes pauses there; kv keeps flowing both ways.
        #expect(try sqlite3Shell(b, "ALTER TABLE notes RENAME TO notes_old").status == 0)
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv(k, v) VALUES ('after-a', 3)").status == 0)
        #expect(try shoal("sql", "--db", b, "INSERT INTO kv(k, v) VALUES ('after-b', 4)").status == 0)
        #expect(try shoal("sql", "--db", a, "INSERT INTO notes VALUES ('n1', 'kept for b')").status == 0)
        let flowing = try await waitUntil(within: 60, checkingEvery: 200) {
            let counts = try paths.map { try sqlite3Shell($0, "SELECT count(*) FROM kv WHERE k LIKE 'after-%'").stdout }
            return counts == ["2\n", "2\n"]
        }
        #expect(flowing, "\(nodes.map(\.output))")
        let status = try shoal("status", "--db", b)
        #expect(status.stdout.contains("paused") && status.stdout.contains("notes"), "\(status.stdout)")
    }

    /// A device steps its table out of replication and back in (`shoal unreplicate`, then `shoal replicate`) while its
    /// node runs; meanwhile its peer deletes one row, updates another and adds one, and its own app edits a third. The
    /// peer's writes win where the device did not write (replicating again stamps only what changed meanwhile), the
    /// device's edit reaches the peer, nothing deleted comes back, and the files hold the same rows, compared outside
    /// Shoal.
    @Test func unreplicateThenReplicateBesideALiveNodeKeepsThePeersNewerWritesAndDeletes() async throws {
        let directory = try temporaryDirectory("schema-rereplicate")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let (a, b) = (paths[0], paths[1])
        let nodes = try await serveChain(paths)
        defer { for node in nodes { node.stop() } }
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('one', 1), ('two', 2), ('three', 3)").status == 0)
        #expect(try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(b, "SELECT count(*) FROM kv").stdout == "3\n"
        })
        let out = try shoal("unreplicate", "--db", b, "kv")
        #expect(out.status == 0, "\(out.stderr)")
        #expect(try shoal("sql", "--db", a, "DELETE FROM kv WHERE k = 'one'").status == 0)
        #expect(try shoal("sql", "--db", a, "UPDATE kv SET v = 20 WHERE k = 'two'").status == 0)
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('four', 4)").status == 0)
        // b's app edits a row meanwhile (not captured: the table is not replicated): that edit is b's write.
        #expect(try sqlite3Shell(b, "UPDATE kv SET v = 33 WHERE k = 'three'").status == 0)
        let back = try shoal("replicate", "--db", b, "kv")
        #expect(back.status == 0, "\(back.stderr)")

        func contents(_ path: String) throws -> [String: [String]] {
            try SQLiteConnection(path: path).applicationTableContents()
        }
        let converged = try await waitUntil(within: 60, checkingEvery: 200) {
            try contents(a) == contents(b) && sqlite3Shell(b, "SELECT count(*) FROM kv").stdout == "3\n"
        }
        let described = "a: \(try contents(a))\nb: \(try contents(b))\n\(nodes.map(\.output))"
        #expect(converged, "\(described)")
        for path in paths {
            let rows = try sqlite3Shell(path, "SELECT k, v FROM kv ORDER BY k")
            #expect(rows.stdout == "four|4\nthree|33\ntwo|20\n", "\(rows)")
        }
    }

    /// `shoal serve --schema-changes manual` on the middle of a chain a ← b ← c (c reaches a only through b): a's new
    /// column is recorded on b but not made, its values are held there (status says so) and forwarded verbatim to c,
    /// which makes the column; b deletes a row whose value it holds; then b's app runs the identical ALTER through a
    /// plain sqlite3 connection: the held values replay, the delete still wins, there is no schema conflict, and the
    /// three files hold the same rows, compared outside Shoal.
    @Test func aNodeFollowingSchemaChangesByHandHoldsForwardsAndReplaysThem() async throws {
        let directory = try temporaryDirectory("schema-manual")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let (a, b, c) = (paths[0], paths[1], paths[2])
        let seed = "INSERT INTO kv VALUES ('r1', 1), ('r2', 2), ('r3', 3)"
        #expect(try shoal("sql", "--db", a, seed).status == 0)
        let nodes = try await serveChain(paths, options: [b: ["--schema-changes", "manual"]])
        defer { for node in nodes { node.stop() } }
        let seeded = try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(c, "SELECT count(*) FROM kv").stdout == "3\n"
        }
        #expect(seeded, "\(nodes.map(\.output))")

        // a's app update adds a column and writes it: text, a BLOB with a NUL byte, a REAL, and a new row.
        let alter = "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'"
        #expect(try shoal("sql", "--db", a, alter).status == 0)
        for write in [
            "UPDATE kv SET colour = 'red' WHERE k = 'r1'",
            "UPDATE kv SET colour = x'00ff10' WHERE k = 'r2'",
            "UPDATE kv SET colour = 'blue' WHERE k = 'r3'",
            "INSERT INTO kv VALUES ('r4', 4.5, 'green')",
        ] {
            let result = try shoal("sql", "--db", a, write)
            #expect(result.status == 0, "\(write): \(result.stderr)")
        }
        // c, which follows automatically, gets the column and every value through b, verbatim.
        let forwarded = try await waitUntil(within: 30, checkingEvery: 100) {
            try sqlite3Shell(c, "SELECT group_concat(k || '=' || typeof(colour) || ':' || hex(colour), ' ') FROM "
                + "(SELECT * FROM kv ORDER BY k)").stdout
                == "r1=text:726564 r2=blob:00FF10 r3=text:626C7565 r4=text:677265656E\n"
        }
        let cRows = try sqlite3Shell(c, "SELECT * FROM kv").stdout
        #expect(forwarded, "\(cRows)\n\(nodes.map(\.output))")

        // b holds them: the column is not made there, status names it and counts the held changes.
        let bColumns = try SQLiteConnection(path: b).rows("SELECT name FROM pragma_table_info('kv') ORDER BY cid")
        #expect(bColumns == [[.text("k")], [.text("v")]])
        #expect(try sqlite3Shell(b, "SELECT k, v FROM kv WHERE k = 'r4'").stdout == "r4|4.5\n")
        let status = try shoal("status", "--db", b)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(
            status.stdout.contains("schema:     1 schema change; not made here yet: kv.colour (their values are held)"),
            "\(status.stdout)"
        )
        #expect(status.stdout.contains("held:       ") && status.stdout.contains("for kv"), "\(status.stdout)")
        let json = try shoal("status", "--db", b, "--json")
        #expect(json.status == 0, "\(json.stderr)")
        let schema = (try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])?["schema"]
            as? [String: Any]
        #expect(schema?["changes"] as? Int == 1, "\(json.stdout)")
        #expect(schema?["pending"] as? [String] == ["kv.colour"], "\(json.stdout)")
        let heldBefore = (schema?["held_changes"] as? [String: Int])?["kv"] ?? 0
        #expect(heldBefore >= 4, "\(json.stdout)")
        #expect((schema?["conflicts"] as? [Any])?.isEmpty == true, "\(json.stdout)")

        // Meanwhile b deletes r3, whose colour it holds; the delete reaches a and c.
        #expect(try shoal("sql", "--db", b, "DELETE FROM kv WHERE k = 'r3'").status == 0)
        let deleted = try await waitUntil(within: 30, checkingEvery: 100) {
            try [a, c].allSatisfy { try sqlite3Shell($0, "SELECT count(*) FROM kv WHERE k = 'r3'").stdout == "0\n" }
        }
        #expect(deleted, "\(nodes.map(\.output))")

        // b's app migrates through a plain SQLite connection of its own (the sqlite3 shell), with the identical ALTER.
        let migrated = try sqlite3Shell(b, alter)
        #expect(migrated.status == 0, "\(migrated.stderr)")
        let replayed = try await waitUntil(within: 30, checkingEvery: 100) {
            let held = try shoal("status", "--db", b).stdout
            let colours = try sqlite3Shell(b, "SELECT group_concat(k || '=' || hex(colour), ' ') FROM "
                + "(SELECT * FROM kv ORDER BY k)").stdout
            return !held.contains("held:") && colours == "r1=726564 r2=00FF10 r4=677265656E\n"
        }
        let bRows = try sqlite3Shell(b, "SELECT * FROM kv").stdout
        #expect(replayed, "\(bRows)\n\(nodes.map(\.output))")
        for path in paths {
            let after = try shoal("status", "--db", path)
            #expect(after.stdout.contains("schema:     1 schema change\n"), "\(path): \(after.stdout)")
            #expect(!after.stdout.contains("schema conflict") && !after.stdout.contains("held:"), "\(after.stdout)")
        }

        // Every table's rows, read outside Shoal (each value's type and bytes), are the same on a, b and c.
        func contents(_ path: String) throws -> [String: [String]] {
            try SQLiteConnection(path: path).applicationTableContents()
        }
        let converged = try await waitUntil(within: 30, checkingEvery: 200) {
            let all = try paths.map(contents)
            return all.allSatisfy { $0 == all[0] }
        }
        let described = try paths.map { "\($0): \(try contents($0))" }.joined(separator: "\n")
        #expect(converged, "\(described)\n\(nodes.map(\.output))")
        #expect(try contents(a)["kv"] == [
            "colour=blob:00FF10|k=text:7232|v=integer:32", "colour=text:677265656E|k=text:7234|v=real:342E35",
            "colour=text:726564|k=text:7231|v=integer:31",
        ], "\(described)")
    }
}

