import ShoalCore

/// A commit that may have changed a database's data, as ``SerializedStore/commits()`` reports it.
public struct StoreCommit: Sendable, Hashable {
    /// What made a commit.
    public enum Origin: Sendable, Hashable {
        /// A write through the serialized store (the node's own connection: the app through the node, membership).
        case local
        /// Another connection's write (an app's own connection, the `sqlite3` shell), captured by the node.
        case otherConnection
        /// Changes applied from a peer over a link.
        case peer
        /// Changes applied from the relay.
        case relay
    }

    /// What made it.
    public var origin: Origin
    /// The replicated tables it wrote; nil when they are not known (a write through the store's door may have written
    /// any table, replicated or not): then every observer looks again.
    public var tables: Set<String>?
    /// The transactions it committed, as far as this store stamped or applied them (another process's own writes
    /// are not known here). Their rows and columns are in the change feed (``SerializedStore/changes(in:after:)``).
    public var dots: Set<Dot>
    /// Counts the store's commits: a result read at generation N already holds every commit up to N.
    public var generation: Int

    /// A commit made by `origin`, writing `tables` in transactions `dots`.
    public init(origin: Origin, tables: Set<String>?, dots: Set<Dot> = [], generation: Int) {
        self.origin = origin
        self.tables = tables
        self.dots = dots
        self.generation = generation
    }

    /// Whether it may have changed what a query reading `read` returns.
    public func touches(_ read: Set<String>) -> Bool {
        tables.map { !$0.isDisjoint(with: read) } ?? true
    }
}
