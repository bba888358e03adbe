#if canImport(Glibc)
import Glibc
#endif
import CSQLite
import ShoalCore

/// The statements that read and write one table's row metadata, and read or delete its data rows by key.
struct ClockStatements {
    let select: SQLiteStatement
    let upsert: SQLiteStatement
    let insert: SQLiteStatement
    /// Inserts ``Store/freshBatchSize`` new rows' metadata at once.
    let insertBatch: SQLiteStatement
    /// `1`, then the data row's non-key columns (``ReplicatedTable/selectRowSQL``).
    let selectRow: SQLiteStatement
    /// Deletes the data row (``ReplicatedTable/deleteRowSQL``).
    let deleteRow: SQLiteStatement
}

extension Store {
    func clockStatements(_ table: ReplicatedTable) throws(ShoalError) -> ClockStatements {
        if let cached = clockStatements[table.id] { return cached }
        let keys = table.keyColumns.indices.map { "k\($0)" }.joined(separator: ", ")
        let marks = Array(repeating: "?", count: table.keyColumns.count + 1).joined(separator: ", ")
        let prepared = ClockStatements(
            select: try connection.prepare("SELECT meta FROM \(table.clockTable) WHERE \(table.clockKeyPredicate)"),
            upsert: try connection.prepare(
                "INSERT OR REPLACE INTO \(table.clockTable)(\(keys), meta) VALUES (\(marks))"
            ),
            insert: try connection.prepare(
                "INSERT OR IGNORE INTO \(table.clockTable)(\(keys), meta) VALUES (\(marks))"
            ),
            insertBatch: try connection.prepare(
                "INSERT OR IGNORE INTO \(table.clockTable)(\(keys), meta) VALUES "
                    + Array(repeating: "(\(marks))", count: Self.freshBatchSize).joined(separator: ", ")
            ),
            selectRow: try connection.prepare(table.selectRowSQL),
            deleteRow: try connection.prepare(table.deleteRowSQL)
        )
        clockStatements[table.id] = prepared
        return prepared
    }

    /// The metadata of one row, or `nil` when the row was never seen.
    func loadState(table: ReplicatedTable, key: [SQLValue]) throws(ShoalError) -> RowState? {
        let select = try clockStatements(table).select
        try select.bind(key)
        defer { select.reset() }
        guard try select.step() else { return nil }
        return try RowState(encoded: select.columnBytes(0), columnCount: table.columns.count, sites: sites)
    }

    /// Writes a row's metadata.
    func saveState(_ state: RowState, table: ReplicatedTable, key: [SQLValue]) throws(ShoalError) {
        let upsert = try clockStatements(table).upsert
        try bindKey(key, meta: state.encoded(sites: &sites), to: upsert)
        try upsert.run()
        try persistNewSites()
        openCursors.touch(table: table.id, key: key)
    }

    /// How many new rows' metadata one statement inserts.
    static let freshBatchSize = 64

