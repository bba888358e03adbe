import ShoalCore

/// Changes for tables and columns this database does not have yet: a peer added a column or a table before this node
/// applied the schema change, the app follows schema changes itself and has not migrated yet, or the table is paused.
///
/// They are not refused (one unknown column would hold up every table and every later change of its site): they are
/// kept in `shoal_held`, count as received (their transactions are claimed like any other), are forwarded verbatim
/// to peers (a third node syncing only through this one still gets them), and are merged into the table with the
/// ordinary rules once the column or table appears (``replayHeldValues()``): a delete made meanwhile wins, and so
/// does a later write.
///
/// Each held cell keeps what a merge would keep: per (table, key, column) the change of the latest life and clock,
/// per counter column each writer's latest total, per row of an unknown table its latest causal length. They are
/// logged under their transaction like any change (log table ``heldLogTable``), so answers carry them.
extension Store {
    /// The change-log table number of held changes (replicated tables number from 1).
    static let heldLogTable: Int64 = 0

    /// Whether each change must be held: its table or its column is not (yet) replicated here.
    ///
    /// A value the column here would store as another value (the same column was added with another type or NOT
    /// NULL on the node that wrote it: a schema conflict, see ``schemaConflicts()``) is held too, kept as it was
    /// written. A table's number is looked up once per run of changes to it.
    func mustHold(_ changes: [Change]) -> [Bool] {
        var lastTable: (name: String, number: Int?)?
        return changes.map { change in
            if lastTable?.name != change.table { lastTable = (change.table, capture.tableNumbers[change.table]) }
            return mustHold(change, tableNumber: lastTable?.number)
        }
    }

    private func mustHold(_ change: Change, tableNumber: Int?) -> Bool {
        guard let number = tableNumber else { return true }
        guard let column = change.columnName else { return false }
        let table = capture.tables[number]
        guard let index = table.index(ofColumn: column) else { return true }
        if case .column(_, let value) = change.payload {
            if table.affinities[index].converts(value) { return true }
            // NULL in a column declared NOT NULL here would be stored as its default.
            if value == .null, index < table.notNull.count, table.notNull[index] { return true }
        }
        return false
    }

    /// Checks the bounds every change meets, whatever its table: all that can be checked of a change to a table or
    /// column this database does not know, and what ``validate`` checks of any change besides its table's shape.
    func validateHeld(_ change: Change, number: Int, localSeq: UInt64) throws(ShoalError) {
        guard !change.table.isEmpty, change.table.utf8.count <= 1024, !change.primaryKey.isEmpty,
            !change.primaryKey.contains(.null)
        else {
            throw ShoalError(
                code: .malformedStream,
                message: "change \(number) has no table name, or a key with no value or a NULL in it (table "
                    + "\(change.table.prefix(64))). Nothing was applied"
            )
        }
        guard change.causalLength > 0, change.stamp.seq > 0, change.stamp.seq <= UInt64(Int64.max) else {
            throw ShoalError(code: .malformedStream, message: "change \(number) has a zero or out-of-range causal length or seq")
        }
        if change.columnName != nil, change.causalLength % 2 == 0 {
            throw ShoalError(code: .malformedStream, message: "change \(number) writes a column of a deleted row. Nothing was applied")
        }
        if case .column(_, let value) = change.payload, let bytes = value.storedByteCount, bytes > SQLValue.maximumBytes {
            throw ShoalError(
                code: .valueTooLarge,
                message: "change \(number) stores \(bytes) bytes in \(change.table).\(change.columnName ?? ""), more than the "
                    + "maximum of \(SQLValue.maximumBytes) bytes (256 MiB) a replicated table accepts. Nothing was applied"
            )
        }
        if change.stamp.site == siteID && change.stamp.seq > localSeq {
            noteOwnSiteEvidence(change.stamp.seq)
            throw ShoalError(
                code: .siteConflict,
                message: "change \(number) names this database's own site with seq \(change.stamp.seq), but this database "
                    + "has only written up to \(localSeq): it was restored from an older copy or lost commits it had sent. "
                    + "\(Self.restartToMove)"
            )
        }
    }

