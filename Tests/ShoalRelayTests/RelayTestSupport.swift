import Foundation
import ShoalCore
import ShoalSecurity
import ShoalStore
import ShoalTestSupport
import Testing

/// A relay process and the nodes of one cluster, each a real `shoal serve`, in a directory of their own.
final class RelayWorld: @unchecked Sendable {
    let directory: URL
    let relayData: String
    /// The relay's PostgreSQL database, when it keeps its data there instead of in ``relayData``.
    let postgres: String?
    /// What every instance of the relay is started with, besides its data and address.
    let relayArguments: [String]
    private(set) var relay: RunningProcess?
    private(set) var relayURL = ""
    private(set) var relayPort = 0
    /// More instances of the relay (on the same PostgreSQL database), by their URL.
    private(set) var instances: [String: RunningProcess] = [:]
    private(set) var nodes: [String: RunningProcess] = [:]
    private(set) var ports: [String: Int] = [:]
    let clusterID: String
    let token: String
    private(set) var paths: [String: String]

    /// Databases `names` made one cluster (table `kv(k TEXT PRIMARY KEY, v)` replicated), a relay started (with
    /// `relayArguments` besides its data and address), a token made for the cluster. With `postgres`, the relay keeps
    /// its data in a PostgreSQL database of the test's own.
    init(_ name: String, nodes names: [String], postgres: Bool = false, relayArguments: [String] = []) async throws {
        directory = try temporaryDirectory(name)
        relayData = directory.appendingPathComponent("relay").path
        self.postgres = postgres ? try await offPool { try TestPostgres.freshDatabase(name) } : nil
        self.relayArguments = relayArguments
        var paths: [String: String] = [:]
        for name in names { paths[name] = try Self.makeDatabase(name, in: directory) }
        try Membership.formLocally(names.map { paths[$0]! }, now: SystemWallClock().nowMilliseconds())
        self.paths = paths
        clusterID = try KeyFile.load(forDatabase: paths[names[0]]!).cluster.idHex
        let storage = self.postgres.map { ["--postgres", $0] } ?? ["--data", relayData]
        let cluster = clusterID
        let made = try await offPool { try shoal(arguments: ["relay", "token", "create"] + storage + ["--cluster", cluster]) }
        guard made.status == 0, let token = made.stdout.split(separator: "\n").last.map(String.init) else {
            throw TestSetupError("token create failed: \(made.stderr)")
        }
        self.token = token
        try await startRelay()
    }

