import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import Shoal

extension ShoalCommand {
    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "watch",
            abstract: "Print a query's result now, and again after every change to what it reads, until interrupted.",
            discussion: """
                Works beside a running `shoal serve` on the same file and beside any other writer: changes from \
                peers, the relay, the app and the sqlite3 shell all show. A result is printed only when it differs \
                from the last one; under a burst of changes the newest is printed. --json prints each result as one \
                JSON line: {"at_ms": ..., "rows": [{"column": value, ...}, ...]}.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print each result as one JSON line instead of a table.") var json = false
        @Argument(help: "The query (one statement that writes nothing).") var sql: String

        func run() async throws {
            try database.requireExisting()
            let store = try SerializedStore(path: database.db, options: StoreOptions())
            let watcher = QueryWatcher(store: store, sql: sql, json: json)
            let group = ServiceGroup(
                services: [watcher], gracefulShutdownSignals: [.sigterm, .sigint], logger: Logger(label: "shoal.watch")
            )
            try await group.run()
        }
    }
}

/// Prints a live query's results until the service group stops it. Other processes' commits are noticed by looking
/// at SQLite's `data_version` every 50 ms, as a node does.
struct QueryWatcher: Service {
    let store: SerializedStore
    let sql: String
    let json: Bool

    func run() async throws {
        try await followingOtherWriters(store) {
            for try await result in store.observe(sql) {
                FileHandle.standardOutput.write(Data((render(result) + "\n").utf8))
            }
        }
    }

    private func render(_ result: QueryResult) -> String {
        guard json else {
            return Output.table(columns: result.columns, rows: result.rows)
        }
        let rows = result.rows.map { row in
            Dictionary(uniqueKeysWithValues: zip(result.columns, row.map(Output.jsonValue)))
        }
        return Output.serialize(["at_ms": SystemWallClock().nowMilliseconds(), "rows": rows])
    }
}

/// Runs `body` until the service group stops it (then returns) while noticing other processes' commits to `store`'s
/// file (a running node's applies, the app's writes) by looking at SQLite's `data_version` every 50 ms, as a node does.
func followingOtherWriters(
    _ store: SerializedStore,
    _ body: @escaping @Sendable () async throws -> Void
) async throws {
    do {
        try await cancelWhenGracefulShutdown {
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask {
                    while true {
                        try await Task.sleep(for: .milliseconds(50))
                        _ = try? await store.changedElsewhere()
                    }
                }
                group.addTask {
                    try await body()
                    throw CancellationError()  // the sequence ended: so does the command
                }
            }
        }
    } catch is CancellationError {
        // Interrupted.
    }
}
