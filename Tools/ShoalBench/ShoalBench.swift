import ArgumentParser
import CSQLite
import Foundation
import Shoal

@main
struct ShoalBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "shoal-bench",
        abstract: "Shoal's benchmarks. Figures are medians of several runs, measured side by side in one process.",
        subcommands: [StoreBenchmark.self, SyncBenchmark.self, RelayBenchmark.self, ObserveBenchmark.self, SchemaBenchmark.self]
    )
}

struct StoreBenchmark: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Write overhead of change capture, the speed of applying remote changes, and change-log compaction."
    )

    @Flag(help: "Print one JSON object instead of a table.") var json = false
    @Option(help: "Runs per figure (the median is reported).") var runs = 5
    @Option(help: "Rows in the bulk transaction.") var rows = 100_000
    @Option(help: "One-row transactions.") var transactions = 5_000
    @Option(help: "Run one phase only, for profiling: write, foreign, single, apply, pipe or compact.") var only: String?

    func run() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shoal-bench-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var counter = 0
        func freshStore(replicated: Bool) throws -> Store {
            counter += 1
            let store = try Store(path: directory.appendingPathComponent("\(counter).db").path)
            try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER, c REAL)")
            if replicated { try store.replicate(table: "t") }
            return store
        }

        var plainBulk: [Double] = []
        var replicatedBulk: [Double] = []
        var foreignPlain: [Double] = []
        var foreignReplicated: [Double] = []
        var plainSingle: [Double] = []
        var replicatedSingle: [Double] = []
        var apply: [Double] = []
        var reapply: [Double] = []
        var pipe: [Double] = []
        var pipeCPU: [Double] = []
        var piped = 0
        var applied = 0
        var compaction: [Double] = []
        var logBefore = 0
        var logAfter = 0
        for _ in 0..<runs {
            // Bulk: one transaction of `rows` inserts, plain then replicated, alternating run by run.
            for replicated in [false, true] where only == nil || only == "write" {
                let store = try freshStore(replicated: replicated)
                let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
                let seconds = try time {
                    try store.transaction {
                        for id in 0..<rows {
                            try insert.execute([
                                .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                            ])
                        }
                    }
                }
                if replicated { replicatedBulk.append(seconds) } else { plainBulk.append(seconds) }
            }
            // The bulk transaction written by a plain second SQLite connection (an app's own driver), into a
            // plain table, then into a replicated one followed by the store capturing it (one dot).
            for replicated in [false, true] where only == nil || only == "foreign" {
                let store = try freshStore(replicated: replicated)
                let seconds = try time {
                    try insertWithPlainConnection(path: store.path, rows: rows)
                    if replicated {
                        guard try store.captureForeignWrites() else { throw ValidationError("nothing captured") }
                    }
                }
                if replicated {
                    guard try logEntries(store) == 1 else { throw ValidationError("the foreign transaction was split") }
                    foreignReplicated.append(seconds)
                } else {
                    foreignPlain.append(seconds)
                }
            }
            // Single-row transactions.
            for replicated in [false, true] where only == nil || only == "single" {
                let store = try freshStore(replicated: replicated)
                let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
                let seconds = try time {
                    for id in 0..<transactions {
                        try insert.execute([
                            .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                        ])
                    }
                }
                if replicated { replicatedSingle.append(seconds) } else { plainSingle.append(seconds) }
            }
            // Compaction of an update-heavy log: 1,000 rows inserted in one transaction, then `transactions`
            // one-row updates of one column, round robin; every entry but each row's last update is overwritten.
            if only == nil || only == "compact" {
                let store = try freshStore(replicated: true)
                let insert = try store.prepare("INSERT INTO t(id, a, b, c) VALUES (?, 'new', 0, 0)")
                try store.transaction { for id in 0..<1_000 { try insert.execute([.integer(Int64(id))]) } }
                let update = try store.prepare("UPDATE t SET a = ? WHERE id = ?")
                for version in 0..<transactions {
                    try update.execute([.text("v\(version)"), .integer(Int64(version % 1_000))])
                }
                let digest = try store.digest()
                logBefore = try logEntries(store)
                compaction.append(try time { while try !store.compactLog().reachedEnd {} })
                logAfter = try logEntries(store)
                guard try store.digest() == digest else { throw ValidationError("compaction changed the data") }
            }
            // Apply the bulk transaction's changes (rows × 3 column changes) on a fresh replica, then again;
            // and the same offline, through `shoal changes | shoal apply` (the real binaries, a real pipe).
            guard only == nil || only == "apply" || only == "pipe" else { continue }
            let source = try freshStore(replicated: true)
            let insert = try source.prepare("INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)")
            try source.transaction {
                for id in 0..<rows {
                    try insert.execute([
                        .integer(Int64(id)), .text("row \(id)"), .integer(Int64(id) * 7), .real(Double(id) / 3),
                    ])
                }
            }
            if only == nil || only == "pipe" {
                let target = try freshStore(replicated: true)
                let cpuBefore = childrenCPUSeconds()
                pipe.append(try time { try pipeChanges(from: source.path, to: target.path) })
                pipeCPU.append(childrenCPUSeconds() - cpuBefore)
                piped = rows * 3
                guard try target.digest() == source.digest() else { throw ValidationError("the pipe diverged") }
                guard only == nil else { continue }
            }
            let batches = try source.changes(since: VersionVector(), maxChangesPerBatch: 50_000)
            applied = batches.reduce(0) { $0 + $1.changes.count }
            let target = try freshStore(replicated: true)
            apply.append(try time { for batch in batches { try target.apply(batch.changes, claim: batch.claim) } })
            reapply.append(try time { for batch in batches { try target.apply(batch.changes, claim: batch.claim) } })
            guard try target.digest() == source.digest() else { throw ValidationError("replicas diverged") }
        }
        let measured: [(String, Double)] = [
            ("write_plain_rows_per_s", Double(rows) / median(plainBulk)),
            ("write_replicated_rows_per_s", Double(rows) / median(replicatedBulk)),
            ("write_overhead_ratio", median(replicatedBulk) / median(plainBulk)),
            ("foreign_plain_rows_per_s", Double(rows) / median(foreignPlain)),
            ("foreign_captured_rows_per_s", Double(rows) / median(foreignReplicated)),
            ("foreign_write_overhead_ratio", median(foreignReplicated) / median(foreignPlain)),
            ("single_tx_plain_per_s", Double(transactions) / median(plainSingle)),
            ("single_tx_replicated_per_s", Double(transactions) / median(replicatedSingle)),
            ("single_tx_overhead_ratio", median(replicatedSingle) / median(plainSingle)),
            ("apply_changes_per_s", Double(applied) / median(apply)),
            ("reapply_changes_per_s", Double(applied) / median(reapply)),
            ("pipe_changes_per_s", Double(piped) / median(pipe)),
            // The same per second of CPU used by both processes together: comparable on a busy machine.
            ("pipe_changes_per_cpu_s", Double(piped) / median(pipeCPU)),
            ("compact_log_entries_per_s", Double(logBefore) / median(compaction)),
            ("compact_log_kept_ratio", logBefore > 0 ? Double(logAfter) / Double(logBefore) : .nan),
        ]
        // With `--only`, the parts not run have no figure (rather than a NaN).
        let figures = measured.filter { $0.1.isFinite }
        if json {
            var object: [String: Any] = ["runs": runs, "rows": rows, "transactions": transactions, "changes": applied]
            for (name, value) in figures { object[name] = (value * 1000).rounded() / 1000 }
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            print(
                "shoal-bench store: \(rows) rows bulk, \(transactions) one-row transactions, \(applied) changes applied; median of \(runs) runs"
            )
            for (name, value) in figures {
                let text = value < 100 ? String(format: "%.3f", value) : String(format: "%.0f", value)
                print(name.padding(toLength: 30, withPad: " ", startingAt: 0) + text)
            }
        }
    }
}

