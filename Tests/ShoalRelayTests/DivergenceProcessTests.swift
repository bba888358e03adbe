import AsyncHTTPClient
import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalStore

extension RelayProcessTests {
    /// Two `shoal serve` nodes (mutual TLS, one with `--metrics`) at the same version, one of whose files is changed
    /// behind Shoal's back with the `sqlite3` shell: `shoal status` reports the divergence as an error, with what to
    /// run; the node logs it once; the metrics count it; `shoal verify --peer` lists exactly the row that differs;
    /// a write that mends the row clears all of it.
    @Test func aDivergenceIsAnErrorInStatusLogsAndMetricsAndVerifyListsTheRow() async throws {
        let world = try await RelayWorld("diverged-nodes", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.write("a", "INSERT INTO kv VALUES ('k1', 'one'), ('k2', 'two'), ('k3', 'three')")
        let interval = ["--round-interval", "200"]
        let a = try await world.serve("a", relay: false, extra: interval + ["--metrics", "127.0.0.1:0"])
        try await world.serve("b", relay: false, peers: ["a"], extra: interval)
        let metricsLine = await a.line(within: 30) { $0.hasPrefix("metrics listening on ") }
        let metrics = "http://" + (try #require(metricsLine)).dropFirst("metrics listening on ".count) + "/metrics"
        #expect(try await world.converge(["a", "b"]))
        let siteB = try #require(try await world.status("b")["site"] as? String)

        // The sqlite3 shell changes a row of b and drops what its triggers captured, in one transaction: Shoal never
        // sees the write. Dropping the digest's stored sums makes b's next digest a scan, which sees the change.
        let table = try await offPool {
            try sqlite3Shell(world.paths["b"]!, "SELECT id FROM shoal_tables WHERE name = 'kv'")
        }
        let id = table.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try await world.write(
            "b",
            "BEGIN; UPDATE kv SET v = 'tampered' WHERE k = 'k2'; DELETE FROM shoal_outbox_\(id); "
                + "DELETE FROM shoal_digest; COMMIT"
        )

        // a's status: an error naming b, since when, and what to run.
        var error: [String: Any] = [:]
        let reported = try await waitUntil(within: 60, checkingEvery: 250) {
            let errors = try await world.status("a")["errors"] as? [[String: Any]] ?? []
            error = errors.first ?? [:]
            return errors.count == 1
        }
        #expect(reported, "a never reported the divergence:\n\(world.outputs)")
        #expect(error["kind"] as? String == "diverged" && error["peer"] as? String == siteB)
        #expect(error["since_ms"] as? UInt64 != nil)
        let run = try #require(error["run"] as? String)
        #expect(run == "shoal verify --db \(world.paths["a"]!) --peer 127.0.0.1:\(world.ports["b"]!)")
        let peers = try await world.status("a")["peers"] as? [[String: Any]] ?? []
        #expect(peers.first?["divergedSinceMs"] as? UInt64 != nil)
        let text = try await offPool { try shoal("status", "--db", world.paths["a"]!) }.stdout
        #expect(text.contains("ERROR:      diverged from b ") && text.contains(run) && text.contains("DIVERGED (error"))
        // b's status says the same of a.
        #expect(
            try await waitUntil(within: 30, checkingEvery: 250) {
                (try await world.status("b")["errors"] as? [[String: Any]] ?? []).count == 1
            }
        )

        // The metrics: one diverged peer, b.
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        var last: Scrape?
        let counted = try await waitUntil(within: 20, checkingEvery: 200) {
            last = try await scrape(client, metrics)
            return last?.value("shoal_node_diverged_peers") == 1
                && last?.value("shoal_node_peer_diverged", ["peer": siteB]) == 1
        }
        #expect(counted, "\(last?.text ?? "no scrape")")

        // Logged at error level once, and said once by the node's output.
        #expect(a.output.components(separatedBy: "ERROR: diverged from b ").count == 2, "\(a.output)")
        #expect(a.output.contains("replicas diverged"), "\(a.output)")

        // shoal verify --peer lists exactly the row that differs (exit status 1), over mutual TLS, read-only.
        let verified = try await offPool {
            try shoal("verify", "--db", world.paths["a"]!, "--peer", "127.0.0.1:\(world.ports["b"]!)")
        }
        #expect(verified.status == 1, "\(verified.stdout)\(verified.stderr)")
        #expect(verified.stdout.contains("verdict:    DIVERGED"), "\(verified.stdout)")
        #expect(verified.stdout.hasSuffix("rows:       1 differ\n  kv k='k2': differs\n"), "\(verified.stdout)")
        let json = try await offPool {
            try shoal("verify", "--db", world.paths["a"]!, "--peer", "127.0.0.1:\(world.ports["b"]!)", "--json")
        }
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["diverged"] as? Bool == true)
        let rows = object["rows"] as? [[String: Any]] ?? []
        #expect(rows.count == 1)
        #expect(rows.first?["table"] as? String == "kv" && rows.first?["difference"] as? String == "differs")
        #expect((rows.first?["key"] as? [String: Any])?["k"] as? String == "k2")
        // The nodes' own link was left alone.
        #expect(!a.output.contains("peer disconnected"), "\(a.output)")

        // A write through Shoal that overwrites the row mends it: the error, the metric and the rows go.
        try await world.write("a", "UPDATE kv SET v = 'mended' WHERE k = 'k2'")
        #expect(
            try await waitUntil(within: 60, checkingEvery: 250) {
                (try await world.status("a")["errors"] as? [[String: Any]] ?? []).isEmpty
            }
        )
        #expect(
            try await waitUntil(within: 20, checkingEvery: 200) {
                try await scrape(client, metrics)?.value("shoal_node_diverged_peers") == 0
            }
        )
        let mended = try await offPool {
            try shoal("verify", "--db", world.paths["a"]!, "--peer", "127.0.0.1:\(world.ports["b"]!)")
        }
        #expect(
            mended.status == 0 && mended.stdout.contains("rows:       none differ"),
            "\(mended.stdout)\(mended.stderr)"
        )
        #expect(a.output.contains("converged again with b "), "\(a.output)")
    }
}
