import ArgumentParser
import Foundation
import Shoal

/// What an app holding a node gets: how soon a live query sees a peer's write, whether the change feed delivers every
/// change set of a burst, and what idle observers cost. Two nodes in this process, on loopback (plaintext: the figure
/// is about the store's door, not TLS).
struct ObserveBenchmark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "observe",
        abstract: "Remote write to observe() delivery, change-feed completeness under a burst, idle observers' CPU."
    )

    @Flag(help: "Print one JSON object instead of a table.") var json = false
    @Option(help: "Writes timed for the delivery figure (one every 10 ms).") var writes = 500
    @Option(help: "Change sets in the burst the feed must deliver.") var burst = 10_000
    @Option(help: "Idle observers for the idle figure.") var observers = 100
    @Option(help: "Seconds of idleness measured.") var idleSeconds = 3.0

    func run() async throws {
        let directory = NSTemporaryDirectory() + "shoal-observe-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (a, runA) = try await Self.node(directory + "/a.db", peers: [])
        let (b, runB) = try await Self.node(directory + "/b.db", peers: [try await Self.port(of: a)])
        defer {
            runA.cancel()
            runB.cancel()
        }
        _ = try await b.waitUntilAcknowledged(VersionVector(), by: .anyone, timeoutMilliseconds: 1)
        var figures: [(String, Double)] = []

        // Delivery: b writes its clock reading; a's observer sees the row; the difference is the latency.
        let latest = a.store.observe("SELECT v FROM kv WHERE k = 'clock'")
        let samples = Samples()
        let watcher = Task {
            for try await result in latest {
                guard case .integer(let sent)? = result.rows.first?.first else { continue }
                let now = Int64(DispatchTime.now().uptimeNanoseconds)
                await samples.add(Double(now - sent) / 1_000_000)
            }
        }
        defer { watcher.cancel() }
        for _ in 0..<writes {
            let sent = Int64(DispatchTime.now().uptimeNanoseconds)
            try await b.execute("INSERT INTO kv(k, v) VALUES ('clock', ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", [.integer(sent)])
            try await Task.sleep(for: .milliseconds(10))
        }
        _ = try await a.store.read { _ in 0 }
        let delivered = await samples.sorted()
        figures.append(("observe: remote write to delivery p50 (ms)", Self.percentile(delivered, 0.5)))
        figures.append(("observe: remote write to delivery p95 (ms)", Self.percentile(delivered, 0.95)))
        figures.append(("observe: results delivered of \(writes) writes", Double(delivered.count)))

        // The feed under a burst: b writes `burst` transactions; a's feed must deliver every one of them.
        let held = try await a.store.versionVector()
        let feedStart = ContinuousClock.now
        let counting = Task {
            var seen = Set<UInt64>()
            for try await set in a.store.changes(in: ["kv"], after: ChangeFeedCursor(held)) where set.dot.site == b.siteID {
                seen.insert(set.dot.seq)
                if seen.count == burst { break }
            }
            return seen.count
        }
        try await b.withStore { store throws(ShoalError) in
            for index in 0..<burst { try store.execute("INSERT INTO kv(k, v) VALUES ('burst\(index)', \(index))") }
        }
        let counted = try await counting.value
        figures.append(("feed: change sets delivered of a \(burst)-transaction burst", Double(counted)))
        figures.append(("feed: burst delivered in (s)", Self.seconds(ContinuousClock.now - feedStart)))

        // Idle observers: the process's CPU time over idle seconds, without and then with observers.
        let bare = try await Self.cpuSeconds(over: idleSeconds)
        let (started, starting) = AsyncStream.makeStream(of: Void.self)
        let watching = (0..<observers).map { index in
            Task {
                for try await _ in a.store.observe("SELECT count(*) FROM kv WHERE v > \(index)") { starting.yield() }
            }
        }
        defer { for task in watching { task.cancel() } }
        // Measured once every observer has its first result.
        var first = 0
        for await _ in started {
            first += 1
            if first == observers { break }
        }
        let observed = try await Self.cpuSeconds(over: idleSeconds)
        for task in watching { task.cancel() }
        // And without them again: what the node itself does while idle (digest folding after the burst, compaction)
        // may fall in either window.
        let after = try await Self.cpuSeconds(over: idleSeconds)
        figures.append(("idle: process CPU ms per s, no observers (before)", bare * 1000 / idleSeconds))
        figures.append(("idle: process CPU ms per s, no observers (after)", after * 1000 / idleSeconds))
        figures.append(("idle: process CPU ms per s, \(observers) observers", observed * 1000 / idleSeconds))

        if json {
            print(String(data: try JSONSerialization.data(withJSONObject: Dictionary(uniqueKeysWithValues: figures)), encoding: .utf8)!)
        } else {
            for (name, value) in figures { print("\(name): \(String(format: "%.2f", value))") }
        }
    }

    private static func node(_ path: String, peers: [Int]) async throws -> (SyncNode, Task<Void, any Error>) {
        let store = try Store(path: path)
        try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "kv")
        var configuration = NodeConfiguration(databasePath: path)
        configuration.clusterID = "observe-bench"
        configuration.insecurePlaintext = true
        configuration.rememberPeers = false
        configuration.staticPeers = peers.map { PeerAddress(host: "127.0.0.1", port: $0) }
        let node = try await SyncNode(configuration: configuration)
        return (node, Task { try await node.run() })
    }

    private static func port(of node: SyncNode) async throws -> Int {
        for await event in node.events {
            if case .listening(let port) = event { return port }
        }
        throw ShoalError(code: .timeout, message: "the node did not listen")
    }

    private static func cpuSeconds(over seconds: Double) async throws -> Double {
        func now() -> Double {
            var usage = rusage()
            getrusage(RUSAGE_SELF.rawValue, &usage)
            return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
                + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1_000_000
        }
        let before = now()
        try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
        return now() - before
    }

    private static func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
        sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}

/// Latency samples gathered by one task, read by another.
private actor Samples {
    private var values: [Double] = []
    func add(_ value: Double) { values.append(value) }
    func sorted() -> [Double] { values.sorted() }
}
