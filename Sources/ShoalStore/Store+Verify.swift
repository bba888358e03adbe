import ShoalCore

/// A row whose data and replication metadata disagree (``Store/verify(limit:)``).
public struct RowMismatch: Sendable, Hashable, CustomStringConvertible {
    /// How the data row and its metadata disagree.
    public enum Kind: String, Sendable, Hashable {
        /// The metadata says the row is alive, but the table holds no data row for its key (it was deleted with
        /// Shoal's capture bypassed).
        case liveRowWithoutData = "live row without data"
        /// The metadata says the row was deleted, but the table holds a data row for its key.
        case deletedRowWithData = "deleted row with data"
        /// The table holds a data row Shoal has no metadata for (written with Shoal's capture bypassed).
        case dataWithoutMetadata = "data without metadata"
        /// The row's stored values are not those its metadata was last hashed with: changed with Shoal's capture
        /// bypassed, so peers hold other values under the same clocks.
        case valuesChangedUncaptured = "values changed without being captured"
    }

    /// The replicated table.
    public var table: String
    /// The row's primary key.
    public var primaryKey: [SQLValue]
    /// How its data and metadata disagree.
    public var kind: Kind

    /// What to do about it, for a person.
    public var remedy: String {
        switch kind {
        case .liveRowWithoutData:
            "insert the row again, through Shoal or any connection, with the values it should have (peers still hold "
                + "them: shoal verify --peer): the insert replicates; delete it afterwards, in a later transaction, "
                + "if it should be gone"
        case .valuesChangedUncaptured:
            "write the values it should have through Shoal or any connection; a write that leaves a value as it is "
                + "changes nothing, so to keep the value it holds now, set the column to something else and back in "
                + "one transaction"
        case .deletedRowWithData:
            "delete the row again (DELETE through Shoal or any connection): peers deleted it"
        case .dataWithoutMetadata:
            "delete the row and insert it again in one transaction, through Shoal or any connection, so that it "
                + "replicates; or delete it"
        }
    }

    /// `items (7): live row without data`.
    public var description: String {
        "\(table) (\(primaryKey.map(\.description).joined(separator: ", "))): \(kind.rawValue)"
    }
}

/// What ``Store/verify(limit:)`` found.
public struct ConsistencyReport: Sendable, Hashable {
    /// The digest as maintained incrementally (``Store/digest()``).
    public var maintained: StateDigest
    /// The digest recomputed from a scan of every data row and every row's metadata.
    public var scanned: StateDigest
    /// Rows whose data and metadata disagree, at most the limit asked for, in table and key order.
    public var mismatches: [RowMismatch]
    /// How many rows disagree in all (may exceed `mismatches.count`).
    public var mismatchCount: Int

    /// Whether the file is consistent: the maintained digest equals a full scan and no row disagrees.
    public var isConsistent: Bool { maintained == scanned && mismatchCount == 0 }
}

