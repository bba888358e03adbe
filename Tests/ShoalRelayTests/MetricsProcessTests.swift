import AsyncHTTPClient
import Foundation
import NIOCore
import ShoalTestSupport
import Testing

@testable import ShoalStore

/// One sample of a Prometheus text exposition: its name, labels and value.
struct MetricSample {
    var name: String
    var labels: [String: String]
    var value: Double
}

/// What one scrape of `/metrics` returned, parsed.
struct Scrape {
    let samples: [MetricSample]
    let text: String

    /// Parses the text format (`name{label="value",...} value`; comments skipped).
    init(_ text: String) {
        self.text = text
        var samples: [MetricSample] = []
        for line in text.split(separator: "\n") where !line.hasPrefix("#") && !line.isEmpty {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
                continue
            }
            let series = line[..<space]
            guard let brace = series.firstIndex(of: "{") else {
                samples.append(MetricSample(name: String(series), labels: [:], value: value))
                continue
            }
            var labels: [String: String] = [:]
            var rest = series[series.index(after: brace)...].dropLast()  // without the closing brace
            while let equals = rest.firstIndex(of: "=") {
                let key = String(rest[..<equals]).trimmingCharacters(in: CharacterSet(charactersIn: ", "))
                var cursor = rest.index(equals, offsetBy: 2)  // past `="`
                var value = ""
                while cursor < rest.endIndex, rest[cursor] != "\"" {
                    if rest[cursor] == "\\", rest.index(after: cursor) < rest.endIndex {
                        cursor = rest.index(after: cursor)
                        value.append(rest[cursor] == "n" ? "\n" : rest[cursor])
                    } else {
                        value.append(rest[cursor])
                    }
                    cursor = rest.index(after: cursor)
                }
                labels[key] = value
                rest = cursor < rest.endIndex ? rest[rest.index(after: cursor)...] : rest[rest.endIndex...]
            }
            samples.append(MetricSample(name: String(series[..<brace]), labels: labels, value: value))
        }
        self.samples = samples
    }

    /// The samples of `name` whose labels include `labels`.
    func samples(_ name: String, _ labels: [String: String] = [:]) -> [MetricSample] {
        samples.filter { sample in sample.name == name && labels.allSatisfy { sample.labels[$0.key] == $0.value } }
    }

    /// The sum of those samples' values; nil when there is none.
    func value(_ name: String, _ labels: [String: String] = [:]) -> Double? {
        let found = samples(name, labels)
        return found.isEmpty ? nil : found.reduce(0) { $0 + $1.value }
    }
}

/// GETs `url` and parses the answer as metrics; nil unless it answered 200 with the text format's content type.
func scrape(_ client: HTTPClient, _ url: String) async throws -> Scrape? {
    let response = try await client.execute(HTTPClientRequest(url: url), timeout: .seconds(10))
    let body = try await response.body.collect(upTo: 16 << 20)
    guard response.status.code == 200, response.headers.first(name: "content-type")?.hasPrefix("text/plain") == true
    else { return nil }
    return Scrape(String(buffer: body))
}

/// Whether a histogram's buckets are sane: counts never fall as `le` grows, and `+Inf` holds every observation.
func histogramIsConsistent(_ scrape: Scrape, _ name: String, _ labels: [String: String]) -> Bool {
    let buckets = scrape.samples(name + "_bucket", labels).compactMap { sample -> (Double, Double)? in
        guard let bound = sample.labels["le"] else { return nil }
        return (bound == "+Inf" ? .infinity : Double(bound) ?? .nan, sample.value)
    }.sorted { $0.0 < $1.0 }
    guard let count = scrape.value(name + "_count", labels), let last = buckets.last, last.0 == .infinity else {
        return false
    }
    return zip(buckets, buckets.dropFirst()).allSatisfy { $0.1 <= $1.1 } && last.1 == count
}