    /// A database `name` in `directory` with table `kv(k TEXT PRIMARY KEY, v)` replicated, and a node key.
    private static func makeDatabase(_ name: String, in directory: URL) throws -> String {
        let path = directory.appendingPathComponent("\(name).db").path
        var options = StoreOptions()
        options.nodeName = name
        let store = try Store(path: path, options: options)
        try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "kv")
        try Membership.initialize(databasePath: path, store: store, now: SystemWallClock().nowMilliseconds())
        return path
    }

    /// Makes database `name` (the same table) and joins it to the cluster with an invite of member `member`, through
    /// the member's file, while the member may run (as `shoal invite` and `shoal join --member-db` do).
    func addMember(_ name: String, through member: String) async throws {
        let path = try Self.makeDatabase(name, in: directory)
        let memberPath = paths[member]!
        let invite = try await offPool { try shoal("invite", "--db", memberPath) }
        guard invite.status == 0, let code = invite.stdout.split(separator: "\n").last.map(String.init) else {
            throw TestSetupError("invite failed: \(invite.stderr)")
        }
        let joined = try await offPool { try shoal("join", code, "--db", path, "--member-db", memberPath) }
        guard joined.status == 0 else { throw TestSetupError("join failed: \(joined.stderr)") }
        paths[name] = path
    }

    /// Where the relay keeps its data, as `shoal relay` commands take it.
    var storageArguments: [String] { postgres.map { ["--postgres", $0] } ?? ["--data", relayData] }

    /// Starts the relay (on its earlier port when it ran before, so nodes find it again).
    func startRelay(extra: [String] = []) async throws {
        let (process, url) = try await Self.startInstance(storageArguments, port: relayPort, extra: relayArguments + extra)
        relay = process
        relayURL = url
        relayPort = Int(relayURL.split(separator: ":").last!)!
    }

    /// Starts one more instance of the relay on the same PostgreSQL database; returns its URL.
    func startInstance() async throws -> String {
        let (process, url) = try await Self.startInstance(storageArguments, port: 0, extra: relayArguments)
        instances[url] = process
        return url
    }

    private static func startInstance(_ storage: [String], port: Int, extra: [String]) async throws -> (RunningProcess, String) {
        let process = try RunningProcess(
            try shoalExecutable(),
            ["relay", "serve"] + storage + ["--listen", "127.0.0.1:\(port)"] + extra
        )
        guard let line = await process.line(within: 30, { $0.hasPrefix("relay listening on ") }) else {
            process.stop()
            throw TestSetupError("the relay did not start: \(process.output)")
        }
        return (process, String(line.dropFirst("relay listening on ".count)))
    }

    /// Kills the relay instance at `url` (SIGKILL), the first one or another.
    func killInstance(_ url: String) async throws {
        if url == relayURL {
            try await stopRelay(kill: true)
            return
        }
        guard let process = instances.removeValue(forKey: url) else { return }
        Foundation.kill(process.pid, SIGKILL)
        try await offPool { process.process.waitUntilExit() }
    }

    /// Stops the relay: gracefully, or with SIGKILL.
    func stopRelay(kill: Bool = false) async throws {
        guard let relay else { return }
        if kill {
            Foundation.kill(relay.pid, SIGKILL)
            try await offPool { relay.process.waitUntilExit() }
        } else {
            try await offPool { relay.stop() }
        }
        self.relay = nil
    }

    /// Starts `shoal serve` on node `name`: no mDNS, no remembered peers; the relay unless `relay` is false; `peers`
    /// are names of running nodes to dial.
    @discardableResult
    func serve(
        _ name: String,
        relay useRelay: Bool = true,
        peers: [String] = [],
        token: String? = nil,
        relays: [String]? = nil,
        extra: [String] = []
    ) async throws -> RunningProcess {
        var arguments = ["serve", "--db", paths[name]!, "--no-mdns", "--no-remembered", "--name", name] + extra
        if useRelay {
            for url in relays ?? [relayURL] { arguments += ["--relay", url] }
            arguments += ["--relay-token", token ?? self.token]
        }
        for peer in peers { arguments += ["--peer", "127.0.0.1:\(ports[peer]!)"] }
        let process = try RunningProcess(try shoalExecutable(), arguments)
        guard let line = await process.line(within: 30, { $0.hasPrefix("listening on ") }) else {
            process.stop()
            throw TestSetupError("node \(name) did not start: \(process.output)")
        }
        nodes[name] = process
        ports[name] = Int(line.split(separator: ":").last!)!
        return process
    }

    /// Kills node `name` with SIGKILL.
    func kill(_ name: String) async throws {
        guard let node = nodes.removeValue(forKey: name) else { return }
        Foundation.kill(node.pid, SIGKILL)
        try await offPool { node.process.waitUntilExit() }
    }

    /// Stops node `name` (SIGTERM).
    func stop(_ name: String) async throws {
        guard let node = nodes.removeValue(forKey: name) else { return }
        try await offPool { node.stop() }
    }

    /// Writes through the `sqlite3` shell, as another application would.
    func write(_ name: String, _ sql: String) async throws {
        let path = paths[name]!
        let result = try await offPool { try sqlite3Shell(path, sql) }
        guard result.status == 0 else { throw TestSetupError("sqlite3 failed: \(result.stderr)") }
    }

    /// The digest line of node `name`'s database (read while it runs).
    func digest(_ name: String) async throws -> String {
        let path = paths[name]!
        let output = try await offPool { try shoal("digest", "--db", path) }
        return output.stdout
    }

    /// Whether every named node holds the same data, within `seconds`.
    func converge(_ names: [String], within seconds: Double = 60) async throws -> Bool {
        try await waitUntil(within: seconds, checkingEvery: 200) {
            let digests = try await withThrowingTaskGroup(of: String.self) { group in
                for name in names { group.addTask { try await self.digest(name) } }
                return try await group.reduce(into: Set<String>()) { $0.insert($1) }
            }
            return digests.count == 1
        }
    }

    /// Whether the one row of node `name`'s table `kv` holds `value` (read with the `sqlite3` shell), within 30 s.
    func holds(_ name: String, _ value: String) async throws -> Bool {
        let path = paths[name]!
        return try await waitUntil(within: 30, checkingEvery: 100) {
            try await offPool { try sqlite3Shell(path, "SELECT v FROM kv") }.stdout == value + "\n"
        }
    }

    /// Whether nodes `first` and `second` hold the same rows in every application table, read outside Shoal (values
    /// with their types and bytes).
    func sameRows(_ first: String, _ second: String) async throws -> Bool {
        let (a, b) = (paths[first]!, paths[second]!)
        return try await offPool {
            try SQLiteConnection(path: a).applicationTableContents() == SQLiteConnection(path: b).applicationTableContents()
        }
    }

    /// Node `name`'s `shoal status --json`.
    func status(_ name: String) async throws -> [String: Any] {
        let path = paths[name]!
        let output = try await offPool { try shoal("status", "--db", path, "--json") }
        return (try JSONSerialization.jsonObject(with: Data(output.stdout.utf8))) as? [String: Any] ?? [:]
    }

    /// Node `name`'s `shoal status`, as an operator reads it.
    func statusText(_ name: String) async throws -> String {
        let path = paths[name]!
        return try await offPool { try shoal("status", "--db", path) }.stdout
    }

    /// The relay part of node `name`'s status.
    func relayStatus(_ name: String) async throws -> [String: Any] {
        try await status(name)["relay"] as? [String: Any] ?? [:]
    }

    /// The same world with the relay's storage of `kind`.
    convenience init(_ name: String, nodes names: [String], storage kind: StorageKind) async throws {
        try await self.init(name, nodes: names, postgres: kind == .postgres)
    }

    /// Runs SQL on the relay's own database (the relay may be running): with the `sqlite3` shell, or with `psql`
    /// with the relay's schema first on the search path. Both print rows as `a|b`, one a line.
    func relayQuery(_ sql: String) async throws -> String {
        if let postgres {
            let url = postgres + "&options=-csearch_path%3Dshoal_relay"
            return try await offPool { try TestPostgres.query(url, sql) }
        }
        let path = relayData + "/relay.sqlite"
        return try await offPool { try sqlite3Shell(path, sql) }.stdout
    }

    /// A BLOB (`bytea`) literal of `hex` in the relay's SQL.
    func blob(_ hex: String) -> String { postgres == nil ? "X'\(hex)'" : "'\\x\(hex)'::bytea" }

    /// The expression of `column`'s bytes in upper-case hex in the relay's SQL.
    func hex(_ column: String) -> String { postgres == nil ? "hex(\(column))" : "upper(encode(\(column), 'hex'))" }

    /// Copies what the relay stores now (it may be running) to `name` in the world's directory: a backup, as its
    /// operator would make one (`VACUUM INTO`, or `pg_dump` of the relay's schema). Returns the copy's path.
    func copyRelayStorage(_ name: String) async throws -> String {
        let copy = directory.appendingPathComponent(name).path
        if let postgres {
            let dumped = try await offPool {
                try runProcess(URL(fileURLWithPath: "/usr/bin/pg_dump"), [postgres, "-n", "shoal_relay", "-f", copy])
            }
            guard dumped.status == 0 else { throw TestSetupError("pg_dump failed: \(dumped.stderr)") }
        } else {
            _ = try await relayQuery("VACUUM INTO '\(copy)'")
        }
        return copy
    }

    /// Puts the relay's storage back to `copy` (``copyRelayStorage(_:)``), the relay stopped: what it stored since is
    /// gone.
    func restoreRelayStorage(_ copy: String) async throws {
        if let postgres {
            _ = try await offPool { try TestPostgres.query(postgres, "DROP SCHEMA shoal_relay CASCADE") }
            let restored = try await offPool {
                try runProcess(
                    URL(fileURLWithPath: "/usr/bin/psql"), [postgres, "-q", "-v", "ON_ERROR_STOP=1", "-f", copy]
                )
            }
            guard restored.status == 0 else { throw TestSetupError("psql failed to restore: \(restored.stderr)") }
        } else {
            let live = relayData + "/relay.sqlite"
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: live + suffix) }
            try FileManager.default.copyItem(atPath: copy, toPath: live)
        }
    }

    /// Removes everything the relay stores, the relay stopped (its data directory, or its schema).
    func loseRelayStorage() async throws {
        if let postgres {
            _ = try await offPool { try TestPostgres.query(postgres, "DROP SCHEMA shoal_relay CASCADE") }
        } else {
            try FileManager.default.removeItem(atPath: relayData)
        }
    }

    /// Where the relay's change log of `site` (hex) starts now: the first seq it still holds ranges after (nil: none).
    func logFloor(_ site: String) async throws -> UInt64? {
        let answer: String
        if let postgres {
            answer = try await offPool {
                try TestPostgres.query(
                    postgres,
                    "SELECT min(from_seq) FROM shoal_relay.ranges WHERE snapshot = 0 AND encode(site, 'hex') = '\(site.lowercased())'"
                )
            }
        } else {
            answer = try await relayQuery("SELECT min(from_seq) FROM ranges WHERE snapshot = 0 AND hex(site) = '\(site.uppercased())'")
        }
        return UInt64(answer.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The bytes of every range the relay holds, its change log's and its snapshots'.
    func storedBytes() async throws -> Int {
        let answer: String
        if let postgres {
            answer = try await offPool { try TestPostgres.query(postgres, "SELECT coalesce(sum(bytes), 0) FROM shoal_relay.ranges") }
        } else {
            answer = try await relayQuery("SELECT coalesce(sum(bytes), 0) FROM ranges")
        }
        return Int(answer.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }

    /// What every running node and the relay wrote, for a failing test's message.
    var outputs: String {
        (nodes.sorted { $0.key < $1.key }.map { "--- \($0.key):\n\($0.value.output)" } + ["--- relay:\n\(relay?.output ?? "")"]
            + instances.sorted { $0.key < $1.key }.map { "--- relay \($0.key):\n\($0.value.output)" })
            .joined(separator: "\n")
    }

    /// Kills every process (SIGKILL: the test is over) and removes the directory, before the test returns, so no
    /// process outlives the test run.
    func tearDown() {
        let processes = Array(nodes.values) + (relay.map { [$0] } ?? []) + Array(instances.values)
        for process in processes where process.process.isRunning { Foundation.kill(process.pid, SIGKILL) }
        for process in processes { process.process.waitUntilExit() }
        nodes = [:]
        relay = nil
        instances = [:]
        try? FileManager.default.removeItem(at: directory)
    }
}

/// The bytes of every file under `directory`.
func filesBytes(under directory: String) throws -> [(String, Data)] {
    let enumerator = FileManager.default.enumerator(atPath: directory)
    var result: [(String, Data)] = []
    while let name = enumerator?.nextObject() as? String {
        let path = directory + "/" + name
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue {
            result.append((name, try Data(contentsOf: URL(fileURLWithPath: path))))
        }
    }
    return result
}