    /// Writes the same encoded metadata for ``freshBatchSize`` new rows; returns the keys that already had
    /// metadata (and so were left alone).
    func insertStates(_ meta: [UInt8], table: ReplicatedTable, keys: [PendingKey]) throws(ShoalError) -> [PendingKey] {
        let insert = try clockStatements(table).insertBatch
        insert.reset()
        let width = table.keyColumns.count + 1
        // Every row binds the same bytes, read by SQLite in place during `run`, from a buffer that outlives it.
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: max(meta.count, 1), alignment: 1)
        defer { bytes.deallocate() }
        bytes.copyBytes(from: meta)
        let stable = UnsafeRawBufferPointer(rebasing: bytes[0..<meta.count])
        defer { insert.clearBindings() }
        for (row, key) in keys.enumerated() {
            switch key {
            case .rowid(let rowid):
                insert.bind(rowid, at: row * width + 1)
            case .values(let values):
                for (index, value) in values.enumerated() { try insert.bind(value, at: row * width + index + 1) }
            }
            try insert.bindStatic(stable, at: row * width + width)
        }
        try insert.run()
        guard sqlite3_changes(connection.handle) < keys.count else { return [] }
        // Some rows had metadata already (a deleted row inserted again): the others now hold `meta`,
        // which no earlier transaction can have written.
        var existing: [PendingKey] = []
        let select = try clockStatements(table).select
        for key in keys {
            try select.bind(key.values)
            let held = try select.step() ? select.columnBytes(0) : []
            select.reset()
            if held != meta { existing.append(key) }
        }
        return existing
    }

    /// Writes a new row's encoded metadata; `false` if the row already has some.
    func insertState(_ meta: [UInt8], table: ReplicatedTable, key: PendingKey) throws(ShoalError) -> Bool {
        let insert = try clockStatements(table).insert
        switch key {
        case .rowid(let rowid):
            insert.reset()
            insert.bind(rowid, at: 1)
            try insert.bind(meta, at: 2)
        case .values(let values):
            try bindKey(values, meta: meta, to: insert)
        }
        try insert.run()
        try persistNewSites()
        return sqlite3_changes(connection.handle) > 0
    }

    private func bindKey(_ key: [SQLValue], meta: [UInt8], to statement: SQLiteStatement) throws(ShoalError) {
        statement.reset()
        for (index, value) in key.enumerated() { try statement.bind(value, at: index + 1) }
        try statement.bind(meta, at: key.count + 1)
    }

    // A change-log key list is keys one after the other, each its encoded length (a varint), then the key encoded
    // (``SQLValue/encodeKey(_:)``). A key of one integer is written shorter: a length of 0, then the integer
    // zigzag-encoded as a varint (3 bytes for keys under a million, where its whole encoding took 10 with its length);
    // lists written before hold the whole encoding, which is still read.

    /// Adds a key to a change-log key list.
    func appendLogKey(_ key: PendingKey, to buffer: inout [UInt8]) {
        switch key {
        case .rowid(let rowid): Self.appendLogInteger(rowid, to: &buffer)
        case .values(let values): appendLogKey(values, to: &buffer)
        }
    }

    /// Reads the next key of a change-log entry's list (as ``appendLogKey(_:to:)`` wrote it) for table `table`.
    static func readLogKey(_ reader: inout ByteReader, table: ReplicatedTable) throws(ShoalError) -> [SQLValue] {
        let length = try reader.readVarint()
        if length == 0 {
            guard table.keyColumns.count == 1 else {
                throw ShoalError.corruptMetadata("a change-log key of one integer for table \(table.name), whose key has more columns")
            }
            let zigzag = try reader.readVarint()
            return [.integer(Int64(bitPattern: (zigzag >> 1) ^ (0 &- (zigzag & 1))))]
        }
        var keyReader = ByteReader(Array(try reader.readBytes(Int(length))))
        var key: [SQLValue] = []
        for _ in 0..<table.keyColumns.count { key.append(try SQLValue.decode(from: &keyReader)) }
        return key
    }

    /// Adds a key to a change-log key list.
    func appendLogKey(_ key: [SQLValue], to buffer: inout [UInt8]) {
        if key.count == 1, case .integer(let value) = key[0] {
            Self.appendLogInteger(value, to: &buffer)
            return
        }
        let encoded = SQLValue.encodeKey(key)
        buffer.appendVarint(UInt64(encoded.count))
        buffer.append(contentsOf: encoded)
    }

    private static func appendLogInteger(_ value: Int64, to buffer: inout [UInt8]) {
        buffer.append(0)
        buffer.appendVarint(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    /// Adds a part to a change-log entry: a transaction's keys of one table written by one apply. A transaction that
    /// arrives over many slices or batches gets one part from each, so recording it costs what it holds, not the
    /// square of it (a key list grown in place was rewritten whole by every slice).
    static let appendLogPartSQL =
        "INSERT INTO shoal_log(site, seq, tbl, part, hlc, keys) VALUES (?1, ?2, ?3, "
        + "coalesce((SELECT max(part) + 1 FROM shoal_log WHERE site = ?1 AND seq = ?2 AND tbl = ?3), 0), ?4, ?5)"

    /// Records that change `dot` touched the rows in `keys` of table `table`.
    func appendLog(dot: Dot, table: Int64, hlc: HLC, keys: [UInt8]) throws(ShoalError) {
        let siteIndex = Int64(sites.index(of: dot.site))
        try persistNewSites()
        let upsert = try statement(Self.appendLogPartSQL)
        try upsert.bind([
            .integer(siteIndex), .integer(Int64(bitPattern: dot.seq)), .integer(table),
            .integer(Int64(bitPattern: hlc.rawValue)), .blob(keys),
        ])
        try upsert.run()
        try noteDigestPending(site: siteIndex, seq: Int64(bitPattern: dot.seq), table: table, keys: keys)
    }

    /// This node's version vector: the highest sequence number held per site.
    public func versionVector() throws(ShoalError) -> VersionVector {
        try inReadSnapshot { () throws(ShoalError) in try readVersionVector() }
    }

    func readVersionVector() throws(ShoalError) -> VersionVector {
        try refreshSites()
        var vector = VersionVector()
        for row in try connection.rows("SELECT site, seq FROM shoal_claims") {
            guard case .integer(let index) = row[0], case .integer(let seq) = row[1] else { continue }
            vector.advance(try sites.site(at: UInt64(index)), to: UInt64(seq))
        }
        // Remote sites count only what a sender claimed (holding one change of a site says nothing about its
        // earlier ones); the local site's changes are all in the log.
        let latest = try statement("SELECT max(seq) FROM shoal_log WHERE site = ?")
        try latest.bind([.integer(ownSiteIndex)])
        if try latest.step(), case .integer(let seq) = latest.column(0) { vector.advance(siteID, to: UInt64(seq)) }
        latest.reset()
        return vector
    }

    /// Runs `body` in one read transaction when none is open, so that what it reads in several statements is
    /// one snapshot: another process's commit in between (a new site, and claims naming it) cannot be seen half.
    func inReadSnapshot<T>(_ body: () throws(ShoalError) -> T) throws(ShoalError) -> T {
        guard connection.isAutocommit else { return try body() }
        try connection.exec("BEGIN")
        defer { try? connection.exec("COMMIT") }
        // The schema as this snapshot sees it: another process may have added a column since it was last read, and
        // row metadata it wrote since has the cells of that column.
        try refreshSchema()
        return try body()
    }

    /// Makes this node's own commits up to `seq` durable before an answer (to a peer, the relay, a change stream)
    /// can carry them: the rule is that no other node ever holds a local commit that a power cut could take from
    /// this one, which would then reuse its sequence number with other content.
    ///
    /// Commits run with `synchronous = NORMAL` (in WAL mode, a power cut may lose the last ones, never corrupt the
    /// file); the write-ahead log is synced to disk here, once per answer that carries own commits not yet synced
    /// (an idle round syncs nothing). An in-memory database has nothing to sync.
    func makeLocalCommitsDurable(upTo seq: UInt64) throws(ShoalError) {
        guard seq > durableLocalSeq, path != ":memory:", !path.isEmpty else { return }
        // fsync flushes the file's data whichever descriptor wrote it: every connection's frames are in it.
        let descriptor = open(path + "-wal", O_RDONLY)
        if descriptor >= 0 {
            defer { close(descriptor) }
            guard fsync(descriptor) == 0 else {
                throw ShoalError(
                    code: .sqlite,
                    message: "cannot sync \(path)-wal to disk (errno \(errno)): this node's latest commits are not "
                        + "sent until they are durable"
                )
            }
        }
        durableLocalSeq = seq
        recordSent(upTo: seq)
    }
}
