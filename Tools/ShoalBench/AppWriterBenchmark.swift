import CSQLite
import Foundation
import Shoal
import ShoalProcesses

/// An app writing its own file beside a node that catches up: how long the app waits for SQLite's write lock, how
/// long the node holds it, and how fast `shoal status` answers meanwhile.
extension SyncBenchmark {
    /// A fresh node catches up `rows` rows from a peer over loopback (TLS), while an app connection of its own (plain
    /// SQLite, WAL, busy timeout `appBusyTimeout` ms) inserts one row into the replicated table every
    /// `appWriteInterval` ms and `shoal status --json` is run every 200 ms.
    func appWriter(_ directory: String) throws -> [(String, Double)] {
        let source = try makeDatabase(directory + "/source.db", name: "source")
        let insert = try source.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
        var id = 0
        while id < rows {
            try source.transaction {
                for _ in 0..<min(50_000, rows - id) {
                    try insert.execute([
                        .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                    ])
                    id += 1
                }
            }
        }
        let target = try makeDatabase(directory + "/target.db", name: "target")
        let goal = try source.versionVector()
        try Membership.formLocally(
            [directory + "/source.db", directory + "/target.db"],
            now: SystemWallClock().nowMilliseconds()
        )
        let serving = try ServeProcess.startIsolated(database: directory + "/source.db", name: "source", peers: [])
        defer { serving.stop() }
        let catching = try ServeProcess.startIsolated(
            database: directory + "/target.db",
            name: "target",
            peers: [serving.port]
        )
        defer { catching.stop() }

        let done = StopFlag()
        let (interval, busyTimeout) = (appWriteInterval, appBusyTimeout)
        let app = Thread.detachNewThreadWithResult {
            AppWriter.run(
                path: directory + "/target.db",
                intervalMilliseconds: interval,
                busyTimeoutMilliseconds: busyTimeout,
                until: done
            )
        }
        let statuses = Thread.detachNewThreadWithResult {
            StatusProbe.run(database: directory + "/target.db", until: done)
        }
        let started = Date()
        while try !target.versionVector().dominatesOrEquals(goal) {
            guard Date().timeIntervalSince(started) < 900 else { throw ServeError(message: "catch-up stalled") }
            Thread.sleep(forTimeInterval: 0.05)  // sampling, not synchronisation
        }
        let seconds = Date().timeIntervalSince(started)
        let finished = Clock.now()
        done.set()
        let writes = app.value
        let probes = statuses.value
        // Then, the app stopped, the node folds the rows into its digest a slice at a time once the data is quiet (its
        // holds meanwhile count in the longest), and the two nodes' digests meet (the app's rows reached the source).
        while true {
            let status = try StatusProbe.status(database: directory + "/target.db")
            let goal = try source.digest().hex
            if status["digest_current"] as? Bool == true, status["digest"] as? String == goal { break }
            guard Date().timeIntervalSince(started) < 900 else { throw ServeError(message: "the digests never met") }
            Thread.sleep(forTimeInterval: 0.2)  // sampling, not synchronisation
        }
        let settled = Date().timeIntervalSince(started)
        // The node's own measure of its longest write-lock hold, read from its status after the catch-up.
        let holds = try StatusProbe.writeLock(database: directory + "/target.db")
        func percentile(_ values: [Double], _ fraction: Double) -> Double {
            let sorted = values.sorted()
            return sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
        }
        // How far each ETA shown was from the time the catch-up then took: the worst factor, and the share within 2x.
        let factors = probes.estimates.compactMap { estimate -> Double? in
            let truth = finished - estimate.at
            guard truth > 0.5, estimate.secondsLeft > 0 else { return nil }
            return max(estimate.secondsLeft / truth, truth / estimate.secondsLeft)
        }
        return [
            ("app_writer_catchup_seconds", seconds),
            ("app_writer_eta_samples", Double(factors.count)),
            ("app_writer_eta_worst_factor", factors.max() ?? .nan),
            ("app_writer_eta_within_2x_share", Double(factors.filter { $0 <= 2 }.count) / Double(max(1, factors.count))),
            ("app_writer_digests_match_seconds", settled),
            ("app_writer_node_longest_hold_ms", holds.longest),
            ("app_writer_node_holds_over_50_ms", holds.over50),
            ("app_writer_node_write_transactions", holds.transactions),
            ("app_writer_inserts", Double(writes.waits.count + writes.failures)),
            ("app_writer_insert_wait_p50_ms", percentile(writes.waits, 0.5)),
            ("app_writer_insert_wait_p99_ms", percentile(writes.waits, 0.99)),
            ("app_writer_insert_wait_max_ms", writes.waits.max() ?? .nan),
            ("app_writer_insert_failures", Double(writes.failures)),
            ("app_writer_status_runs", Double(probes.latencies.count)),
            ("app_writer_status_p99_ms", percentile(probes.latencies, 0.99)),
            ("app_writer_status_max_ms", probes.latencies.max() ?? .nan),
            ("app_writer_status_not_live", Double(probes.notLive)),
        ]
    }
}

