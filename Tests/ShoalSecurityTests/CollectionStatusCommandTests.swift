import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// `shoal status` beside `shoal serve` processes of a three-member cluster whose third member is away: the tombstones
/// wait for it, status names it with the command that removes it, and once it is back they are collected.
@Suite struct CollectionStatusCommandTests {
    private static func status(_ path: String) throws -> [String: Any] {
        let text = try shoal(arguments: ["status", "--db", path, "--json"]).stdout
        return (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }

    private static func serve(_ path: String, peer: String?) async throws -> (RunningProcess, String) {
        let node = try RunningProcess(
            try shoalExecutable(),
            ["serve", "--db", path, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0", "--collect-deletes"]
                + (peer.map { ["--peer", $0] } ?? [])
        )
        guard let listening = await node.line(within: 60, { $0.hasPrefix("listening on") }) else {
            node.stop()
            throw TestSetupError("\(path) did not start: \(node.output)")
        }
        return (node, String(listening.dropFirst("listening on ".count)))
    }

    @Test func statusNamesTheMemberCollectionWaitsForUntilItIsBack() async throws {
        let directory = try temporaryDirectory("collection-status")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let cSite = try Store(path: paths[2]).status().siteID.hex
        // c's first sync, then c goes away.
        let (a, address) = try await Self.serve(paths[0], peer: nil)
        defer { a.stop() }
        let (b, _) = try await Self.serve(paths[1], peer: address)
        defer { b.stop() }
        for index in 0..<20 {
            try shoal(arguments: ["sql", "--db", paths[0], "INSERT INTO kv(k, v) VALUES ('k\(index)', \(index))"])
        }
        var (c, _) = try await Self.serve(paths[2], peer: address)
        let caughtUp = try await waitUntil(within: 60) {
            try sqlite3Shell(paths[2], "SELECT count(*) FROM kv").stdout == "20\n"
        }
        #expect(caughtUp)
        c.stop()

        try shoal(arguments: ["sql", "--db", paths[0], "DELETE FROM kv WHERE v < 15"])
        var waiting: [[String: Any]] = []
        let named = try await waitUntil(within: 60) {
            let collection = try Self.status(paths[0])["collection"] as? [String: Any]
            waiting = collection?["waiting_for"] as? [[String: Any]] ?? []
            return collection?["tombstones"] as? Int == 15 && waiting.map { $0["site"] as? String } == [cSite]
        }
        #expect(named, "\(waiting)")
        #expect(waiting.first?["name"] as? String == "c" && waiting.first?["node"] as? String != nil)
        let text = try shoal(arguments: ["status", "--db", paths[0]]).stdout
        #expect(text.contains("15 tombstones wait for c") && text.contains("shoal trust remove"), "\(text)")

        // c is back: it gets the deletes, every member reports holding them, and the tombstones go.
        (c, _) = try await Self.serve(paths[2], peer: address)
        defer { c.stop() }
        let collected = try await waitUntil(within: 60) {
            let collection = try Self.status(paths[0])["collection"] as? [String: Any]
            return collection?["tombstones"] as? Int == 0 && (collection?["collected"] as? Int ?? 0) == 15
        }
        #expect(collected)
        // Each table's metadata in bytes, and per row (live or deleted), as SQLite's dbstat counts its pages.
        let table = (try Self.status(paths[0])["tables"] as? [[String: Any]])?.first { $0["name"] as? String == "kv" }
        let bytes = table?["metadata_bytes"] as? Int ?? 0
        #expect(bytes > 0 && bytes % 4096 == 0, "\(String(describing: table))")
        #expect(table?["metadata_bytes_per_row"] as? Double == Double(bytes) / 5, "\(String(describing: table))")
        for path in paths {
            #expect(try sqlite3Shell(path, "SELECT k, v FROM kv ORDER BY k").stdout
                == sqlite3Shell(paths[0], "SELECT k, v FROM kv ORDER BY k").stdout)
        }
    }
}
