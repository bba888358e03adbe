import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import Shoal
import ShoalProcesses

struct SyncBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Catch-up, propagation latency, idle-round cost and convergence of real shoal serve processes."
    )

    @Flag(help: "Print one JSON object instead of a table.") var json = false
    @Option(help: "Rows for the catch-up (3 non-key columns each).") var rows = 1_000_000
    @Option(help: "Rows of the one transaction for the one-transaction catch-up.") var oneTransactionRows = 300_000
    @Option(help: "Nodes for the propagation figure.") var propagationNodes = 8
    @Option(help: "Writes per second on one node, for propagation.") var writeRate = 200
    @Option(help: "Seconds of writes for propagation.") var propagationSeconds = 5
    @Option(help: "Nodes in the chain for the relayed-hops figure (each dials only the one before).") var chainNodes = 10
    @Option(help: "Nodes of the random 3-regular mesh (each linked to three others; an even number).")
    var regularMeshNodes = 16
    @Option(help: "Nodes for the convergence figure.") var convergeNodes = 16
    @Option(help: "Concurrent writes per node for convergence.") var convergeWrites = 1_000
    @Option(help: "Rows already in the table for the big-table propagation figure.") var bigRows = 2_000_000
    @Option(help: "Nodes for the big-table propagation figure.") var bigNodes = 2
    @Option(help: "Rows of 4 KB blobs for the blob catch-up (written 100 to a transaction).") var blobRows = 20_000
    @Option(help: "Size in MiB of the one large value sent on its own.") var bigValueMiB = 64
    @Option(help: "Rows of JSON documents (a few KB each) for the text catch-up, compressed against raw.")
    var textRows = 20_000
    @Option(help: "Timed runs of each mode for the text catch-up (the median is reported).") var textRuns = 3
    @Option(help: "Connections timed for the handshake figure.") var handshakes = 300
    @Option(help: "Rows deleted for the collection figures (three TLS members; then again with one away).")
    var collectRows = 100_000
    @Option(help: "Milliseconds between the app's inserts, for app-writer.") var appWriteInterval = 5
    @Option(help: "The app connection's busy timeout in milliseconds, for app-writer.") var appBusyTimeout = 5_000
    @Option(
        help: """
            Run one part only: handshake, catchup, one-transaction, text, blobs, bigvalue, propagation, propagation-plaintext, \
            propagation-big, chain, regular-mesh, idle, idle-cost, converge, collect, or app-writer (not run by default).
            """
    )
    var only: String?

    func run() async throws {
        let directory = NSTemporaryDirectory() + "shoal-sync-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var figures: [(String, Double)] = []
        if only == nil || only == "handshake" {
            figures += try await HandshakeBenchmark.run(directory + "/handshake", connections: handshakes)
        }
        if only == nil || only == "catchup" { figures += try catchUp(directory + "/catchup") }
        if only == nil || only == "one-transaction" { figures += try oneTransaction(directory + "/one-transaction") }
        if only == nil || only == "text" { figures += try await textCatchUp(directory + "/text") }
        if only == nil || only == "blobs" { figures += try blobCatchUp(directory + "/blobs") }
        if only == nil || only == "bigvalue" { figures += try bigValue(directory + "/bigvalue") }
        if only == nil || only == "propagation" { figures += try await propagation(directory + "/propagation") }
        if only == nil || only == "propagation-plaintext" {
            figures += try await propagation(directory + "/propagation-plaintext", plaintext: true)
                .map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_plaintext_"), $0.1) }
        }
        if only == nil || only == "propagation-big" {
            figures += try await propagation(directory + "/propagation-big", nodeCount: bigNodes, preload: bigRows)
                .map { ($0.0.replacingOccurrences(of: "propagation_", with: "propagation_big_"), $0.1) }
        }
        if only == nil || only == "chain" {
            // A write reaches the end of a chain only through every node in between: each hop must push it on.
            let figures_ = try await propagation(directory + "/chain", nodeCount: chainNodes, chain: true)
            figures += figures_.map { ($0.0.replacingOccurrences(of: "propagation_", with: "chain_last_"), $0.1) }
            if let p50 = figures_.first(where: { $0.0 == "propagation_p50_ms" })?.1 {
                figures.append(("chain_per_hop_p50_ms", p50 / Double(chainNodes - 1)))
            }
        }
        if only == nil || only == "regular-mesh" {
            // Each node linked to three others at random: a write crosses several hops to reach the far nodes.
            let links = try Self.randomRegularGraph(nodes: regularMeshNodes, degree: 3, seed: 23)
            figures += try await propagation(directory + "/regular-mesh", nodeCount: regularMeshNodes, links: links)
                .map { ($0.0.replacingOccurrences(of: "propagation_", with: "regular_mesh_"), $0.1) }
        }
        if only == nil || only == "idle" { figures += try await idleRound(directory + "/idle") }
        if only == nil || only == "idle-cost" { figures += try await idleCost(directory + "/idle-cost") }
        if only == nil || only == "converge" { figures += try await converge(directory + "/converge") }
        if only == nil || only == "collect" { figures += try await collect(directory + "/collect") }
        if only == "app-writer" { figures += try appWriter(directory + "/app-writer") }
        printFigures(figures, json: json, width: 40)
    }

    func makeDatabase(_ path: String, name: String) throws -> Store {
        try? FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent,
            withIntermediateDirectories: true
        )
        var options = StoreOptions()
        options.nodeName = name
        let store = try Store(path: path, options: options)
        try store.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER, c REAL)")
        try store.replicate(table: "t")
        return store
    }

    /// A fresh node catches up `rows` rows from another over loopback.
    private func catchUp(_ directory: String) throws -> [(String, Double)] {
        let source = try makeDatabase(directory + "/source.db", name: "source")
        let insert = try source.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
        var id = 0
        while id < rows {
            // Bounded transactions, as an application filling a database would make them.
            try source.transaction {
                for _ in 0..<min(50_000, rows - id) {
                    try insert.execute([
                        .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                    ])
                    id += 1
                }
            }
        }
        // The same catch-up without TLS first, into a database of its own: TLS's cost as a ratio.
        let plainTarget = try makeDatabase(directory + "/plain.db", name: "plain")
        let plain = try timeCatchUp(directory, source: source, target: plainTarget, targetName: "plain", plaintext: true)
        let target = try makeDatabase(directory + "/target.db", name: "target")
        let timed = try timeCatchUp(directory, source: source, target: target)
        // What the caught-up node keeps per row, its digest folded: the data table's pages, and every other table's
        // (Shoal's metadata), from SQLite's dbstat (which counts pages still in the write-ahead log too).
        _ = try target.digest()
        var metadata: [String: Double] = [:]
        var data = 0.0
        for row in try target.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").rows {
            guard case .text(let name) = row[0], let bytes = row[1].integerValue else { continue }
            if name == "t" || name.hasPrefix("sqlite_autoindex_t_") {
                data += Double(bytes)
            } else if name != "sqlite_schema" {
                metadata[name.hasPrefix("shoal_clock_") ? "shoal_clock" : name, default: 0] += Double(bytes)
            }
        }
        let perRow = { (bytes: Double) in bytes / Double(rows) }
        return [
            ("catchup_data_bytes_per_row", perRow(data)),
            ("catchup_metadata_bytes_per_row", perRow(metadata.values.reduce(0, +))),
            ("catchup_metadata_over_data", metadata.values.reduce(0, +) / max(data, 1)),
            ("catchup_row_metadata_bytes_per_row", perRow(metadata["shoal_clock"] ?? 0)),
            ("catchup_row_hashes_bytes_per_row", perRow(metadata["shoal_row_hashes"] ?? 0)),
            ("catchup_change_log_bytes_per_row", perRow(metadata["shoal_log"] ?? 0)),
            ("catchup_seconds", timed.seconds), ("catchup_rows_per_s", Double(rows) / timed.seconds),
            ("catchup_plaintext_seconds", plain.seconds), ("catchup_tls_over_plaintext", timed.seconds / plain.seconds),
            ("catchup_peak_rss_mb", timed.peak), ("catchup_serving_peak_rss_mb", timed.servingPeak),
            ("catchup_catching_peak_rss_mb", timed.catchingPeak),
        ]
    }

    /// A fresh node catches up one transaction of `oneTransactionRows` rows (a bulk import made at once), over TLS:
    /// it crosses the link in many batches and is applied in many slices.
    private func oneTransaction(_ directory: String) throws -> [(String, Double)] {
        let source = try makeDatabase(directory + "/source.db", name: "source")
        try source.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < \(oneTransactionRows)) "
                + "INSERT INTO t(id, a, b, c) SELECT i, 'row ' || i, i * 7, i / 3.0 FROM n"
        )
        let target = try makeDatabase(directory + "/target.db", name: "target")
        let timed = try timeCatchUp(directory, source: source, target: target)
        return [
            ("one_transaction_rows", Double(oneTransactionRows)), ("one_transaction_seconds", timed.seconds),
            ("one_transaction_rows_per_s", Double(oneTransactionRows) / timed.seconds),
            ("one_transaction_peak_rss_mb", timed.peak),
        ]
    }

    private func makeBlobDatabase(_ path: String, name: String) throws -> Store {
        try? FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent,
            withIntermediateDirectories: true
        )
        var options = StoreOptions()
        options.nodeName = name
        let store = try Store(path: path, options: options)
        try store.execute("CREATE TABLE IF NOT EXISTS files(id INTEGER PRIMARY KEY, name TEXT, data BLOB)")
        try store.replicate(table: "files")
        return store
    }

    /// Starts a node on `source`, then a fresh one on `target` dialling it, and times until the target holds
    /// everything (checked by digest); returns the seconds and the peak resident memory (VmHWM) of each process and
    /// their sum (the sum of the two peaks, which may come at different moments: an upper bound of the peak of the sum).
    func timeCatchUp(
        _ directory: String,
        source: Store,
        target: Store,
        targetName: String = "target",
        plaintext: Bool = false,
        relay: BenchRelay? = nil
    ) throws -> (seconds: Double, peak: Double, servingPeak: Double, catchingPeak: Double) {
        let goal = try source.versionVector()
        let extra = plaintext ? ["--insecure-plaintext"] : []
        let relayArguments = relay.map { ["--relay", $0.url, "--relay-token", $0.token] } ?? []
        if !plaintext {
            try Membership.formLocally(
                [directory + "/source.db", directory + "/\(targetName).db"],
                now: SystemWallClock().nowMilliseconds()
            )
        }
        let serving = try ServeProcess.startIsolated(
            database: directory + "/source.db",
            name: "source",
            peers: [],
            extra: extra + relayArguments
        )
        defer { serving.stop() }
        if let relay {
            // Through the relay, the source first uploads everything (not timed): the fresh node then pulls it all.
            let deadline = Date().addingTimeInterval(900)
            while !relay.holds(goal) {
                guard Date() < deadline else { throw ServeError(message: "the upload to the relay stalled") }
                Thread.sleep(forTimeInterval: 0.05)  // polling the relay's database, not synchronisation
            }
        }
        let started = Date()
        let catching = try ServeProcess.startIsolated(
            database: directory + "/\(targetName).db",
            name: targetName,
            peers: relay == nil ? [serving.port] : [],
            extra: extra + relayArguments
        )
        defer { catching.stop() }
        var servingPeak = 0.0
        var catchingPeak = 0.0
        func sample() {
            servingPeak = max(servingPeak, serving.peakResidentMiB ?? 0)
            catchingPeak = max(catchingPeak, catching.peakResidentMiB ?? 0)
        }
        while try !target.versionVector().dominatesOrEquals(goal) {
            sample()
            guard Date().timeIntervalSince(started) < 600 else { throw ServeError(message: "catch-up stalled") }
            Thread.sleep(forTimeInterval: 0.02)  // sampling, not synchronisation
        }
        let seconds = Date().timeIntervalSince(started)
        sample()
        // The two members go on writing their report rows (what each holds) after the catch-up: they converge on
        // those too within a few rounds, not at the very moment the rows arrived.
        let settled = Date().addingTimeInterval(60)
        while try target.digest() != source.digest() {
            guard Date() < settled else { throw ServeError(message: "catch-up diverged") }
            Thread.sleep(forTimeInterval: 0.05)  // polling both files, not synchronisation
        }
        return (seconds, servingPeak + catchingPeak, servingPeak, catchingPeak)
    }

    /// A fresh node catches up rows carrying 4 KB blobs (batches cut by bytes).
    private func blobCatchUp(_ directory: String) throws -> [(String, Double)] {
        let source = try makeBlobDatabase(directory + "/source.db", name: "source")
        let insert = try source.prepare("INSERT INTO files(id, name, data) VALUES (?, ?, randomblob(4096))")
        var id = 0
        while id < blobRows {
            try source.transaction {
                for _ in 0..<min(100, blobRows - id) {
                    try insert.execute([.integer(Int64(id)), .text("file \(id)")])
                    id += 1
                }
            }
        }
        let target = try makeBlobDatabase(directory + "/target.db", name: "target")
        let timed = try timeCatchUp(directory, source: source, target: target)
        let megabytes = Double(blobRows) * 4096 / 1_000_000
        return [
            ("blob_catchup_seconds", timed.seconds), ("blob_catchup_mb_per_s", megabytes / timed.seconds),
            ("blob_catchup_peak_rss_mb", timed.peak),
        ]
    }

    /// A fresh node receives one large value (in pieces).
    private func bigValue(_ directory: String) throws -> [(String, Double)] {
        let source = try makeBlobDatabase(directory + "/source.db", name: "source")
        try source.execute("INSERT INTO files(id, name, data) VALUES (1, 'big', randomblob(\(bigValueMiB) * 1048576))")
        let target = try makeBlobDatabase(directory + "/target.db", name: "target")
        let timed = try timeCatchUp(directory, source: source, target: target)
        return [("big_value_seconds", timed.seconds), ("big_value_peak_rss_mb", timed.peak)]
    }

    /// Writes on one node at a steady rate; the time until each write is visible on every other node. With
    /// `preload`, the table first holds that many rows on every node (written on one, caught up by the others).
    func propagation(
        _ directory: String,
        nodeCount: Int? = nil,
        preload: Int = 0,
        plaintext: Bool = false,
        chain: Bool = false,
        links: [[Int]]? = nil,
        relay: ((String) throws -> BenchRelay)? = nil
    ) async throws -> [(String, Double)] {
        let propagationNodes = nodeCount ?? self.propagationNodes
        var nodes: [ServeProcess] = []
        defer { for node in nodes { node.stop() } }
        for index in 0..<propagationNodes {
            let store = try makeDatabase(directory + "/n\(index).db", name: "n\(index)")
            guard index == 0, preload > 0 else { continue }
            let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
            var id = 0
            while id < preload {
                try store.transaction {
                    for _ in 0..<min(50_000, preload - id) {
                        try insert.execute([
                            .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                        ])
                        id += 1
                    }
                }
            }
            _ = try store.digest()
        }
        if !plaintext {
            try Membership.formLocally(
                (0..<propagationNodes).map { directory + "/n\($0).db" },
                now: SystemWallClock().nowMilliseconds()
            )
        }
        // Through a relay, the nodes never meet: each knows only the relay.
        let viaRelay = try relay?(try KeyFile.load(forDatabase: directory + "/n0.db").cluster.idHex)
        for index in 0..<propagationNodes {
            nodes.append(
                try ServeProcess.startIsolated(
                    database: directory + "/n\(index).db",
                    name: "n\(index)",
                    // With links given, a node dials its neighbours started before it (the later ones dial it).
                    peers: viaRelay != nil
                        ? []
                        : links.map { links in links[index].filter { $0 < index }.map { nodes[$0].port } }
                            ?? (chain ? nodes.suffix(1).map(\.port) : nodes.map(\.port)),
                    extra: ["--round-interval", "1000"] + (plaintext ? ["--insecure-plaintext"] : [])
                        + (viaRelay.map { ["--relay", $0.url, "--relay-token", $0.token] } ?? [])
                )
            )
        }
        let writer = try Store(path: directory + "/n0.db")
        if preload > 0 {
            // Every node holds the big table before the measured writes start.
            let goal = try writer.versionVector()
            let readers = try (1..<propagationNodes).map { try Store(path: directory + "/n\($0).db") }
            let deadline = Date().addingTimeInterval(1_200)
            while try readers.contains(where: { try !$0.versionVector().dominatesOrEquals(goal) }) {
                guard Date() < deadline else { throw ServeError(message: "the big table did not catch up in time") }
                try await Task.sleep(for: .milliseconds(200))  // polling a condition with a deadline
            }
        }
        // Readers on the other nodes' files, each noting when it first sees every id.
        let total = writeRate * propagationSeconds
        let written = Clock.Times(count: total)
        let seen = (1..<propagationNodes).map { _ in Clock.Times(count: total) }
        let stop = Clock.Times(count: 1)
        let watchers = (1..<propagationNodes).map { index in
            Thread {
                guard let reader = try? Store(path: directory + "/n\(index).db") else { return }
                var next = 0
                while next < total && stop.get(0) == 0 {
                    let highest = (try? reader.execute("SELECT max(id) FROM t").rows.first?.first?.integerValue) ?? nil
                    if let highest, highest >= Int64(preload + next) {
                        let now = Clock.now()
                        while next <= Int(highest) - preload && next < total {
                            seen[index - 1].set(next, now)
                            next += 1
                        }
                    }
                    usleep(2_000)  // 500 Hz: 2 ms steps, and readers of 7 nodes leave the machine to the nodes
                }
            }
        }
        for watcher in watchers { watcher.start() }
        let interval = 1.0 / Double(writeRate)
        let start = Clock.now()
        for id in 0..<total {
            let due = start + Double(id) * interval
            let wait = due - Clock.now()
            if wait > 0 { usleep(useconds_t(wait * 1_000_000)) }
            try writer.execute("INSERT INTO t(id, a, b, c) VALUES (?, 'p', 1, 1.0)", [.integer(Int64(preload + id))])
            written.set(id, Clock.now())
        }
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline && seen.contains(where: { $0.get(total - 1) == 0 }) {
            try await Task.sleep(for: .milliseconds(20))
        }
        stop.set(0, 1)
        var latencies: [Double] = []
        // In a chain, what counts is the time to its far end.
        for node in chain ? Array(seen.suffix(1)) : seen {
            for id in 0..<total where node.get(id) > 0 { latencies.append((node.get(id) - written.get(id)) * 1000) }
        }
        latencies.sort()
        guard !latencies.isEmpty else { throw ServeError(message: "no write propagated") }
        func percentile(_ fraction: Double) -> Double {
            latencies[min(latencies.count - 1, Int(Double(latencies.count) * fraction))]
        }
        let missing = (chain ? 1 : propagationNodes - 1) * total - latencies.count
        guard missing == 0 else { throw ServeError(message: "\(missing) writes never arrived") }
        return [("propagation_p50_ms", percentile(0.5)), ("propagation_p99_ms", percentile(0.99))]
    }

    /// A random `degree`-regular graph on `nodes` nodes, connected (the neighbours of each node), from `seed`:
    /// stubs paired at random, again until no loop, no double link, and every node reachable.
    static func randomRegularGraph(nodes: Int, degree: Int, seed: UInt64) throws -> [[Int]] {
        guard nodes > degree, (nodes * degree) % 2 == 0 else {
            throw ServeError(message: "no \(degree)-regular graph on \(nodes) nodes")
        }
        var state = seed
        func next() -> UInt64 {  // SplitMix64
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        for _ in 0..<10_000 {
            var stubs = (0..<nodes).flatMap { Array(repeating: $0, count: degree) }
            for index in stride(from: stubs.count - 1, to: 0, by: -1) {
                stubs.swapAt(index, Int(next() % UInt64(index + 1)))
            }
            var neighbours = Array(repeating: Set<Int>(), count: nodes)
            var simple = true
            for pair in stride(from: 0, to: stubs.count, by: 2) {
                let (a, b) = (stubs[pair], stubs[pair + 1])
                if a == b || neighbours[a].contains(b) {
                    simple = false
                    break
                }
                neighbours[a].insert(b)
                neighbours[b].insert(a)
            }
            guard simple else { continue }
            var reached: Set<Int> = [0]
            var frontier = [0]
            while let node = frontier.popLast() {
                for neighbour in neighbours[node] where reached.insert(neighbour).inserted { frontier.append(neighbour) }
            }
            if reached.count == nodes { return neighbours.map { $0.sorted() } }
        }
        throw ServeError(message: "found no connected \(degree)-regular graph on \(nodes) nodes")
    }

    /// Two nodes already in sync: bytes per round, through a counting proxy.
    private func idleRound(_ directory: String) async throws -> [(String, Double)] {
        _ = try makeDatabase(directory + "/a.db", name: "a")
        let b = try makeDatabase(directory + "/b.db", name: "b")
        // Plaintext: the proxy counts the frames of each round, which TLS would hide (the links' own encoding
        // is the same under TLS, plus the records' overhead).
        let plaintext = ["--round-interval", "200", "--insecure-plaintext", "--cluster", "bench-idle"]
        let a = try ServeProcess.startIsolated(database: directory + "/a.db", name: "a", peers: [], extra: plaintext)
        defer { a.stop() }
        let counter = ByteCounter()
        let proxy = try await CountingProxy.start(to: a.port, counter: counter)
        let node = try ServeProcess.startIsolated(
            database: directory + "/b.db",
            name: "b",
            peers: [proxy],
            extra: plaintext
        )
        defer { node.stop() }
        try b.execute("INSERT INTO t(id, a) VALUES (1, 'x')")
        // Let the first (non-idle) exchange finish, then count only idle rounds.
        try await Task.sleep(for: .seconds(2))
        let (bytesBefore, pullsBefore) = (await counter.total, await counter.pulls)
        try await Task.sleep(for: .seconds(5))
        let bytes = Double(await counter.total - bytesBefore)
        let pulls = Double(await counter.pulls - pullsBefore)
        guard pulls > 0 else { throw ServeError(message: "no idle rounds happened") }
        // A round in both directions is two pulls: request, (empty) answer and acknowledgement each way.
        return [("idle_round_bytes", 2 * bytes / pulls), ("idle_pulls_per_s", pulls / 5)]
    }

    /// Idle, converged TLS nodes (a full mesh of `propagationNodes`): the CPU each uses and the bytes each writes to
    /// disk, over 10 s, from /proc.
    private func idleCost(_ directory: String) async throws -> [(String, Double)] {
        let count = propagationNodes
        let paths = (0..<count).map { directory + "/n\($0).db" }
        for (index, path) in paths.enumerated() { _ = try makeDatabase(path, name: "n\(index)") }
        try Membership.formLocally(paths, now: SystemWallClock().nowMilliseconds())
        var nodes: [ServeProcess] = []
        defer { for node in nodes { node.stop() } }
        for (index, path) in paths.enumerated() {
            nodes.append(try ServeProcess.startIsolated(database: path, name: "n\(index)", peers: nodes.map(\.port)))
        }
        try Store(path: paths[0]).execute("INSERT INTO t(id, a) VALUES (1, 'x')")
        let readers = try paths.map { try Store(path: $0) }
        let deadline = Date().addingTimeInterval(120)
        while try readers.contains(where: { try $0.execute("SELECT count(*) FROM t").rows != [[.integer(1)]] }) {
            guard Date() < deadline else { throw ServeError(message: "the idle nodes did not converge") }
            try await Task.sleep(for: .milliseconds(100))  // polling a condition with a deadline
        }
        // Settled: the first digest and the work after a write are done.
        try await Task.sleep(for: .seconds(5))
        func sample(_ pid: Int32) -> (ticks: Double, written: Double) {
            let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
            // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
            let fields = stat.split(separator: ")").last?.split(separator: " ") ?? []
            let ticks = fields.count > 12 ? (Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0) : 0
            let io = (try? String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8)) ?? ""
            let written = io.split(separator: "\n").first { $0.hasPrefix("write_bytes:") }
                .flatMap { Double($0.dropFirst("write_bytes:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            return (ticks, written)
        }
        let seconds = 10.0
        let before = nodes.map { sample($0.process.processIdentifier) }
        try await Task.sleep(for: .seconds(seconds))
        let after = nodes.map { sample($0.process.processIdentifier) }
        let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))
        let cpu = zip(before, after).map { ($1.ticks - $0.ticks) / ticksPerSecond / seconds * 100 }
        let written = zip(before, after).map { ($1.written - $0.written) / seconds }
        return [
            ("idle_cpu_percent_mean", cpu.reduce(0, +) / Double(cpu.count)),
            ("idle_cpu_percent_max", cpu.max() ?? 0),
            ("idle_disk_bytes_per_s_mean", written.reduce(0, +) / Double(written.count)),
        ]
    }

    /// Deletes collected once every member holds them: three TLS members (a mesh, rounds every second), `collectRows`
    /// rows deleted in one transaction on one; the seconds from the delete until every node holds it, then until no
    /// node keeps a tombstone, and Shoal's metadata bytes per deleted row before and after. Then one member is stopped,
    /// as many rows again are deleted: the tombstones kept 10 s later (all of them), and the seconds from its return
    /// until none is kept. And one collection pass's cost, timed in this process on a copy: milliseconds per 10,000
    /// tombstones.
    private func collect(_ directory: String) async throws -> [(String, Double)] {
        let count = 3
        let paths = (0..<count).map { directory + "/n\($0).db" }
        for (index, path) in paths.enumerated() {
            let store = try makeDatabase(path, name: "n\(index)")
            guard index == 0 else { continue }
            let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
            try store.transaction {
                for id in 0..<(2 * collectRows) {
                    try insert.execute([.integer(Int64(id)), .text("row \(id)"), .integer(Int64(id)), .real(0.5)])
                }
            }
        }
        try Membership.formLocally(paths, now: SystemWallClock().nowMilliseconds())
        var nodes: [ServeProcess] = []
        defer { for node in nodes { node.stop() } }
        func start(_ index: Int, peers: [Int]) throws -> ServeProcess {
            try ServeProcess.startIsolated(
                database: paths[index], name: "n\(index)", peers: peers,
                extra: ["--round-interval", "1000", "--collect-deletes"]
            )
        }
        for index in 0..<count { nodes.append(try start(index, peers: nodes.map(\.port))) }
        func counts(_ index: Int) throws -> (rows: Int64, tombstones: Int) {
            let status = try Store(path: paths[index]).status(settlingDigest: false)
            let table = status.tables.first { $0.name == "t" }
            return (Int64(table?.rows ?? -1), table?.tombstones ?? -1)
        }
        func metadataBytes(_ index: Int) throws -> Double {
            let rows = try Store(path: paths[index]).execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'shoal\\_%' ESCAPE '\\'"
            ).rows
            guard case .integer(let bytes) = rows.first?.first else { return 0 }
            return Double(bytes)
        }
        func waitFor(_ what: String, within seconds: Double = 600, _ condition: () throws -> Bool) async throws
            -> Double
        {
            let started = Clock.now()
            while try !condition() {
                guard Clock.now() - started < seconds else {
                    throw ServeError(message: "\(what) did not happen in time")
                }
                try await Task.sleep(for: .milliseconds(100))  // polling a condition with a deadline
            }
            return Clock.now() - started
        }
        let total = Int64(2 * collectRows)
        _ = try await waitFor("the first catch-up") { try (0..<count).allSatisfy { try counts($0).rows == total } }
        let before = try metadataBytes(0)

        // Every member online.
        let deleted = Clock.now()
        try Store(path: paths[0]).execute("DELETE FROM t WHERE id < ?", [.integer(Int64(collectRows))])
        let left = total - Int64(collectRows)
        _ = try await waitFor("the delete's spread") { try (0..<count).allSatisfy { try counts($0).rows == left } }
        let spread = Clock.now() - deleted
        let tombstonesAtSpread = try counts(0).tombstones
        let collected = try await waitFor("collection") {
            try (0..<count).allSatisfy { try counts($0).tombstones == 0 }
        }
        let after = try metadataBytes(0)

        // One member away.
        nodes[2].stop()
        try Store(path: paths[0]).execute("DELETE FROM t WHERE id < ?", [.integer(2 * Int64(collectRows))])
        _ = try await waitFor("the second delete's spread") { try (0..<2).allSatisfy { try counts($0).rows == 0 } }
        try await Task.sleep(for: .seconds(10))  // a span of time in which collection must not happen
        let keptAway = (try counts(0).tombstones + counts(1).tombstones) / 2
        let returned = Clock.now()
        nodes[2] = try start(2, peers: [nodes[0].port, nodes[1].port])
        _ = try await waitFor("collection after the return") {
            try (0..<count).allSatisfy { try counts($0).rows == 0 && counts($0).tombstones == 0 }
        }
        let afterReturn = Clock.now() - returned
        for node in nodes { node.stop() }

        // One pass's cost, on a copy of a member with every tombstone still kept.
        let copy = directory + "/pass.db"
        let pass = try makeDatabase(copy, name: "pass")
        let insert = try pass.prepare("INSERT INTO t(id, a, b, c) VALUES (?, 'row', ?, 0.5)")
        try pass.transaction {
            for id in 0..<collectRows { try insert.execute([.integer(Int64(id)), .integer(Int64(id))]) }
        }
        try pass.execute("DELETE FROM t")
        let cut = try pass.versionVector()
        var passMilliseconds: [Double] = []
        while true {
            let started = Clock.now()
            let report = try pass.collectTombstones(upTo: cut, maxRows: 10_000)
            if report.collected > 0 {
                passMilliseconds.append((Clock.now() - started) * 1000 * 10_000 / Double(report.collected))
            }
            if report.reachedCut { break }
        }
        passMilliseconds.sort()
        return [
            ("collect_rows", Double(collectRows)),
            ("collect_delete_spread_seconds", spread),
            ("collect_tombstones_at_spread", Double(tombstonesAtSpread)),
            ("collect_seconds_after_spread", collected),
            // Shoal's metadata bytes per row of the table before the delete, and what the delete added per deleted
            // row once collected (negative: pages freed for reuse are still counted by dbstat until reused).
            ("collect_metadata_bytes_per_row_before", before / Double(total)),
            ("collect_metadata_bytes_per_deleted_row_after", (after - before) / Double(collectRows)),
            ("collect_tombstones_kept_with_one_away", Double(keptAway)),
            ("collect_seconds_after_return", afterReturn),
            (
                "collect_pass_ms_per_10k_median",
                passMilliseconds.isEmpty ? 0 : passMilliseconds[passMilliseconds.count / 2]
            ),
            ("collect_pass_ms_per_10k_max", passMilliseconds.last ?? 0),
        ]
    }

    /// Many nodes write at once; the time from the last write until every digest matches.
    private func converge(_ directory: String) async throws -> [(String, Double)] {
        var nodes: [ServeProcess] = []
        defer { for node in nodes { node.stop() } }
        var paths: [String] = []
        for index in 0..<convergeNodes {
            let path = directory + "/n\(index).db"
            _ = try makeDatabase(path, name: "n\(index)")
            paths.append(path)
            if index > 0 { try Membership.formLocally([paths[0], path], now: SystemWallClock().nowMilliseconds()) }
            // A sparse mesh: each node dials up to 3 earlier ones.
            let peers = nodes.suffix(3).map(\.port)
            nodes.append(
                try ServeProcess.startIsolated(
                    database: path,
                    name: "n\(index)",
                    peers: peers,
                    extra: ["--round-interval", "1000"]
                )
            )
        }
        let writes = convergeWrites
        let databases = paths
        DispatchQueue.concurrentPerform(iterations: convergeNodes) { index in
            guard let store = try? Store(path: databases[index]) else { return }
            for step in 0..<writes {
                let key = Int64(index * 1_000_000 + step % 200)
                _ = try? store.execute(
                    "INSERT OR REPLACE INTO t(id, a, b, c) VALUES (?, ?, ?, 0.5)",
                    [.integer(key), .text("n\(index)"), .integer(Int64(step))]
                )
            }
        }
        let lastWrite = Date()
        let stores = try paths.map { try Store(path: $0) }
        while try Set(stores.map { try $0.digest() }).count > 1 {
            guard Date().timeIntervalSince(lastWrite) < 120 else { throw ServeError(message: "no convergence") }
            try await Task.sleep(for: .milliseconds(20))
        }
        return [("converge_seconds", Date().timeIntervalSince(lastWrite))]
    }
}

