/// One replicated change: the unit that travels between nodes.
///
/// A transaction's changes share one ``Stamp`` (and so one ``Dot``). Every change carries the row's causal
/// length as its writer saw it: odd means the row is alive, even means it is deleted.
public struct Change: Hashable, Sendable {
    /// What the change sets.
    public enum Payload: Hashable, Sendable {
        /// The row's causal length itself (a delete, or an insert that revives a deleted row).
        case row
        /// A last-writer-wins column value.
        case column(String, SQLValue)
        /// The writing site's total contribution to a counter column.
        case counter(String, increments: UInt64, decrements: UInt64)
    }

    /// The replicated table the change belongs to.
    public var table: String
    /// The row's primary key values, in the key's column order.
    public var primaryKey: [SQLValue]
    /// What the change sets.
    public var payload: Payload
    /// The row's causal length as the writer saw it: odd while the row is alive, even once deleted.
    public var causalLength: UInt64
    /// When, where and in which transaction the change was made.
    public var stamp: Stamp
    /// For a column value: the write it overwrote where it was made, if any. A change that overwrote exactly
    /// the value a receiver holds is a successor of it, not a conflict.
    public var previous: Dot?

    /// A change; `previous` is the write it overwrote where it was made, if any.
    public init(
        table: String,
        primaryKey: [SQLValue],
        payload: Payload,
        causalLength: UInt64,
        stamp: Stamp,
        previous: Dot? = nil
    ) {
        self.table = table
        self.primaryKey = primaryKey
        self.payload = payload
        self.causalLength = causalLength
        self.stamp = stamp
        self.previous = previous
    }

    /// The transaction this change belongs to.
    public var dot: Dot { stamp.dot }

    /// The column this change writes, if any.
    public var columnName: String? {
        switch payload {
        case .row: nil
        case .column(let name, _), .counter(let name, _, _): name
        }
    }
}

/// A group of changes cut at transaction boundaries, with what the sender may claim once they are applied.
public struct ChangeBatch: Hashable, Sendable {
    /// The changes, ordered by (site, seq); a transaction's changes are never split across batches.
    public var changes: [Change]
    /// The version the receiver holds once it has applied this batch and every one before it.
    public var claim: VersionVector

    /// A batch of `changes` that lets the receiver claim `claim` once applied.
    public init(changes: [Change], claim: VersionVector) {
        self.changes = changes
        self.claim = claim
    }
}