/// A flag one thread sets and another reads.
final class StopFlag: @unchecked Sendable {
    // @unchecked: every access holds `lock`.
    private let lock = NSLock()
    private var value = false

    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

/// The app: a plain SQLite connection of its own (the C API, as an app's driver), inserting one row at a time.
enum AppWriter {
    struct Result: Sendable {
        /// How long each insert that succeeded took, in milliseconds (almost all of it waiting for the lock).
        var waits: [Double] = []
        /// Inserts that failed (SQLITE_BUSY after the busy timeout).
        var failures = 0
    }

    static func run(
        path: String,
        intervalMilliseconds: Int,
        busyTimeoutMilliseconds: Int,
        until done: StopFlag
    ) -> Result {
        var result = Result()
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let handle else {
            return result
        }
        defer { sqlite3_close_v2(handle) }
        sqlite3_busy_timeout(handle, Int32(busyTimeoutMilliseconds))
        sqlite3_exec(handle, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL", nil, nil, nil)
        var insert: OpaquePointer?
        sqlite3_prepare_v2(handle, "INSERT INTO t(id, a, b, c) VALUES (?, 'app', 0, 0)", -1, &insert, nil)
        defer { sqlite3_finalize(insert) }
        var id: Int64 = 100_000_000
        while !done.isSet {
            id += 1
            sqlite3_bind_int64(insert, 1, id)
            let started = Clock.now()
            let code = sqlite3_step(insert)
            let took = (Clock.now() - started) * 1000
            sqlite3_reset(insert)
            if code == SQLITE_DONE { result.waits.append(took) } else { result.failures += 1 }
            Thread.sleep(forTimeInterval: Double(intervalMilliseconds) / 1000)
        }
        return result
    }
}

/// Runs `shoal status --json` on the catching node every 200 ms and times each.
enum StatusProbe {
    struct Result: Sendable {
        var latencies: [Double] = []
        /// Answers without the running node's part (no live status found).
        var notLive = 0
        /// When (``Clock/now()``) the status said how many seconds the catch-up had left (its ETA).
        var estimates: [(at: Double, secondsLeft: Double)] = []
    }

    static func run(database: String, until done: StopFlag) -> Result {
        var result = Result()
        while !done.isSet {
            let started = Clock.now()
            guard let status = try? status(database: database) else { continue }
            result.latencies.append((Clock.now() - started) * 1000)
            if (status["running"] as? Bool) != true { result.notLive += 1 }
            let peers = status["peers"] as? [[String: Any]] ?? []
            if let left = peers.compactMap({ ($0["catchUpSecondsLeft"] as? NSNumber)?.doubleValue }).first {
                result.estimates.append((started, left))
            }
            Thread.sleep(forTimeInterval: 0.2)
        }
        return result
    }

    static func status(database: String) throws -> [String: Any] {
        let process = Process()
        process.executableURL = ServeProcess.executable()
        process.arguments = ["status", "--db", database, "--json"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (try JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
    }

    static func writeLock(database: String) throws -> (longest: Double, over50: Double, transactions: Double) {
        let lock = try status(database: database)["write_lock"] as? [String: Any] ?? [:]
        func number(_ key: String) -> Double { (lock[key] as? NSNumber)?.doubleValue ?? .nan }
        return (number("longest_ms"), number("over_50_ms"), number("transactions"))
    }
}

extension Thread {
    /// Runs `body` on a thread of its own; `value` waits for its result.
    static func detachNewThreadWithResult<T: Sendable>(_ body: @escaping @Sendable () -> T) -> ThreadResult<T> {
        let result = ThreadResult<T>()
        Thread.detachNewThread { result.finish(body()) }
        return result
    }
}

final class ThreadResult<T: Sendable>: @unchecked Sendable {
    // @unchecked: `stored` is written once under `condition`'s lock and read under it.
    private let condition = NSCondition()
    private var stored: T?

    func finish(_ value: T) {
        condition.withLock {
            stored = value
            condition.broadcast()
        }
    }

    var value: T {
        condition.withLock {
            while stored == nil { condition.wait() }
            return stored!
        }
    }
}
