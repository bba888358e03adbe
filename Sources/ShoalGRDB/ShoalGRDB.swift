import GRDB
import Shoal

/// Makes GRDB's observations on the node's database file see what Shoal writes.
///
/// GRDB's `ValueObservation` and `DatabaseRegionObservation` notice the writes made through the GRDB writer
/// (`DatabaseQueue` or `DatabasePool`) they observe. Shoal writes the same file through its own connection (changes
/// from peers and the relay, and the writes it stamps), which GRDB cannot see. ``GRDBChangeNotifier`` follows the
/// node store's commits and tells GRDB which tables each one wrote, with `Database.notifyChanges(in:)`, so an
/// observation of those tables refreshes as if the app had written them.
///
/// ```swift
/// let pool = try DatabasePool(path: "app.db")
/// let notifier = GRDBChangeNotifier(store: node.store, writer: pool)  // run it beside the node (a Service)
/// ```
public struct GRDBChangeNotifier: Sendable {
    /// The node's store, whose commits are followed.
    public let store: SerializedStore
    /// The app's GRDB writer on the same file.
    public let writer: any DatabaseWriter

    /// A notifier telling `writer`'s observations about `store`'s commits.
    public init(store: SerializedStore, writer: any DatabaseWriter) {
        self.store = store
        self.writer = writer
    }

    /// Follows the store's commits until the task is cancelled. Commits made through GRDB itself are already seen by
    /// GRDB; telling it again only refreshes its observations once more (they drop results equal to the last).
    public func run() async throws {
        for await commit in await store.commits() {
            // A commit whose tables are not known (a write through the node's door, another process's write):
            // every table may have changed.
            let tables = commit.tables
            try await writer.write { db in
                if let tables {
                    for table in tables.sorted() { try db.notifyChanges(in: Table(table)) }
                } else {
                    try db.notifyChanges(in: .fullDatabase)
                }
            }
        }
    }
}
