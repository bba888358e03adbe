import ArgumentParser
import AsyncHTTPClient
import Foundation
import NIOCore
import Shoal
import ShoalProcesses

/// A relay the benchmark uses: its URL and a token for the cluster.
struct BenchRelay {
    let url: String
    let token: String

    /// The relay's heads for the token's cluster (`GET /v1/heads`), whatever its storage.
    func heads() throws -> VersionVector {
        var request = try HTTPClient.Request(url: url + RelayAPI.headsPath, method: .GET)
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        let response = try HTTPClient.shared.execute(request: request, deadline: .now() + .seconds(30)).wait()
        guard response.status == .ok, let body = response.body else {
            throw ServeError(message: "the relay answered \(response.status) to GET \(RelayAPI.headsPath)")
        }
        return try RelayAPI.vector(try JSONDecoder().decode(RelayHeads.self, from: Data(body.readableBytesView)).heads)
    }

    /// Whether the relay holds everything `goal` covers (false while it does not answer).
    func holds(_ goal: VersionVector) -> Bool {
        (try? heads().dominatesOrEquals(goal)) ?? false
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
    @Option(
        help: """
            PostgreSQL server (the URL Tools/start-postgres.sh prints): ingest and idle run on it too, beside SQLite, \
            and the reconnect part runs; each part makes a database of its own there and drops it.
            """
    )
    var postgres: String?
    @Option(help: "Idle live node connections held on one relay, for the idle part.") var idleConnections = 10_000
    @Option(help: "Seconds the idle connections are held (each long-poll waits 30 s, then is posted again).")
    var idleSeconds = 40
    @Option(help: "Clients that post pulls and never read the answers, for the slow part.") var slowReaders = 200
    @Option(help: "Seconds the slow readers are watched.") var slowSeconds = 45
    @Option(help: "Times a relay instance is killed under a node, for the reconnect part.") var reconnects = 20
    @Option(help: "Run one part only: ingest, catchup, propagation, idle, slow or reconnect (needs --postgres).")
    var only: String?

    func validate() throws {
        guard idleConnections >= 1, idleSeconds >= 1, slowReaders >= 1, slowSeconds >= 1, reconnects >= 1 else {
            throw ValidationError("counts and seconds must be at least 1")
        }
        guard only != "reconnect" || postgres != nil else {
            throw ValidationError("the reconnect part needs --postgres URL (two relay instances share one database)")
        }
    }

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
                let token = try RelayProcess.token(data: relayDirectory + "/data", cluster: cluster)
                return BenchRelay(url: relay.url, token: token)
            }
            figures += lan.map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_lan_"), $0.1) }
            figures += relayed.map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_relay_"), $0.1) }
        }
        if only == nil || only == "idle" {
            figures += try await RelayIdleConnections(
                count: idleConnections,
                seconds: idleSeconds,
                storage: ["--data", directory + "/idle/relay"],
                prefix: "relay_idle_"
            ).run(directory + "/idle")
            if let postgres {
                let database = try PostgresDatabase.create(server: postgres, name: "shoal_bench_idle_\(getpid())")
                defer { database.drop() }
                figures += try await RelayIdleConnections(
                    count: idleConnections,
                    seconds: idleSeconds,
                    storage: ["--postgres", database.url],
                    prefix: "relay_idle_postgres_"
                ).run(directory + "/idle-postgres")
            }
        }
        if only == nil || only == "slow" {
            figures += try await slowReaderMemory(directory + "/slow", sync: sync)
        }
        if let postgres, only == nil || only == "reconnect" {
            figures += try await RelayReconnect(server: postgres, times: reconnects)
                .run(directory + "/reconnect", sync: sync)
        }
        printFigures(figures, json: json, width: 38)
    }

    /// Fills a database with `count` rows (`rows` when nil) in transactions of 50,000, as an application would.
    func fill(_ store: Store, from start: Int = 0, count: Int? = nil) throws {
        let rows = count ?? self.rows
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

    /// Change sets cut and sealed beforehand from `rows` rows (as a node cuts them), in requests of about 8 MiB.
    struct Uploads {
        let seal: RelaySeal
        let requests: [[UInt8]]
        let changes: Int
        var bytes: Int { requests.reduce(0) { $0 + $1.count } }
    }

    /// Fills a source database in `directory` with `rows` rows and cuts their changes into uploads for cluster "bench".
    func makeUploads(_ directory: String, sync: SyncBenchmark, rows: Int? = nil) throws -> Uploads {
        let source = try sync.makeDatabase(directory + "/source.db", name: "source")
        try fill(source, count: rows)
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
        return Uploads(seal: seal, requests: requests, changes: changes)
    }

    /// Registers the uploads' key at `relay`, then posts them one at a time, authenticated as a node does it; returns
    /// the seconds the posts took (the key's registration not counted).
    @discardableResult
    func post(_ uploads: Uploads, to relay: BenchRelay) async throws -> Double {
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        var register = HTTPClientRequest(url: relay.url + RelayAPI.keysPath)
        register.method = .POST
        register.headers.add(name: "Authorization", value: "Bearer \(relay.token)")
        let key = RelayUploadKey(epoch: 0, key: Data(uploads.seal.uploadKey(0)!).base64EncodedString())
        register.body = .bytes(ByteBuffer(bytes: try JSONEncoder().encode(key)))
        let registered = try await client.execute(register, timeout: .seconds(30))
        _ = try await registered.body.collect(upTo: 1 << 20)
        guard registered.status == .ok else {
            throw ServeError(message: "the relay answered \(registered.status) to the key")
        }
        let started = Date()
        for body in uploads.requests {
            var request = HTTPClientRequest(url: relay.url + RelayAPI.changeSetsPath)
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(relay.token)")
            // Authenticated inside the timed part: the relay checks every upload.
            request.headers.add(name: RelayAPI.uploadEpochHeader, value: "0")
            request.headers.add(name: RelayAPI.uploadAuthHeader, value: uploads.seal.authenticate(body, epoch: 0)!)
            request.body = .bytes(ByteBuffer(bytes: body))
            let response = try await client.execute(request, timeout: .seconds(120))
            _ = try await response.body.collect(upTo: 1 << 20)
            guard response.status == .ok else { throw ServeError(message: "the relay answered \(response.status)") }
        }
        return Date().timeIntervalSince(started)
    }

    /// The relay's ingest alone: change sets cut and sealed beforehand, then posted in requests of about 8 MiB, one at
    /// a time, to a relay process on loopback: on SQLite, then (given `--postgres`) on PostgreSQL, the same requests.
    private func ingest(_ directory: String, sync: SyncBenchmark) async throws -> [(String, Double)] {
        let uploads = try makeUploads(directory, sync: sync)
        var figures: [(String, Double)] = []
        var storages: [(prefix: String, storage: [String], database: PostgresDatabase?)] = [
            ("relay_ingest_", ["--data", directory + "/relay"], nil)
        ]
        if let postgres {
            let database = try PostgresDatabase.create(server: postgres, name: "shoal_bench_ingest_\(getpid())")
            storages.append(("relay_ingest_postgres_", ["--postgres", database.url], database))
        }
        defer { for storage in storages { storage.database?.drop() } }
        for (prefix, storage, _) in storages {
            let process = try RelayProcess.start(storage: storage, log: directory + "/\(prefix)relay.log")
            defer { process.stop() }
            let relay = BenchRelay(url: process.url, token: try RelayProcess.token(storage: storage, cluster: "bench"))
            let seconds = try await post(uploads, to: relay)
            figures += [
                (prefix + "changes_per_s", Double(uploads.changes) / seconds),
                (prefix + "mb_per_s", Double(uploads.bytes) / 1_048_576 / seconds),
                (prefix + "seconds", seconds),
            ]
        }
        if storages.count == 2 {
            figures.append(("relay_ingest_postgres_over_sqlite", figures[3].1 / figures[0].1))
        }
        return figures
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
        let token = try RelayProcess.token(data: directory + "/relay", cluster: cluster)
        let relay = BenchRelay(url: relayProcess.url, token: token)
        let relayed = try sync.timeCatchUp(directory, source: source, target: relayTarget, targetName: "relayed", relay: relay)
        return [
            ("relay_catchup_seconds", relayed.seconds), ("relay_catchup_lan_seconds", lan.seconds),
            ("relay_catchup_over_lan", relayed.seconds / lan.seconds),
            ("relay_catchup_peak_rss_mb", relayed.catchingPeak),
        ]
    }
}
