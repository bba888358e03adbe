import Foundation
import Shoal
import ShoalProcesses

/// The reconnect part of `shoal-bench relay --postgres URL`: how long a node takes to resume through another relay
/// instance after the one it uses is killed.
///
/// Three relay instances share one fresh PostgreSQL database. Node A is given two of them (`--relay URL1 --relay URL2`)
/// and long-polls the first; node W, the writer, is given only the third, so the kills never touch it. Each time: a
/// row written on W and its arrival on A with nothing killed (the baseline), then the instance A uses is killed with
/// SIGKILL, a row is written on W at once, and the time from the kill until that row is in A's database is the time A
/// took to notice, go on with the other instance, pull again and apply. The killed instance is restarted on its port
/// before the next time, so the instances take turns.
struct RelayReconnect {
    /// The PostgreSQL server, as `Tools/start-postgres.sh` prints its URL.
    let server: String
    /// How many times an instance is killed.
    let times: Int

    func run(_ directory: String, sync: SyncBenchmark) async throws -> [(String, Double)] {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let database = try PostgresDatabase.create(server: server, name: "shoal_bench_reconnect_\(getpid())")
        defer { database.drop() }
        let storage = ["--postgres", database.url]
        var instances: [RelayProcess?] = try (0..<3).map { index in
            try RelayProcess.start(storage: storage, log: directory + "/relay\(index).log")
        }
        let ports = instances.map { $0!.port }
        defer { for instance in instances { instance?.stop() } }

        let writerPath = directory + "/w.db"
        let nodePath = directory + "/a.db"
        _ = try sync.makeDatabase(writerPath, name: "w")
        _ = try sync.makeDatabase(nodePath, name: "a")
        try Membership.formLocally([writerPath, nodePath], now: SystemWallClock().nowMilliseconds())
        let cluster = try KeyFile.load(forDatabase: writerPath).cluster.idHex
        let token = try RelayProcess.token(storage: storage, cluster: cluster)
        let url = { (index: Int) in "http://127.0.0.1:\(ports[index])" }
        let writerNode = try ServeProcess.startIsolated(
            database: writerPath,
            name: "w",
            peers: [],
            extra: ["--relay", url(2), "--relay-token", token]
        )
        defer { writerNode.stop() }
        let node = try ServeProcess.startIsolated(
            database: nodePath,
            name: "a",
            peers: [],
            extra: ["--relay", url(0), "--relay", url(1), "--relay-token", token]
        )
        defer { node.stop() }
        let writer = try Store(path: writerPath)
        let reader = try Store(path: nodePath)
        var nextID: Int64 = 0
        /// Writes a row on W and returns the milliseconds from `start` until A holds it (nil: not within 30 s).
        func arrival(since start: ContinuousClock.Instant) throws -> Double? {
            let id = nextID
            nextID += 1
            try writer.execute("INSERT INTO t(id, a, b, c) VALUES (?, 'r', 1, 1.0)", [.integer(id)])
            while ContinuousClock.now - start < .seconds(30) {
                let highest = try reader.execute("SELECT max(id) FROM t").rows.first?.first
                if case .integer(let highest) = highest, highest >= id {
                    let elapsed = ContinuousClock.now - start
                    return Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
                }
                usleep(1_000)  // sampling A's database at 1 kHz
            }
            return nil
        }
        // Both nodes are linked before anything is timed: a first row goes through.
        guard try arrival(since: .now) != nil else {
            throw ServeError(message: "a first row never reached the node through the relay")
        }

        var baseline: [Double] = []
        var resumed: [Double] = []
        var lost = 0
        var current = 0
        var confirmed = 0
        for _ in 0..<times {
            try await Task.sleep(for: .milliseconds(500))  // A's long-poll is waiting again on its instance
            if let milliseconds = try arrival(since: .now) { baseline.append(milliseconds) }
            try await Task.sleep(for: .milliseconds(500))
            // The instance A uses, as its status says (`shoal status --json`, relay.url); the turns otherwise.
            if let used = Self.relayURL(statusOf: nodePath), let index = (0..<2).first(where: { url($0) == used }) {
                current = index
                confirmed += 1
            }
            let killed = ContinuousClock.now
            instances[current]?.kill()
            instances[current] = nil
            if let milliseconds = try arrival(since: killed) { resumed.append(milliseconds) } else { lost += 1 }
            instances[current] = try RelayProcess.start(
                storage: storage,
                log: directory + "/relay\(current).log",
                port: ports[current]
            )
            current = 1 - current
        }
        guard !resumed.isEmpty else { throw ServeError(message: "the node never resumed after a kill") }
        return [
            ("relay_reconnect_times", Double(times)),
            // Kills of the instance the node's status named as the one in use (the rest: the instances' turns).
            ("relay_reconnect_instance_confirmed", Double(confirmed)),
            ("relay_reconnect_p50_ms", Self.percentile(resumed, 0.5)),
            ("relay_reconnect_p99_ms", Self.percentile(resumed, 0.99)),
            ("relay_reconnect_max_ms", resumed.max() ?? .nan),
            ("relay_reconnect_not_within_30s", Double(lost)),
            ("relay_reconnect_baseline_p50_ms", Self.percentile(baseline, 0.5)),
            ("relay_reconnect_baseline_p99_ms", Self.percentile(baseline, 0.99)),
        ]
    }

    /// The relay instance a running node uses, as `shoal status --json` says (the node writes its status when asked).
    static func relayURL(statusOf database: String) -> String? {
        let status = Process()
        status.executableURL = ServeProcess.executable()
        status.arguments = ["status", "--json", "--db", database]
        let output = Pipe()
        status.standardOutput = output
        status.standardError = FileHandle.nullDevice
        guard (try? status.run()) != nil else { return nil }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        status.waitUntilExit()
        guard let status = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let relay = status["relay"] as? [String: Any]
        else { return nil }
        return relay["url"] as? String
    }

    /// The value at `fraction` of the sorted values (the largest for 0.99 of fewer than 100).
    static func percentile(_ values: [Double], _ fraction: Double) -> Double {
        let sorted = values.sorted()
        guard !sorted.isEmpty else { return .nan }
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
    }
}