/// Monotonic seconds, and a thread-safe table of them.
enum Clock {
    static func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

    final class Times: @unchecked Sendable {
        // @unchecked: every access holds `lock`.
        private let lock = NSLock()
        private var values: [Double]

        init(count: Int) { values = Array(repeating: 0, count: count) }

        func set(_ index: Int, _ value: Double) { lock.withLock { if values[index] == 0 { values[index] = value } } }
        func get(_ index: Int) -> Double { lock.withLock { values[index] } }
    }
}

/// Bytes through the proxy, and how many pulls (sync requests) they carried.
actor ByteCounter {
    private(set) var total = 0
    private(set) var pulls = 0
    func add(_ count: Int) { total += count }
    func pull() { pulls += 1 }
}

/// Counts sync requests in one direction of a connection by following its frames.
struct FrameCounter {
    private var pending = ByteBuffer()

    mutating func feed(_ chunk: ByteBuffer, counter: ByteCounter) async {
        pending.writeImmutableBuffer(chunk)
        while let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self),
            pending.readableBytes >= 4 + Int(length)
        {
            let type = pending.getInteger(at: pending.readerIndex + 4, as: UInt8.self)
            pending.moveReaderIndex(forwardBy: 4 + Int(length))
            if type == 2 { await counter.pull() }
        }
        pending.discardReadBytes()
    }
}

