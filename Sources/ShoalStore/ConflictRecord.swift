import ShoalCore

/// A concurrent write that met a different value: who won, and both sides.
public struct ConflictRecord: Sendable, Hashable {
    /// Which side's value the table holds now.
    public enum Winner: String, Sendable, Hashable {
        /// The value this node held, or the one that arrived.
        case local, remote
    }

    /// The table of the conflicting write.
    public var table: String
    /// The row's primary key values.
    public var primaryKey: [SQLValue]
    /// The column both sides wrote.
    public var column: String
    /// The value this node held.
    public var localValue: SQLValue
    /// The stamp of the value this node held.
    public var localStamp: Stamp
    /// The value that arrived.
    public var remoteValue: SQLValue
    /// The stamp of the value that arrived.
    public var remoteStamp: Stamp
    /// Which side's value the table holds now (the larger stamp).
    public var winner: Winner
    /// When it was recorded (milliseconds since the Unix epoch); 0 before it is stored.
    public var recordedAt: UInt64 = 0

    /// Whether this is a write orphaned while offline: this node wrote it while it had lost history or was silent
    /// longer than its peers' horizon, to a row its peers deleted and collected meanwhile (``Store/takeFreshState(table:keys:peerVector:)``).
    /// Its value is kept here and nowhere else; ``Store/restoreOrphanedWrites(table:)`` writes it again.
    public var isOrphaned: Bool { remoteValue == .null && remoteStamp.hlc == .zero && winner == .remote }

    /// Why it is in the log: "orphaned while offline", or "concurrent write".
    public var reason: String { isOrphaned ? "orphaned while offline" : "concurrent write" }

    /// A conflict between the value held here and one that arrived, not yet recorded.
    public init(
        table: String,
        primaryKey: [SQLValue],
        column: String,
        localValue: SQLValue,
        localStamp: Stamp,
        remoteValue: SQLValue,
        remoteStamp: Stamp,
        winner: Winner
    ) {
        self.table = table
        self.primaryKey = primaryKey
        self.column = column
        self.localValue = localValue
        self.localStamp = localStamp
        self.remoteValue = remoteValue
        self.remoteStamp = remoteStamp
        self.winner = winner
    }
}

extension Store {
    /// Appends conflicts to the bounded conflict log.
    func record(_ conflicts: [ConflictRecord]) throws(ShoalError) {
        let now = Int64(options.clock.nowMilliseconds())
        let insert = try statement(
            "INSERT INTO shoal_conflicts(recorded_ms, tbl, pk, col, local_value, local_hlc, local_site, remote_value, "
                + "remote_hlc, remote_site, winner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        for conflict in conflicts {
            try insert.bind([
                .integer(now), .text(conflict.table), .blob(SQLValue.encodeKey(conflict.primaryKey)),
                .text(conflict.column), conflict.localValue,
                .integer(Int64(bitPattern: conflict.localStamp.hlc.rawValue)), .text(conflict.localStamp.site.hex),
                conflict.remoteValue, .integer(Int64(bitPattern: conflict.remoteStamp.hlc.rawValue)),
                .text(conflict.remoteStamp.site.hex), .text(conflict.winner.rawValue),
            ])
            try insert.run()
        }
        let trim = try statement("DELETE FROM shoal_conflicts WHERE id <= (SELECT max(id) FROM shoal_conflicts) - ?")
        try trim.bind([.integer(Int64(options.conflictLogLimit))])
        try trim.run()
    }