extension RelayProcessTests {
    /// Two `shoal serve --metrics` nodes that wrote the same row apart: they converge, and each one's `/metrics`
    /// says so: rounds with the other counted, their durations in a histogram, the conflict counted under its table,
    /// nothing queued, nothing stale, the peer connected.
    @Test func nodesServeTheirSyncHealthAsPrometheusMetrics() async throws {
        let world = try await RelayWorld("metrics-nodes", nodes: ["a", "b"])
        defer { world.tearDown() }
        // Written apart, before either node runs: the same row with two values (a conflict), and rows of each.
        try await world.write("a", "INSERT INTO kv VALUES ('shared', 'from a'), ('a1', 1), ('a2', 2)")
        try await world.write("b", "INSERT INTO kv VALUES ('shared', 'from b'), ('b1', 1)")
        let metricsOption = ["--metrics", "127.0.0.1:0", "--collect-deletes"]
        let a = try await world.serve("a", relay: false, extra: metricsOption)
        let b = try await world.serve("b", relay: false, peers: ["a"], extra: metricsOption)
        var urls: [String: String] = [:]
        for (name, process) in [("a", a), ("b", b)] {
            let line = await process.line(within: 30) { $0.hasPrefix("metrics listening on ") }
            let address = try #require(line, "node \(name) never said where its metrics are: \(process.output)")
            urls[name] = "http://" + address.dropFirst("metrics listening on ".count) + "/metrics"
        }
        #expect(try await world.converge(["a", "b"]))
        try await world.write("a", "INSERT INTO kv VALUES ('a3', 3)")
        #expect(try await world.converge(["a", "b"]))
        let sites = [
            "a": try #require(try await world.status("a")["site"] as? String),
            "b": try #require(try await world.status("b")["site"] as? String),
        ]
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }

        var scrapes: [String: Scrape] = [:]
        for (name, other) in [("a", "b"), ("b", "a")] {
            let peer = ["peer": sites[other]!]
            // Counted as they happen and sampled every second: wait (with a deadline) until the sampled gauges
            // have caught up with the convergence.
            var last: Scrape?
            let settled = try await waitUntil(within: 20, checkingEvery: 200) {
                last = try await scrape(client, urls[name]!)
                guard let last else { return false }
                return (last.value("shoal_node_rounds_total", peer.merging(["result": "ok"]) { $1 }) ?? 0) >= 1
                    && (last.value("shoal_node_round_duration_seconds_count", peer) ?? 0) >= 1
                    && last.value("shoal_node_queue_depth") == 0
                    && last.value("shoal_node_peer_staleness_seconds", peer) == 0
                    && last.value("shoal_node_peers_connected") == 1
            }
            let metrics = try #require(last)
            #expect(settled, "node \(name)'s metrics did not settle:\n\(metrics.text)\n\(world.outputs)")
            scrapes[name] = metrics
            let ok = try #require(metrics.value("shoal_node_rounds_total", peer.merging(["result": "ok"]) { $1 }))
            let failed = try #require(
                metrics.value("shoal_node_rounds_total", peer.merging(["result": "failed"]) { $1 })
            )
            #expect(ok >= 1 && failed >= 0 && ok > failed)
            // One duration per round finished, each a few milliseconds to a few seconds on loopback.
            let count = try #require(metrics.value("shoal_node_round_duration_seconds_count", peer))
            let sum = try #require(metrics.value("shoal_node_round_duration_seconds_sum", peer))
            #expect(count >= 1 && count <= ok + 1)
            #expect(sum >= 0 && sum / count < 10)
            #expect(histogramIsConsistent(metrics, "shoal_node_round_duration_seconds", peer))
            #expect(metrics.value("shoal_node_peer_gap_transactions", peer) == 0)
            #expect(metrics.value("shoal_node_catchup_remaining_changes", peer) == 0)
        }
        // Each node applied the other's rows; the row both wrote is a conflict, counted under its table by whichever
        // node received the other value (perhaps both).
        #expect((scrapes["a"]!.value("shoal_node_changes_applied_total", ["peer": sites["b"]!]) ?? 0) >= 1)
        #expect((scrapes["b"]!.value("shoal_node_changes_applied_total", ["peer": sites["a"]!]) ?? 0) >= 3)
        let conflicts =
            (scrapes["a"]!.value("shoal_node_conflicts_total", ["table": "kv"]) ?? 0)
            + (scrapes["b"]!.value("shoal_node_conflicts_total", ["table": "kv"]) ?? 0)
        #expect(conflicts >= 1, "no conflict counted:\n\(scrapes["a"]!.text)\n\(scrapes["b"]!.text)")
        #expect(
            scrapes.values.allSatisfy {
                $0.samples("shoal_node_conflicts_total").allSatisfy { $0.labels["table"] == "kv" }
            }
        )

        // A delete both members hold is collected on both: counted, and no member waits to be heard from.
        try await world.write("a", "DELETE FROM kv WHERE k = 'a1'")
        for name in ["a", "b"] {
            var last: Scrape?
            let collected = try await waitUntil(within: 30, checkingEvery: 200) {
                last = try await scrape(client, urls[name]!)
                return (last?.value("shoal_node_tombstones_collected_total") ?? 0) >= 1
                    && last?.value("shoal_node_collection_waiting_members") == 0
            }
            #expect(collected, "node \(name) did not count the collection:\n\(last?.text ?? "")")
        }

        // Only /metrics is served.
        let other = try await client.execute(HTTPClientRequest(url: urls["a"]! + "x"), timeout: .seconds(10))
        #expect(other.status.code == 404)
    }

    /// Two nodes sync only through a relay run with `--metrics`: the relay's `/metrics` counts requests
    /// by route pattern and status, change sets and bytes in and out, its storage by cluster, and open connections;
    /// the nodes count their relay pushes and pulls.
    @Test func theRelayServesRequestsChangeSetsAndStorageAsPrometheusMetrics() async throws {
        let world = try await RelayWorld("metrics-relay", nodes: ["a", "b"], relayArguments: ["--metrics"])
        defer { world.tearDown() }
        let a = try await world.serve("a", extra: ["--metrics", "127.0.0.1:0"])
        try await world.serve("b")
        // Both write, so that each pulls the other's upload (a long-poll answered at once, not after its 25 s).
        try await world.write("a", "INSERT INTO kv VALUES ('through the relay', 1), ('and another', 2)")
        try await world.write("b", "INSERT INTO kv VALUES ('from b', 3)")
        #expect(try await world.converge(["a", "b"]))
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }

        let relayURL = world.relayURL + "/metrics"
        var last: Scrape?
        let settled = try await waitUntil(within: 20, checkingEvery: 200) {
            last = try await scrape(client, relayURL)
            guard let last else { return false }
            return (last.value("shoal_relay_changesets_total", ["direction": "in"]) ?? 0) >= 1
                && (last.value("shoal_relay_changesets_total", ["direction": "out"]) ?? 0) >= 1
        }
        let metrics = try #require(last, "the relay did not serve /metrics:\n\(world.outputs)")
        #expect(settled, "the relay's metrics did not count the traffic:\n\(metrics.text)")
        // Requests by route pattern and status: the upload, the pulls, the heads; every route a pattern of the API.
        #expect(
            (metrics.value(
                "shoal_relay_requests_total",
                ["method": "POST", "route": "/v1/changesets", "status": "200"]
            ) ?? 0) >= 1
        )
        #expect(
            (metrics.value("shoal_relay_requests_total", ["method": "POST", "route": "/v1/pull", "status": "200"]) ?? 0)
                >= 1
        )
        #expect(
            (metrics.value("shoal_relay_requests_total", ["method": "GET", "route": "/v1/heads", "status": "200"]) ?? 0)
                >= 1
        )
        let routes = Set(metrics.samples("shoal_relay_requests_total").compactMap { $0.labels["route"] })
        #expect(routes.allSatisfy { $0.hasPrefix("/v1/") || $0 == "/metrics" || $0 == "unmatched" }, "\(routes)")
        #expect(
            histogramIsConsistent(
                metrics,
                "shoal_relay_request_duration_seconds",
                ["method": "POST", "route": "/v1/changesets"]
            )
        )
        // Change sets and their bytes, both ways; what was stored.
        let bytesIn = try #require(metrics.value("shoal_relay_changeset_bytes_total", ["direction": "in"]))
        let bytesOut = try #require(metrics.value("shoal_relay_changeset_bytes_total", ["direction": "out"]))
        #expect(bytesIn > 0 && bytesOut > 0)
        #expect((metrics.value("shoal_relay_changesets_stored_total") ?? 0) >= 1)
        // Open connections: each node's long-poll (kept open between pulls too), and this scrape's.
        #expect((metrics.value("shoal_relay_connections") ?? 0) >= 3)
        // Storage by cluster, read at the scrape; no snapshot age: the nodes wrote too little to make a snapshot.
        #expect((metrics.value("shoal_relay_storage_ranges", ["cluster": world.clusterID]) ?? 0) >= 1)
        #expect((metrics.value("shoal_relay_storage_bytes", ["cluster": world.clusterID]) ?? 0) > 0)
        #expect(metrics.samples("shoal_relay_snapshot_age_seconds").isEmpty)
        // An unknown path is counted as unmatched, never by its raw path.
        _ = try await client.execute(
            HTTPClientRequest(url: world.relayURL + "/no/such/path/12345"),
            timeout: .seconds(10)
        )
        let after = try #require(try await scrape(client, relayURL))
        #expect((after.value("shoal_relay_requests_total", ["route": "unmatched", "status": "404"]) ?? 0) >= 1)
        #expect(!after.text.contains("12345"))

        // The uploading node counted its pushes and pulls with the relay.
        let line = await a.line(within: 30) { $0.hasPrefix("metrics listening on ") }
        let nodeURL = "http://" + (try #require(line)).dropFirst("metrics listening on ".count) + "/metrics"
        var node: Scrape?
        #expect(
            try await waitUntil(within: 20, checkingEvery: 200) {
                node = try await scrape(client, nodeURL)
                return (node?.value("shoal_node_relay_rounds_total", ["operation": "push", "result": "ok"]) ?? 0) >= 1
                    && (node?.value("shoal_node_relay_rounds_total", ["operation": "pull", "result": "ok"]) ?? 0) >= 1
                    && node?.value("shoal_node_relay_lacking_transactions") == 0
                    && node?.value("shoal_node_relay_staleness_seconds") == 0
                    && node?.value("shoal_node_peer_gap_transactions", ["peer": "relay"]) == 0
                    && node?.value("shoal_node_peer_staleness_seconds", ["peer": "relay"]) == 0
            },
            "node a's relay metrics:\n\(node?.text ?? "none")"
        )
        #expect((node?.value("shoal_node_relay_push_duration_seconds_count") ?? 0) >= 1)
        // The relay is a peer like the others: its rounds (pushes and pulls) under the peers' name, `peer="relay"`.
        let relayRounds = try #require(node?.value("shoal_node_rounds_total", ["peer": "relay", "result": "ok"]))
        let pushes = try #require(node?.value("shoal_node_relay_rounds_total", ["operation": "push", "result": "ok"]))
        let pulls = try #require(node?.value("shoal_node_relay_rounds_total", ["operation": "pull", "result": "ok"]))
        // Counted at once with the relay's own (a scrape may fall between the two increments of one round).
        #expect(relayRounds >= 2 && abs(relayRounds - (pushes + pulls)) <= 1, "\(node?.text ?? "")")
        #expect((node?.value("shoal_node_changes_applied_total", ["peer": "relay"]) ?? 0) >= 1)
    }

    /// Without `--metrics` the relay has no `/metrics` route: an operator turns it on knowingly.
    @Test func theRelayServesNoMetricsUnlessAsked() async throws {
        let world = try await RelayWorld("metrics-off", nodes: ["a"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let response = try await client.execute(
            HTTPClientRequest(url: world.relayURL + "/metrics"),
            timeout: .seconds(10)
        )
        #expect(response.status.code == 404)
    }

    /// An app writing fast (300 commits in about a second, on its own connection) beside a node that syncs only
    /// through a relay: the node's uploads and its peer's pulls are paced, so the relay (limited here to 100 requests
    /// a second, bursts of 200) never refuses one (429, which would hold the cluster up for a second), and the peer
    /// never sends back what it pulled (every change set that came in was new). Both files end with the same rows,
    /// read with plain SQLite.
    @Test func aBusyWriterNeitherFloodsTheRelayNorHasItsChangesSentBack() async throws {
        let world = try await RelayWorld(
            "busy-writer", nodes: ["a", "b"], relayArguments: ["--metrics", "--rate-limit", "100"]
        )
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        let writes = 300
        let path = world.paths["a"]!
        try await offPool {
            let app = try SQLiteConnection(path: path)
            try app.exec("PRAGMA busy_timeout = 30000")
            for index in 0..<writes {
                _ = try app.rows("INSERT INTO kv VALUES (?, ?)", [.text("key \(index)"), .integer(Int64(index))])
                usleep(3_000)  // the app's pace: about 300 commits a second, each its own
            }
        }
        #expect(try await world.converge(["a", "b"]), "\(world.outputs)")
        let same = try await offPool {
            let a = try SQLiteConnection(path: world.paths["a"]!).applicationTableContents()
            return (a == (try SQLiteConnection(path: world.paths["b"]!).applicationTableContents()), a["kv"]?.count)
        }
        #expect(same.0 && same.1 == writes, "\(same)")

        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let metrics = try #require(try await scrape(client, world.relayURL + "/metrics"))
        let refused = metrics.samples("shoal_relay_requests_total").filter { $0.labels["status"] == "429" }
        let requests = metrics.samples("shoal_relay_requests_total").reduce(0) { $0 + $1.value }
        #expect(refused.isEmpty, "the relay refused requests (\(requests) in all):\n\(metrics.text)\n\(world.outputs)")
        let received = try #require(metrics.value("shoal_relay_changesets_total", ["direction": "in"]))
        let stored = try #require(metrics.value("shoal_relay_changesets_stored_total"))
        #expect(received >= 1 && received == stored, "change sets in: \(received), stored: \(stored)")
    }
}
