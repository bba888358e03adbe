import ArgumentParser
import AsyncHTTPClient
import CSQLite
import Foundation
import NIOCore
import Shoal
import ShoalToolSupport

/// A relay process the benchmark uses: its URL, a token for the cluster, and its data directory (whose database
/// tells how far each site's uploads got).
struct BenchRelay {
    let url: String
    let token: String
    let data: String

    /// Whether the relay holds everything `goal` covers.
    func holds(_ goal: VersionVector) -> Bool {
        var database: OpaquePointer?
        guard sqlite3_open_v2(data + "/relay.sqlite", &database, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else {
            sqlite3_close(database)
            return false
        }
        defer { sqlite3_close(database) }
        sqlite3_busy_timeout(database, 1000)
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(database, "SELECT site, head FROM heads", -1, &statement, nil) == SQLITE_OK else {
            return false
        }
        defer { sqlite3_finalize(statement) }
        var heads = VersionVector()
        while sqlite3_step(statement) == SQLITE_ROW {
            let count = Int(sqlite3_column_bytes(statement, 0))
            guard let bytes = sqlite3_column_blob(statement, 0),
                let site = SiteID(bytes: UnsafeRawBufferPointer(start: bytes, count: count))
            else { continue }
            heads.advance(site, to: UInt64(sqlite3_column_int64(statement, 1)))
        }
        return heads.dominatesOrEquals(goal)
    }
}

struct RelayBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "The relay: upload ingest, a fresh node's catch-up through it against the LAN's, added propagation."
    )

    @Flag(help: "Print one JSON object instead of a table.") var json = false
    @Option(help: "Rows (3 non-key columns each) for ingest and catch-up.") var rows = 1_000_000
    @Option(help: "Writes per second on one node, for propagation.") var writeRate = 200
    @Option(help: "Seconds of writes for propagation.") var propagationSeconds = 5
    @Option(help: "Run one part only: ingest, catchup or propagation.") var only: String?

    func run() async throws {
        let directory = NSTemporaryDirectory() + "shoal-relay-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let sync = try SyncBenchmark.parse(["--rows", "\(rows)"])
        var figures: [(String, Double)] = []
        if only == nil || only == "ingest" { figures += try await ingest(directory + "/ingest", sync: sync) }
        if only == nil || only == "catchup" { figures += try catchUp(directory + "/catchup", sync: sync) }
        if only == nil || only == "propagation" {
            let relayDirectory = directory + "/propagation-relay"
            try FileManager.default.createDirectory(atPath: relayDirectory, withIntermediateDirectories: true)
            var started: RelayProcess?
            defer { started?.stop() }
            let viaRelay = try SyncBenchmark.parse([
                "--propagation-nodes", "2", "--write-rate", "\(writeRate)", "--propagation-seconds", "\(propagationSeconds)",
            ])
            let lan = try await viaRelay.propagation(directory + "/propagation-lan")
            let relayed = try await viaRelay.propagation(directory + "/propagation") { cluster in
                let relay = try RelayProcess.start(data: relayDirectory + "/data")
                started = relay
                return BenchRelay(
                    url: relay.url,
                    token: try RelayProcess.token(data: relayDirectory + "/data", cluster: cluster),
                    data: relayDirectory + "/data"
                )
            }
            figures += lan.map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_lan_"), $0.1) }
            figures += relayed.map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_relay_"), $0.1) }
        }
        printFigures(figures, json: json, width: 34)
    }

    /// Fills a database with `rows` rows in transactions of 50,000, as an application would.
    private func fill(_ store: Store, from start: Int = 0) throws {
        let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
        var id = start
        while id < start + rows {
            try store.transaction {
                for _ in 0..<min(50_000, start + rows - id) {
                    try insert.execute([
                        .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                    ])
                    id += 1
                }
            }
        }
    }

    /// The relay's ingest alone: change sets cut and sealed beforehand (as a node cuts them), then posted in requests
    /// of about 8 MiB, one at a time, to a relay process on loopback.
    private func ingest(_ directory: String, sync: SyncBenchmark) async throws -> [(String, Double)] {
        let source = try sync.makeDatabase(directory + "/source.db", name: "source")
        try fill(source)
        let seal = RelaySeal(clusterSecret: (0..<32).map { _ in UInt8.random(in: 0...255) })
        var chunker = RelayChunker(cluster: "bench", seal: seal, heads: VersionVector(), pieceBytes: 1024 * 1024)
        let cursor = try source.deltaCursor(since: VersionVector())
        var requests: [[UInt8]] = []
        var pending: [RelayEnvelope] = []
        var pendingBytes = 0
        var changes = 0
        while let batch = try source.nextBatch(cursor, maxChanges: 20_000, maxBytes: 1024 * 1024) {
            changes += batch.changes.count
            for envelope in try chunker.envelopes(for: batch) {
                pending.append(envelope)
                pendingBytes += envelope.encodedCount
                if pendingBytes >= 8 * 1024 * 1024 {
                    requests.append(RelayEnvelopeList.encode(pending))
                    pending = []
                    pendingBytes = 0
                }
            }
        }
        if !pending.isEmpty { requests.append(RelayEnvelopeList.encode(pending)) }
        let relay = try RelayProcess.start(data: directory + "/relay")
        defer { relay.stop() }
        let token = try RelayProcess.token(data: directory + "/relay", cluster: "bench")
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        var register = HTTPClientRequest(url: relay.url + RelayAPI.keysPath)
        register.method = .POST
        register.headers.add(name: "Authorization", value: "Bearer \(token)")
        let key = RelayUploadKey(epoch: 0, key: Data(seal.uploadKey(0)!).base64EncodedString())
        register.body = .bytes(ByteBuffer(bytes: try JSONEncoder().encode(key)))
        _ = try await client.execute(register, timeout: .seconds(30)).body.collect(upTo: 1 << 20)
        let started = Date()
        var bytes = 0
        for body in requests {
            var request = HTTPClientRequest(url: relay.url + RelayAPI.changeSetsPath)
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
            // Authenticated as a node does it, inside the timed part: the relay checks every upload.
            request.headers.add(name: RelayAPI.uploadEpochHeader, value: "0")
            request.headers.add(name: RelayAPI.uploadAuthHeader, value: seal.authenticate(body, epoch: 0)!)
            request.body = .bytes(ByteBuffer(bytes: body))
            let response = try await client.execute(request, timeout: .seconds(120))
            _ = try await response.body.collect(upTo: 1 << 20)
            guard response.status == .ok else { throw ServeError(message: "the relay answered \(response.status)") }
            bytes += body.count
        }
        let seconds = Date().timeIntervalSince(started)
        return [
            ("relay_ingest_changes_per_s", Double(changes) / seconds),
            ("relay_ingest_mb_per_s", Double(bytes) / 1_048_576 / seconds),
            ("relay_ingest_seconds", seconds),
        ]
    }

    /// A fresh node catches up `rows` rows: from a LAN peer, then through the relay (the source uploaded first).
    private func catchUp(_ directory: String, sync: SyncBenchmark) throws -> [(String, Double)] {
        let source = try sync.makeDatabase(directory + "/source.db", name: "source")
        try fill(source)
        let lanTarget = try sync.makeDatabase(directory + "/lan.db", name: "lan")
        let lan = try sync.timeCatchUp(directory, source: source, target: lanTarget, targetName: "lan")
        let relayTarget = try sync.makeDatabase(directory + "/relayed.db", name: "relayed")
        let relayProcess = try RelayProcess.start(data: directory + "/relay")
        defer { relayProcess.stop() }
        let cluster = try KeyFile.load(forDatabase: directory + "/source.db").cluster.idHex
        let relay = BenchRelay(
            url: relayProcess.url,
            token: try RelayProcess.token(data: directory + "/relay", cluster: cluster),
            data: directory + "/relay"
        )
        let relayed = try sync.timeCatchUp(directory, source: source, target: relayTarget, targetName: "relayed", relay: relay)
        return [
            ("relay_catchup_seconds", relayed.seconds), ("relay_catchup_lan_seconds", lan.seconds),
            ("relay_catchup_over_lan", relayed.seconds / lan.seconds),
            ("relay_catchup_peak_rss_mb", relayed.catchingPeak),
        ]
    }
}