/// Inserts `rows` rows into `t` in one transaction through a plain SQLite connection of its own (the C API,
/// as an application's own driver would), not through Shoal.
func insertWithPlainConnection(path: String, rows: Int) throws {
    var handle: OpaquePointer?
    guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let handle else {
        throw ValidationError("cannot open \(path)")
    }
    defer { sqlite3_close_v2(handle) }
    sqlite3_busy_timeout(handle, 10_000)
    func check(_ code: Int32, _ expected: Int32 = SQLITE_OK) throws {
        guard code == expected else { throw ValidationError(String(cString: sqlite3_errmsg(handle))) }
    }
    try check(sqlite3_exec(handle, "PRAGMA synchronous = NORMAL; BEGIN", nil, nil, nil))
    var insert: OpaquePointer?
    try check(sqlite3_prepare_v2(handle, "INSERT INTO t(id, a, b, c) VALUES (?, ?, ?, ?)", -1, &insert, nil))
    defer { sqlite3_finalize(insert) }
    let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
    for id in 0..<rows {
        sqlite3_bind_int64(insert, 1, Int64(id))
        sqlite3_bind_text(insert, 2, "row \(id)", -1, transient)
        sqlite3_bind_int64(insert, 3, Int64(id) * 7)
        sqlite3_bind_double(insert, 4, Double(id) / 3)
        try check(sqlite3_step(insert), SQLITE_DONE)
        sqlite3_reset(insert)
    }
    try check(sqlite3_exec(handle, "COMMIT", nil, nil, nil))
}

