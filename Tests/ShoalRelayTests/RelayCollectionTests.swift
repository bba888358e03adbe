import Foundation
import ShoalCore
import ShoalTestSupport
import Testing

/// Tombstones collected in a cluster where a member reaches the others only through the relay: every part a real
/// process (`shoal relay serve`, `shoal serve`).
@Suite(.serialized) struct RelayCollectionTests {
    /// a and b are a LAN (b dials a, and has no relay link); c reaches them only through the relay, and a is the only
    /// LAN node with a relay link. Each member writes what it holds as a replicated row after commits, so c learns
    /// what a and b hold (b's row crosses the LAN to a, then the relay), and they learn what c holds: every node
    /// collects the deletes, and none collects before c holds them.
    @Test func aMemberReachedOnlyThroughTheRelayReportsWhatItHoldsAndDeletesAreCollectedEverywhere() async throws {
        let world = try await RelayWorld("relay-collect", nodes: ["a", "b", "c"])
        defer { world.tearDown() }
        let fast = ["--round-interval", "200"]
        try await world.serve("a", extra: fast)
        try await world.serve("b", relay: false, peers: ["a"], extra: fast)
        try await world.serve("c", extra: fast)
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40)
            INSERT INTO kv SELECT 'row' || i, printf('%.2000c', 'x') FROM n;
            """
        )
        #expect(try await world.converge(["a", "b", "c"]))
        // c is stopped before the deletes: while it lacks them, nobody collects them.
        try await world.stop("c")
        try await world.write("b", "DELETE FROM kv WHERE k IN (SELECT k FROM kv ORDER BY k LIMIT 10)")
        #expect(try await world.converge(["a", "b"]))
        func collection(_ name: String) async throws -> [String: Any] {
            try await world.status(name)["collection"] as? [String: Any] ?? [:]
        }
        func tombstones(_ name: String) async throws -> Int? { try await collection(name)["tombstones"] as? Int }
        #expect(
            try await waitUntil(within: 30) {
                let (a, b) = (try await tombstones("a"), try await tombstones("b"))
                return a == 10 && b == 10
            }
        )
        // a waits for c alone (which it never heard from: c stopped before its first report).
        let waiting = try await collection("a")["waiting_for"] as? [[String: Any]] ?? []
        #expect(waiting.count == 1 && waiting.first?["last_report_ms"] is NSNull, "\(waiting)")
        // c comes back through the relay alone: it takes the deletes and says so in its report row.
        try await world.serve("c", extra: fast)
        #expect(try await world.converge(["a", "b", "c"]))
        let collected = try await waitUntil(within: 60) {
            let (a, b, c) = (try await tombstones("a"), try await tombstones("b"), try await tombstones("c"))
            return a == 0 && b == 0 && c == 0
        }
        let states = ["a": try await collection("a"), "b": try await collection("b"), "c": try await collection("c")]
        #expect(collected, "\(states)")
        // c knows a and b by their report rows (it never meets them), and a knows c by its own.
        func members(_ name: String) async throws -> [String: String] {
            let list = try await world.status(name)["members"] as? [[String: Any]] ?? []
            return Dictionary(list.compactMap { member in
                (member["name"] as? String).map { ($0, member["source"] as? String ?? "") }
            }, uniquingKeysWith: { first, _ in first })
        }
        let seenByC = try await members("c")
        #expect(seenByC["a"] == "report" && seenByC["b"] == "report", "\(seenByC)")
        #expect(try await members("a")["c"] == "report")
        // The rows, compared outside Shoal: 30 left, the same everywhere.
        var contents: [[[String]]] = []
        for name in ["a", "b", "c"] {
            let path = world.paths[name]!
            let dump = try await offPool { try sqlite3Shell(path, "SELECT k, hex(v) FROM kv ORDER BY k") }
            contents.append(dump.stdout.split(separator: "\n").map { $0.split(separator: "|").map(String.init) })
        }
        #expect(contents[0].count == 30 && contents[0] == contents[1] && contents[1] == contents[2])
    }
}
