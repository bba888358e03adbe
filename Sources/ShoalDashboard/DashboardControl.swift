/// A control the page sends (`POST /control`, a JSON body): what to do, and to which node or pair of nodes.
public struct DashboardControl: Codable, Sendable, Equatable {
    /// What to do.
    public enum Action: String, Codable, Sendable {
        /// Write a burst of rows on `node`.
        case burst
        /// Cut the link between `node` and `peer` (every link of `node` when `peer` is nil).
        case partition
        /// Mend the link between `node` and `peer` (every cut link when `node` is nil too).
        case heal
        /// Stop `node`'s process, or start it again.
        case stop, start
        /// Add a column to the replicated table on `node` (a schema change that travels to the others).
        case addColumn = "add-column"
        /// Delete many rows on `node` (each leaves a tombstone on every node).
        case deleteRows = "delete-rows"
    }

    /// What to do.
    public var action: Action
    /// The node, by index.
    public var node: Int?
    /// The other end of a link, by index.
    public var peer: Int?

    /// A control.
    public init(action: Action, node: Int? = nil, peer: Int? = nil) {
        self.action = action
        self.node = node
        self.peer = peer
    }
}

/// Why a control was refused, for the page.
public struct DashboardControlError: Error, Sendable, CustomStringConvertible {
    /// What to tell the person.
    public var message: String

    /// A refusal saying `message`.
    public init(_ message: String) { self.message = message }

    /// The message.
    public var description: String { message }
}