/// Runs `shoal changes --db from | shoal apply --db to` with the `shoal` executable built beside this one.
func pipeChanges(from: String, to: String) throws {
    let executable = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        .deletingLastPathComponent().appendingPathComponent("shoal")
    guard FileManager.default.isExecutableFile(atPath: executable.path) else {
        throw ValidationError("build the shoal executable too (swift build -c release): \(executable.path) is missing")
    }
    let changes = Process()
    changes.executableURL = executable
    changes.arguments = ["changes", "--db", from]
    let apply = Process()
    apply.executableURL = executable
    apply.arguments = ["apply", "--db", to]
    let pipe = Pipe()
    changes.standardOutput = pipe
    apply.standardInput = pipe
    apply.standardOutput = FileHandle.nullDevice
    apply.standardError = FileHandle.nullDevice
    try changes.run()
    try apply.run()
    try pipe.fileHandleForWriting.close()
    try pipe.fileHandleForReading.close()
    changes.waitUntilExit()
    apply.waitUntilExit()
    guard changes.terminationStatus == 0, apply.terminationStatus == 0 else {
        throw ValidationError("shoal changes | shoal apply failed")
    }
}

/// User and system CPU time used so far by the child processes that have ended.
func childrenCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_CHILDREN.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// How many entries the change log holds.
func logEntries(_ store: Store) throws -> Int {
    guard case .integer(let count) = try store.execute("SELECT count(*) FROM shoal_log").rows.first?.first else {
        return 0
    }
    return Int(count)
}

func time(_ body: () throws -> Void) throws -> Double {
    let start = DispatchTime.now().uptimeNanoseconds
    try body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    guard !sorted.isEmpty else { return .nan }
    return sorted.count % 2 == 1
        ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
}

/// Prints named figures: one JSON object (values to three decimals), or a table of name and value.
func printFigures(_ figures: [(String, Double)], json: Bool, width: Int = 30) {
    if json {
        var object: [String: Any] = [:]
        for (name, value) in figures { object[name] = (value * 1000).rounded() / 1000 }
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        print(String(decoding: data, as: UTF8.self))
    } else {
        for (name, value) in figures {
            let text = value < 100 ? String(format: "%.3f", value) : String(format: "%.0f", value)
            print(name.padding(toLength: width, withPad: " ", startingAt: 0) + text)
        }
    }
}