extension Store {
    /// Checks every replicated row: recomputes the digest from a scan (data rows, their presence and values, and
    /// their metadata), compares it with the maintained one, and lists each row whose data and metadata disagree.
    ///
    /// Such rows appear only when Shoal's capture was bypassed (a connection that dropped the capture triggers,
    /// a file edited by a tool that does not run triggers, an older Shoal applying with the app's triggers on);
    /// their digest differs from any file without them, so peers see the difference.
    public func verify(limit: Int = 1_000) throws(ShoalError) -> ConsistencyReport {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "verify outside of any open transaction")
        }
        // One snapshot in which every change is folded into the digest: a running node (or the app) commits between
        // the fold and the scan otherwise, and a row it changed would look changed without being captured. A few
        // tries on a snapshot taken after each fold; then the fold and the scan under the write lock.
        var attempt = 0
        while true {
            attempt += 1
            let underLock = attempt == 4
            _ = try digest()
            if underLock { try beginWriting() } else { try connection.exec("BEGIN") }
            do throws(ShoalError) {
                try refreshSchema()
                try refreshSites()
                let unfolded = try digestNeedsSettling(try storedTableDigests())
                let uncaptured = try outboxHoldsRows()
                if unfolded || uncaptured {
                    guard underLock else {
                        try connection.exec("COMMIT")
                        continue
                    }
                    try stampForeignWrites()
                    _ = try settleDigest(budget: nil)
                }
                let report = try verifyInSnapshot(limit: limit)
                try connection.exec("COMMIT")
                return report
            } catch {
                abandonWrite()
                throw error
            }
        }
    }

    /// Whether any table's outbox holds foreign writes not yet captured (read in the open transaction).
    private func outboxHoldsRows() throws(ShoalError) -> Bool {
        for table in capture.tables
        where try connection.scalar("SELECT 1 FROM \(Self.outboxTable(table.id)) LIMIT 1") != .null {
            return true
        }
        return false
    }

    /// ``verify(limit:)`` in the open transaction, on a digest with nothing left to fold.
    private func verifyInSnapshot(limit: Int) throws(ShoalError) -> ConsistencyReport {
        let maintained = try digestAsFolded()
        let scanned = try fullScanDigest()
        var mismatches: [RowMismatch] = []
        var count = 0
        func note(_ table: ReplicatedTable, _ key: [SQLValue], _ kind: RowMismatch.Kind) {
            count += 1
            if mismatches.count < limit { mismatches.append(RowMismatch(table: table.name, primaryKey: key, kind: kind)) }
        }
        let storedHash = try statement("SELECT hash FROM shoal_row_hashes WHERE tbl = ? AND key = ?")
        for table in capture.tables {
            try scanRowStates(of: table) { hash, key, state, hasData throws(ShoalError) in
                if state.isAlive && !hasData {
                    note(table, key, .liveRowWithoutData)
                } else if !state.isAlive && hasData {
                    note(table, key, .deletedRowWithData)
                } else {
                    // The maintained digest holds each row's hash as last computed; the digest was just settled, so a
                    // row hashing otherwise now changed without any write Shoal saw.
                    try storedHash.bind([.integer(table.id), .blob(SQLValue.encodeKey(key))])
                    let stored: [UInt8]? = try storedHash.step() ? storedHash.columnBytes(0) : nil
                    storedHash.reset()
                    if let stored, let hash, stored != hash { note(table, key, .valuesChangedUncaptured) }
                }
            }
            try scanRowsWithoutMetadata(of: table) { key, _ throws(ShoalError) in note(table, key, .dataWithoutMetadata) }
        }
        return ConsistencyReport(maintained: maintained, scanned: scanned, mismatches: mismatches, mismatchCount: count)
    }

    /// Every data row of `table` that has no metadata, with its key and values.
    func scanRowsWithoutMetadata(
        of table: ReplicatedTable,
        _ body: (_ key: [SQLValue], _ values: [SQLValue]) throws(ShoalError) -> Void
    ) throws(ShoalError) {
        let keys = table.keyColumns.map { "d.\(quote($0))" }
        let values = table.columns.map { "d.\(quote($0))" }
        let match = table.keyColumns.enumerated().map { "c.k\($0.offset) = d.\(quote($0.element))" }
        let select = try connection.prepare(
            "SELECT \((keys + values).joined(separator: ", ")) FROM \(quote(table.name)) d "
                + "WHERE NOT EXISTS (SELECT 1 FROM \(table.clockTable) c WHERE \(match.joined(separator: " AND ")))"
        )
        let keyCount = table.keyColumns.count
        while try select.step() {
            let row = select.row()
            try body(Array(row[0..<keyCount]), Array(row[keyCount...]))
        }
    }
}

extension Store {
    /// The row hash's format (``StateDigest/rowHash(table:primaryKey:state:columns:values:)``): 2 hashes the data
    /// row's presence and every stored value; 3 leaves out columns never written that hold their default (so that
    /// adding a column changes no row's hash); 4 leaves out tombstones (``StateDigest/counts(_:hasData:)``), which
    /// nodes collect at different times; 5 takes a row's columns in the order of their names (two nodes that each
    /// added a column first hold the two in another order).
    static let digestFormat: Int64 = 5

    /// Drops a maintained digest of an older format (its row hashes no longer match what a scan computes): the
    /// next ``digest()`` or ``settleDigest(maxRows:)`` scans each table once.
    func migrateDigestFormat() throws(ShoalError) {
        let format = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'digest_format'").integerValue
        guard format != Self.digestFormat else { return }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            try connection.exec(
                """
                DELETE FROM shoal_digest; DELETE FROM shoal_row_hashes; DELETE FROM shoal_digest_pending;
                DELETE FROM shoal_meta WHERE key LIKE 'digest\\_%' ESCAPE '\\';
                """
            )
            try connection.rows(
                "INSERT INTO shoal_meta(key, value) VALUES ('digest_format', ?)", [.integer(Self.digestFormat)]
            )
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }
}
