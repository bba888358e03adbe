import Foundation
import ShoalCore
import ShoalStore
import ShoalTestSupport
import Testing

/// Every application table of the database at `path`, read with the `sqlite3` shell (outside Shoal), rows by key.
private func tableDumps(_ path: String) throws -> [String: String] {
    let names = try sqlite3Shell(
        path,
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'shoal%' AND name NOT LIKE 'sqlite%' "
            + "ORDER BY name"
    ).stdout.split(separator: "\n").map(String.init)
    var dumps: [String: String] = [:]
    for name in names {
        dumps[name] = try sqlite3Shell(path, "SELECT quote(k), quote(v) FROM \"\(name)\" ORDER BY k").stdout
    }
    return dumps
}

/// Text-heavy rows through the relay alone (no LAN link between the nodes): compressed before sealing.
extension RelayProcessTests {
    @Test func textRowsTravelThroughTheRelayCompressedAndArriveEqual() async throws {
        let world = try await RelayWorld("relay-compression", nodes: ["a", "b"])
        defer { world.tearDown() }
        do {
            let store = try Store(path: world.paths["a"]!)
            let insert = try store.prepare("INSERT INTO kv(k, v) VALUES (?, ?)")
            var generator = SplitMix(state: 12)
            for start in stride(from: 0, to: 800, by: 100) {
                try store.transaction {
                    for index in start..<start + 100 {
                        try insert.execute([.text("doc-\(index)"), .text(JSONDocuments.document(index, &generator))])
                    }
                }
            }
        }
        try await world.serve("a")
        try await world.serve("b")
        let converged = try await world.converge(["a", "b"], within: 120)
        #expect(converged, "\(world.outputs)")
        var relay: [String: Any] = [:]
        #expect(
            try await waitUntil(within: 30, checkingEvery: 200) {
                relay = try await world.relayStatus("a")
                return (relay["plaintextBytes"] as? Int ?? 0) > 0
            }
        )
        let plaintext = Double(relay["plaintextBytes"] as? Int ?? 0)
        let sealed = Double(relay["sealedBytes"] as? Int ?? 0)
        let stored = Double(try await world.storedBytes())
        #expect(plaintext > 800 * 1_000)
        #expect(sealed <= 0.4 * plaintext, "sealed \(sealed) of \(plaintext)")
        // What the relay holds (every member's uploads, headers included) against what a's batches held.
        #expect(stored <= 0.4 * plaintext, "stored \(stored) of \(plaintext)")
        try await world.stop("b")
        try await world.stop("a")
        let (left, right) = (try tableDumps(world.paths["a"]!), try tableDumps(world.paths["b"]!))
        #expect(left.keys.sorted() == ["kv"])
        #expect(left == right)
        #expect(left["kv"]?.split(separator: "\n").count == 800)
    }
}