    /// Holds `changes` (all for tables or columns unknown here), keeping per cell what a merge would keep, and logs
    /// the ones kept under their transactions. Returns how many were kept and how many were already held or beaten.
    /// `logging` is false when held changes are held again at a replay (their log entries are still there).
    func hold(_ changes: [Change], logging: Bool = true) throws(ShoalError) -> (kept: Int, known: Int) {
        guard !changes.isEmpty else { return (0, 0) }
        let select = try statement(
            "SELECT site, seq, hlc, cl FROM shoal_held WHERE tbl = ? AND col = ? AND pk = ? AND part = ?"
        )
        let upsert = try statement(
            "INSERT OR REPLACE INTO shoal_held(tbl, col, pk, part, site, seq, hlc, cl, change) "
                + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        var kept = 0
        var known = 0
        var logKeys: [Dot: (hlc: HLC, keys: [UInt8])] = [:]
        for change in changes {
            let siteIndex = Int64(sites.index(of: change.stamp.site))
            let column = change.columnName ?? ""
            let part: Int64 = if case .counter = change.payload { siteIndex } else { 0 }
            let key = SQLValue.encodeKey(change.primaryKey)
            let identity: [SQLValue] = [.text(change.table), .text(column), .blob(key), .integer(part)]
            try select.bind(identity)
            var isNewer = true
            if try select.step() {
                let held = Stamp(
                    hlc: HLC(rawValue: UInt64(bitPattern: select.columnInt64(2))),
                    site: try sites.site(at: UInt64(select.columnInt64(0))),
                    seq: UInt64(bitPattern: select.columnInt64(1))
                )
                let heldLength = UInt64(bitPattern: select.columnInt64(3))
                isNewer =
                    if case .counter = change.payload {
                        (change.causalLength, change.stamp.seq) > (heldLength, held.seq)
                    } else {
                        change.causalLength > heldLength || (change.causalLength == heldLength && change.stamp > held)
                    }
            }
            select.reset()
            guard isNewer else {
                known += 1
                continue
            }
            try upsert.bind(
                identity + [
                    .integer(siteIndex), .integer(Int64(bitPattern: change.stamp.seq)),
                    .integer(Int64(bitPattern: change.stamp.hlc.rawValue)),
                    .integer(Int64(bitPattern: change.causalLength)), .blob(Self.encodeHeld(change)),
                ]
            )
            try upsert.run()
            kept += 1
            if logging { appendLogKey(identity, to: &logKeys[change.dot, default: (change.stamp.hlc, [])].keys) }
        }
        try persistNewSites()
        let log = try statement(Self.appendLogPartSQL)
        for (dot, entry) in logKeys {
            try log.bind([
                .integer(Int64(sites.index(of: dot.site))), .integer(Int64(bitPattern: dot.seq)),
                .integer(Self.heldLogTable), .integer(Int64(bitPattern: entry.hlc.rawValue)), .blob(entry.keys),
            ])
            try log.run()
        }
        return (kept, known)
    }

    /// Reads the next identity of a held-changes log entry (as ``hold(_:)`` wrote it).
    static func readHeldLogKey(_ reader: inout ByteReader) throws(ShoalError) -> [SQLValue] {
        var keyReader = ByteReader(Array(try reader.readBytes(Int(try reader.readVarint()))))
        var identity: [SQLValue] = []
        for _ in 0..<4 { identity.append(try SQLValue.decode(from: &keyReader)) }
        return identity
    }

    /// Adds the held change named by `identity` to an answer if transaction `dot` made it; if a later change
    /// replaced it here and the answer holds that one, the transaction's claim waits for it (as for any row).
    func collectHeld(_ identity: [SQLValue], dot: Dot, cursor: DeltaCursor, into changes: inout [Change])
        throws(ShoalError)
    {
        let select = try statement(
            "SELECT site, seq, hlc, change FROM shoal_held WHERE tbl = ? AND col = ? AND pk = ? AND part = ?"
        )
        try select.bind(identity)
        defer { select.reset() }
        guard try select.step(), case .text(let table) = identity[0], case .blob(let key) = identity[2] else { return }
        let stamp = Stamp(
            hlc: HLC(rawValue: UInt64(bitPattern: select.columnInt64(2))),
            site: try sites.site(at: UInt64(select.columnInt64(0))),
            seq: UInt64(bitPattern: select.columnInt64(1))
        )
        guard stamp.dot == dot else {
            if !cursor.since.covers(stamp.dot), cursor.held.covers(stamp.dot) { cursor.dotNeeds.insert(stamp.dot) }
            return
        }
        guard case .text(let column) = identity[1] else { return }
        var reader = ByteReader(select.columnBytes(3))
        changes.append(try Self.decodeHeld(&reader, table: table, column: column, key: key, stamp: stamp))
    }

    /// Whether this database holds any change it cannot apply yet (one read, however many it holds).
    public func holdsChanges() throws(ShoalError) -> Bool {
        try !connection.rows("SELECT 1 FROM shoal_held LIMIT 1").isEmpty
    }

    /// How many changes are held, per table (for status).
    public func heldChanges() throws(ShoalError) -> [String: Int] {
        var counts: [String: Int] = [:]
        for row in try connection.rows("SELECT tbl, count(*) FROM shoal_held GROUP BY tbl") {
            guard case .text(let table) = row[0], case .integer(let count) = row[1] else { continue }
            counts[table] = Int(count)
        }
        return counts
    }

    /// Merges the held changes whose table and column this database now has, in one transaction: each change as if
    /// it arrived now, with the ordinary rules (a delete made meanwhile wins, and so does a later write). Returns how
    /// many held changes were merged. Does nothing (and writes nothing) when none can be, or when they were tried in
    /// this schema already.
    @discardableResult
    public func replayHeldValues() throws(ShoalError) -> Int {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "replay held changes outside of any open transaction")
        }
        try refreshSchema()
        guard try !replayableHeld().isEmpty else { return 0 }
        try beginWriting()
        let triggersWereOn = suspendAppTriggers()
        capture.isSuspended = true
        defer {
            capture.isSuspended = false
            setTriggers(enabled: triggersWereOn)
        }
        do throws(ShoalError) {
            let replayed = try replayHeldInTransaction()
            try connection.exec("COMMIT")
            return replayed
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// The (table, column) pairs held that this database now has (column `""`: a row's life).
    private func replayableHeld() throws(ShoalError) -> [(table: String, column: String)] {
        guard heldMayReplay else { return [] }
        // Tried already in this schema (values this database would store otherwise, rows its CHECK refuses, stay
        // held until the schema changes): every open of the file would try them again, taking the write lock.
        if try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'held_replay_schema'").integerValue
            == schemaVersion
        {
            heldMayReplay = false
            return []
        }
        var pairs: [(table: String, column: String)] = []
        for row in try connection.rows("SELECT DISTINCT tbl, col FROM shoal_held") {
            guard case .text(let table) = row[0], case .text(let column) = row[1],
                let number = capture.tableNumbers[table]
            else { continue }
            if column.isEmpty || capture.tables[number].columnIndex[column] != nil { pairs.append((table, column)) }
        }
        if pairs.isEmpty { heldMayReplay = false }
        return pairs
    }

    /// ``replayHeldValues()`` inside the caller's write transaction (capture suspended).
    @discardableResult
    func replayHeldInTransaction() throws(ShoalError) -> Int {
        let pairs = try replayableHeld()
        guard !pairs.isEmpty else { return 0 }
        try refreshSites()
        var keyed: [(key: [UInt8], change: Change)] = []
        let select = try statement(
            "SELECT pk, site, seq, hlc, change FROM shoal_held WHERE tbl = ? AND col = ? ORDER BY pk"
        )
        for (table, column) in pairs {
            try select.bind([.text(table), .text(column)])
            while try select.step() {
                let stamp = Stamp(
                    hlc: HLC(rawValue: UInt64(bitPattern: select.columnInt64(3))),
                    site: try sites.site(at: UInt64(select.columnInt64(1))),
                    seq: UInt64(bitPattern: select.columnInt64(2))
                )
                var reader = ByteReader(select.columnBytes(4))
                let key = select.columnBytes(0)
                keyed.append((key, try Self.decodeHeld(&reader, table: table, column: column, key: key, stamp: stamp)))
            }
            select.reset()
            try connection.rows("DELETE FROM shoal_held WHERE tbl = ? AND col = ?", [.text(table), .text(column)])
        }
        // A row's changes together, its life before its columns (as a sender orders them).
        keyed.sort { first, second in
            if first.change.table != second.change.table { return first.change.table < second.change.table }
            if first.key != second.key { return first.key.lexicographicallyPrecedes(second.key) }
            return first.change.columnName == nil && second.change.columnName != nil
        }
        // A counter's changes for a column replicated here as a plain one (or the other way round: the table was
        // replicated again with other counters) stay held, as they were written.
        var changes: [Change] = []
        var mismatched: [Change] = []
        for (_, change) in keyed {
            if let column = change.columnName, let number = capture.tableNumbers[change.table],
                let index = capture.tables[number].columnIndex[column]
            {
                let isCounter = if case .counter = change.payload { true } else { false }
                if isCounter != capture.tables[number].isCounter[index] {
                    mismatched.append(change)
                    continue
                }
            }
            changes.append(change)
        }
        _ = try hold(mismatched, logging: false)
        _ = try applyInTransaction(changes, claim: VersionVector(), since: nil, replaying: true)
        heldMayReplay = false
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES ('held_replay_schema', ?)", [.integer(schemaVersion)]
        )
        // What is held again (values this database would still store otherwise) was not merged.
        var stillHeld = 0
        for (table, column) in pairs {
            stillHeld += Int(
                try connection.scalar(
                    "SELECT count(*) FROM shoal_held WHERE tbl = ? AND col = ?", [.text(table), .text(column)]
                ).integerValue ?? 0
            )
        }
        let merged = max(0, changes.count + mismatched.count - stillHeld)
        if merged > 0 { options.logger.info("replayed held changes", metadata: ["changes": "\(merged)"]) }
        return merged
    }

