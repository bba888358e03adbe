import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import Shoal

extension ShoalCommand {
    struct Feed: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "feed",
            abstract: "Print the database's committed change sets as JSON lines, then each new one, until interrupted.",
            discussion: """
                One line per change set: {"dot": "SITE:SEQ", "local": true|false, "hlc_ms": ..., "rows": [{"table": \
                ..., "key": [...], "deleted": false, "columns": {...}}], "cursor": "..."}. Give a line's cursor back \
                with --after to resume after it (after a restart too). A row overwritten since comes with the change \
                set that last wrote it. Works beside a running `shoal serve` on the same file.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only change sets of these replicated tables (comma-separated).") var tables: String?
        @Option(help: "Resume after this cursor (a line's \"cursor\").") var after: String?

        func run() async throws {
            try database.requireExisting()
            let cursor = try after.map { text in
                guard let cursor = ChangeFeedCursor(text: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--after wants a feed cursor (a line's \"cursor\"), got \"\(text)\"")
                }
                return cursor
            } ?? ChangeFeedCursor()
            let followed = tables.map { Set($0.split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }) }
            let store = try SerializedStore(path: database.db, options: StoreOptions())
            if let followed {
                let replicated = Set(try await store.read { store throws(ShoalError) in try store.replicatedTables() })
                let unknown = followed.subtracting(replicated)
                guard unknown.isEmpty else {
                    throw ShoalError(code: .invalidArgument, message: "not replicated here: \(unknown.sorted().joined(separator: ", "))")
                }
            }
            let group = ServiceGroup(
                services: [FeedPrinter(store: store, tables: followed, cursor: cursor)],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: Logger(label: "shoal.feed")
            )
            try await group.run()
        }
    }
}

/// Prints a change feed as JSON lines until the service group stops it; other processes' commits are noticed by
/// looking at SQLite's `data_version` every 50 ms, as a node does.
struct FeedPrinter: Service {
    let store: SerializedStore
    let tables: Set<String>?
    let cursor: ChangeFeedCursor

    func run() async throws {
        try await followingOtherWriters(store) {
            for try await set in store.changes(in: tables, after: cursor) {
                FileHandle.standardOutput.write(Data((Self.line(set) + "\n").utf8))
            }
        }
    }

    static func line(_ set: FeedChangeSet) -> String {
        let rows: [[String: Any]] = set.rows.map { row in
            [
                "table": row.table,
                "key": row.primaryKey.map(Output.jsonValue),
                "deleted": row.deleted,
                "columns": row.columns.mapValues(Output.jsonValue),
            ]
        }
        return Output.serialize([
            "dot": "\(set.dot.site.hex):\(set.dot.seq)",
            "local": set.isLocal,
            "hlc_ms": set.hlc.milliseconds,
            "rows": rows,
            "cursor": set.cursor.text,
        ])
    }
}