/// Forwards one port to another, counting the bytes both ways.
enum CountingProxy {
    private static func pump(
        _ inbound: NIOAsyncChannelInboundStream<ByteBuffer>,
        to outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>,
        counter: ByteCounter
    ) async throws {
        var frames = FrameCounter()
        for try await chunk in inbound {
            await counter.add(chunk.readableBytes)
            await frames.feed(chunk, counter: counter)
            try await outbound.write(chunk)
        }
    }

    static func start(to port: Int, counter: ByteCounter) async throws -> Int {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let listening = server.channel.localAddress!.port!
        Task {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await client in inbound {
                        group.addTask {
                            let upstream = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                                .connect(host: "127.0.0.1", port: port) { channel in
                                    channel.eventLoop.makeCompletedFuture {
                                        try NIOAsyncChannel<ByteBuffer, ByteBuffer>(
                                            wrappingChannelSynchronously: channel
                                        )
                                    }
                                }
                            try await client.executeThenClose { clientIn, clientOut in
                                try await upstream.executeThenClose { upIn, upOut in
                                    try await withThrowingTaskGroup(of: Void.self) { pumps in
                                        pumps.addTask { try await pump(clientIn, to: upOut, counter: counter) }
                                        pumps.addTask { try await pump(upIn, to: clientOut, counter: counter) }
                                        try await pumps.next()
                                        pumps.cancelAll()
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        return listening
    }
}
