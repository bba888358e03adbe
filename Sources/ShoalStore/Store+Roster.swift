import ShoalCore

/// The cluster's roster, as the store keeps it: opaque signed records (ShoalSecurity writes and checks them), in a
/// table that replicates like any other, so that membership spreads with the ordinary anti-entropy rounds.
///
/// Rows are keyed by the SHA-256 of their record, so two members never write different values under one key, and a
/// removal is a record of its own that no add can overwrite. Every record ever seen is also copied to a local table
/// that is never replicated nor deleted from: a row deleted by hand (and the delete spread) cannot bring a removed
/// node back on a member that saw the removal.
extension Store {
    /// The replicated roster table.
    public static let rosterTable = "shoal_roster"

    /// Creates and replicates the roster table, and the local copy of every record seen; does nothing the second
    /// time.
    public func prepareRoster() throws(ShoalError) {
        try connection.exec(
            """
            CREATE TABLE IF NOT EXISTS \(Self.rosterTable)(id BLOB PRIMARY KEY, record BLOB);
            CREATE TABLE IF NOT EXISTS shoal_roster_seen(id BLOB PRIMARY KEY, record BLOB NOT NULL) WITHOUT ROWID;
            """
        )
        try replicate(table: Self.rosterTable)
    }

    /// Adds a record (a change of this node, replicated like any write); a record already held is left alone.
    public func addRosterRecord(_ record: [UInt8], id: [UInt8]) throws(ShoalError) {
        if try !hasRoster() { try prepareRoster() }
        let insert = try statement("INSERT OR IGNORE INTO \(Self.rosterTable)(id, record) VALUES (?, ?)")
        try insert.bind([.blob(id), .blob(record)])
        _ = try run(insert, control: nil)
        try rememberRosterRecords()
    }

    /// Every roster record this node ever held, replicated or remembered, in no particular order. Records that
    /// arrived since the last call are remembered first.
    public func rosterRecords() throws(ShoalError) -> [[UInt8]] {
        guard try hasRoster() else { return [] }
        try rememberRosterRecords()
        return try connection.rows("SELECT record FROM shoal_roster_seen").compactMap { row in
            if case .blob(let bytes) = row.first { bytes } else { nil }
        }
    }

    /// Whether the roster tables exist (a database made before peers authenticated has none until it serves).
    public func hasRoster() throws(ShoalError) -> Bool {
        try connection.scalar("SELECT count(*) FROM sqlite_schema WHERE name = 'shoal_roster_seen'").integerValue ?? 0 > 0
    }

    /// Copies records not remembered yet; writes nothing (opens no write transaction) when there are none, nor
    /// while a transaction is open on this connection (the next call copies them).
    private func rememberRosterRecords() throws(ShoalError) {
        guard connection.isAutocommit, !capture.hasUncommittedWork else { return }
        let unseen = "FROM \(Self.rosterTable) r WHERE typeof(r.id) = 'blob' AND typeof(r.record) = 'blob' "
            + "AND NOT EXISTS (SELECT 1 FROM shoal_roster_seen s WHERE s.id = r.id)"
        guard try connection.scalar("SELECT count(*) \(unseen)").integerValue ?? 0 > 0 else { return }
        try connection.exec("INSERT OR IGNORE INTO shoal_roster_seen(id, record) SELECT r.id, r.record \(unseen)")
    }
}

extension Store {
    /// Drops every roster record (a database that joins another cluster leaves its own roster behind).
    public func resetRoster() throws(ShoalError) {
        guard try hasRoster() else { return }
        let delete = try statement("DELETE FROM \(Self.rosterTable)")
        _ = try run(delete, control: nil)
        try connection.exec("DELETE FROM shoal_roster_seen")
    }
}