    /// The stored form of a held change: what its row in `shoal_held` does not say (the payload and `previous`).
    static func encodeHeld(_ change: Change) -> [UInt8] {
        var bytes: [UInt8] = []
        switch change.payload {
        case .row:
            bytes.append(0)
        case .column(_, let value):
            bytes.append(1)
            value.encode(into: &bytes)
        case .counter(_, let increments, let decrements):
            bytes.append(2)
            bytes.appendVarint(increments)
            bytes.appendVarint(decrements)
        }
        bytes.appendVarint(change.causalLength)
        if let previous = change.previous {
            bytes.append(1)
            bytes.appendBigEndian(previous.site.high)
            bytes.appendBigEndian(previous.site.low)
            bytes.appendVarint(previous.seq)
        } else {
            bytes.append(0)
        }
        return bytes
    }

    /// A held change from its stored form (`column` is empty for a row's life).
    static func decodeHeld(_ reader: inout ByteReader, table: String, column: String, key: [UInt8], stamp: Stamp)
        throws(ShoalError) -> Change
    {
        var keyReader = ByteReader(key)
        var primaryKey: [SQLValue] = []
        while !keyReader.isAtEnd { primaryKey.append(try SQLValue.decode(from: &keyReader)) }
        let payload: Change.Payload
        switch try reader.readByte() {
        case 0: payload = .row
        case 1: payload = .column(column, try SQLValue.decode(from: &reader))
        case 2: payload = .counter(column, increments: try reader.readVarint(), decrements: try reader.readVarint())
        case let kind: throw ShoalError.corruptMetadata("unknown held change kind \(kind)")
        }
        let causalLength = try reader.readVarint()
        var previous: Dot?
        if try reader.readByte() == 1 {
            let site = SiteID(high: try reader.readBigEndianUInt64(), low: try reader.readBigEndianUInt64())
            previous = Dot(site: site, seq: try reader.readVarint())
        }
        return Change(
            table: table,
            primaryKey: primaryKey,
            payload: payload,
            causalLength: causalLength,
            stamp: stamp,
            previous: previous
        )
    }
}
