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

    /// How many conflicts the log holds.
    public func conflictCount() throws(ShoalError) -> Int {
        Int(try connection.scalar("SELECT count(*) FROM shoal_conflicts").integerValue ?? 0)
    }
}