    /// The most recent conflicts, newest first.
    public func conflicts(limit: Int = 100) throws(ShoalError) -> [ConflictRecord] {
        let rows = try connection.rows(
            "SELECT recorded_ms, tbl, pk, col, local_value, local_hlc, local_site, remote_value, remote_hlc, "
                + "remote_site, winner FROM shoal_conflicts ORDER BY id DESC LIMIT ?",
            [.integer(Int64(limit))]
        )
        return try rows.map { row throws(ShoalError) in
            guard case .integer(let recorded) = row[0], case .text(let table) = row[1], case .blob(let key) = row[2],
                case .text(let column) = row[3], case .integer(let localHLC) = row[5],
                case .text(let localSite) = row[6], let localSiteID = SiteID(hex: localSite),
                case .integer(let remoteHLC) = row[8], case .text(let remoteSite) = row[9],
                let remoteSiteID = SiteID(hex: remoteSite), case .text(let winner) = row[10],
                let side = ConflictRecord.Winner(rawValue: winner)
            else { throw ShoalError.corruptMetadata("bad conflict log row") }
            var reader = ByteReader(key)
            var primaryKey: [SQLValue] = []
            while !reader.isAtEnd { primaryKey.append(try SQLValue.decode(from: &reader)) }
            var record = ConflictRecord(
                table: table,
                primaryKey: primaryKey,
                column: column,
                localValue: row[4],
                localStamp: Stamp(hlc: HLC(rawValue: UInt64(bitPattern: localHLC)), site: localSiteID, seq: 0),
                remoteValue: row[7],
                remoteStamp: Stamp(hlc: HLC(rawValue: UInt64(bitPattern: remoteHLC)), site: remoteSiteID, seq: 0),
                winner: side
            )
            record.recordedAt = UInt64(recorded)
            return record
        }
    }

    /// Writes again, as new writes of this node, the writes orphaned while offline (``ConflictRecord/isOrphaned``) in
    /// the conflict log, of `table` or of every table: each row comes back with the newest orphaned value of each of
    /// its columns (a row alive again meanwhile takes them as an update), and the records restored leave the log.
    /// Returns how many rows were written. The row's other columns take their defaults.
    public func restoreOrphanedWrites(table: String? = nil) throws(ShoalError) -> Int {
        try refreshSchema()
        var rows: [String: (table: String, key: [SQLValue], values: [(String, SQLValue)], ids: [Int64])] = [:]
        var order: [String] = []
        let records = try connection.rows(
            "SELECT id, tbl, pk, col, local_value FROM shoal_conflicts WHERE winner = 'remote' AND remote_hlc = 0 "
                + "AND remote_value IS NULL ORDER BY id DESC"
        )
        for record in records {
            guard case .integer(let id) = record[0], case .text(let name) = record[1], case .blob(let key) = record[2],
                case .text(let column) = record[3], table == nil || table == name
            else { continue }
            let label = name + "\u{0}" + key.map { String($0) }.joined(separator: ",")
            if rows[label] == nil {
                var reader = ByteReader(key)
                var values: [SQLValue] = []
                while !reader.isAtEnd { values.append(try SQLValue.decode(from: &reader)) }
                rows[label] = (name, values, [], [])
                order.append(label)
            }
            rows[label]?.ids.append(id)
            // Newest first: the first value seen of a column is the one kept.
            if rows[label]?.values.contains(where: { $0.0 == column }) == false {
                rows[label]?.values.append((column, record[4]))
            }
        }
        guard !order.isEmpty else { return 0 }
        var restored = 0
        try execute("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            for label in order {
                guard let row = rows[label], let number = capture.tableNumbers[row.table] else { continue }
                let shape = capture.tables[number]
                guard row.key.count == shape.keyColumns.count else { continue }
                let columns = shape.keyColumns + row.values.map(\.0)
                let updates = row.values.map { "\(quote($0.0)) = excluded.\(quote($0.0))" }
                let sql =
                    "INSERT INTO \(quote(shape.name))(\(columns.map(quote).joined(separator: ", "))) VALUES ("
                    + Array(repeating: "?", count: columns.count).joined(separator: ", ") + ") ON CONFLICT("
                    + shape.keyColumns.map(quote).joined(separator: ", ") + ") DO "
                    + (updates.isEmpty ? "NOTHING" : "UPDATE SET " + updates.joined(separator: ", "))
                _ = try execute(sql, row.key + row.values.map(\.1))
                for id in row.ids { try connection.rows("DELETE FROM shoal_conflicts WHERE id = ?", [.integer(id)]) }
                restored += 1
            }
            try execute("COMMIT")
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
        return restored
    }

    /// How many conflicts the log holds.
    public func conflictCount() throws(ShoalError) -> Int {
        Int(try connection.scalar("SELECT count(*) FROM shoal_conflicts").integerValue ?? 0)
    }
}
