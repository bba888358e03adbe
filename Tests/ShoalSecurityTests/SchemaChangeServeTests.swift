import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// Schema changes across live `shoal serve` processes over TLS: a chain a ← b ← c (c reaches a only through b).
/// A column added on a (through `shoal sql`) and one added on c (by the sqlite3 shell) reach every node while every
/// node keeps writing, and the three files end up with the same rows, compared outside Shoal.
@Suite struct SchemaChangeServeTests {
    @Test func columnsAddedOnTheEndsOfAChainReachEveryNodeWhileAllKeepWriting() async throws {
        let directory = try temporaryDirectory("schema-serve")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        var nodes: [RunningProcess] = []
        defer { for node in nodes { node.stop() } }
        var dial: [String] = []
        for path in paths {
            let node = try RunningProcess(
                try shoalExecutable(),
                ["serve", "--db", path, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"] + dial
            )
            nodes.append(node)
            guard let listening = await node.line(within: 30, { $0.hasPrefix("listening on") }) else {
                throw TestSetupError("\(path) did not start: \(node.output)")
            }
            if !dial.isEmpty {
                #expect(await node.line(within: 30) { $0.contains("peer connected") } != nil, "\(node.output)")
            }
            dial = ["--peer", String(listening.dropFirst("listening on ".count))]
        }
        let (a, b, c) = (paths[0], paths[1], paths[2])
        for (index, path) in paths.enumerated() {
            #expect(try shoal("sql", "--db", path, "INSERT INTO kv VALUES ('before-\(index)', \(index))").status == 0)
        }
        // a's app update adds a column and writes it; b and c keep writing the columns they have.
        let alter = try shoal("sql", "--db", a, "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'")
        #expect(alter.status == 0, "\(alter.stderr)")
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('from-a', 1, 'red')").status == 0)
        #expect(try shoal("sql", "--db", b, "INSERT INTO kv(k, v) VALUES ('from-b', 2)").status == 0)
        #expect(try shoal("sql", "--db", c, "UPDATE kv SET v = 30 WHERE k = 'before-0'").status == 0)
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
            return all.allSatisfy { $0 == all[0] } && columns.allSatisfy { $0.count == 4 }
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
}
