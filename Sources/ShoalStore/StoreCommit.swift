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

    /// A commit made by `origin`.
    public init(origin: Origin) {
        self.origin = origin
    }
}
