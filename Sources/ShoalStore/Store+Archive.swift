import ShoalCore

/// The row metadata a table had when it was unreplicated, kept so that replicating it again continues its history
/// instead of starting a new one: a counter's value is every site's contributions, and turning the value a node
/// holds into a new contribution of its own would add it again on every node that does the same (a counter of 4
/// read 12 on three nodes after each ran `unreplicate` then `replicate`).
struct ClockArchive {
    /// The renamed clock table.
    let table: String
    /// The key columns and the non-key columns (in the order of the stored cells) the metadata was written for.
    let keyColumns: [String]
    let columns: [String]
    /// The counter columns the table was replicated with.
    let counters: [String]

    /// The table keeping the data rows' values as they were when the archive was made (keys `k0`…, values `v0`…, in
    /// the order of ``columns``): a value the same now was not written meanwhile, and keeps its stamp.
    var valuesTable: String { table + "_values" }

    /// Where the archive of table `name` is recorded in `shoal_meta`.
    static func metaKey(_ name: String) -> String { "archive:" + name }

    var encoded: String {
        [table, keyColumns.joined(separator: "\t"), columns.joined(separator: "\t"), counters.joined(separator: "\t")]
            .joined(separator: "\n")
    }

    init(table: String, keyColumns: [String], columns: [String], counters: [String]) {
        self.table = table
        self.keyColumns = keyColumns
        self.columns = columns
        self.counters = counters
    }

    init?(encoded: String) {
        let lines = encoded.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard lines.count == 4 else { return nil }
        func names(_ line: String) -> [String] {
            line.isEmpty ? [] : line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
        }
        self.init(table: lines[0], keyColumns: names(lines[1]), columns: names(lines[2]), counters: names(lines[3]))
    }
}

extension Store {
    /// Keeps the clock table of table `name` (id `id`) aside instead of dropping it (inside the caller's
    /// transaction); an older archive of the same name is dropped.
    func archiveClock(ofTable id: Int64, name: String) throws(ShoalError) {
        try dropClockArchive(of: name)
        guard case .text(let encodedShape) = try connection.scalar("SELECT shape FROM shoal_shapes WHERE tbl = ?", [.integer(id)]),
            let shape = TableShape(encoded: encodedShape),
            case .integer(1) = try connection.scalar(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?",
                [.text("shoal_clock_\(id)")]
            )
        else { return }
        let keys = shape.columns.filter { $0.keyOrder > 0 }.sorted { $0.keyOrder < $1.keyOrder }.map(\.name)
        let columns = shape.columns.filter { $0.keyOrder == 0 && $0.hidden == 0 }.map(\.name)
        var counters: [String] = []
        if case .text(let list) = try connection.scalar("SELECT counters FROM shoal_tables WHERE id = ?", [.integer(id)]) {
            counters = list.split(separator: ",").map(String.init)
        }
        let archive = ClockArchive(
            table: "shoal_archive_\(id)_\(UInt32.random(in: 1...UInt32.max))",
            keyColumns: keys,
            columns: columns,
            counters: counters
        )
        try connection.exec("ALTER TABLE shoal_clock_\(id) RENAME TO \(archive.table)")
        // The values too, so that replicating again stamps only what changed while the table was not replicated
        // (stamping every row as this node's write would beat what peers wrote meanwhile). A table whose columns no
        // longer read as recorded (a paused one) keeps none: its rows are stamped again, as before values were kept.
        let keyList = keys.enumerated().map { "\(quote($1)) AS k\($0)" }
        let valueList = columns.enumerated().map { "\(quote($1)) AS v\($0)" }
        try? connection.exec(
            "CREATE TABLE \(archive.valuesTable)(\(keys.indices.map { "k\($0)" }.joined(separator: ", "))"
                + columns.indices.map { ", v\($0)" }.joined()
                + ", PRIMARY KEY(\(keys.indices.map { "k\($0)" }.joined(separator: ", ")))) WITHOUT ROWID; "
                + "INSERT INTO \(archive.valuesTable) SELECT \((keyList + valueList).joined(separator: ", ")) "
                + "FROM \(quote(name))"
        )
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(ClockArchive.metaKey(name)), .text(archive.encoded)]
        )
    }

    /// The archive of table `name`'s metadata, if it was unreplicated with one.
    func clockArchive(of name: String) throws(ShoalError) -> ClockArchive? {
        guard case .text(let text) = try connection.scalar(
            "SELECT value FROM shoal_meta WHERE key = ?",
            [.text(ClockArchive.metaKey(name))]
        ) else { return nil }
        return ClockArchive(encoded: text)
    }

    /// Forgets the history kept for table `name` when it was unreplicated (see ``ClockArchive``): replicating it
    /// again then starts a new one, in which the rows count as this node's writes (and counter values as its
    /// increments). Returns whether there was one.
    @discardableResult
    public func forgetReplicationHistory(of name: String) throws(ShoalError) -> Bool {
        guard connection.isAutocommit else {
            throw ShoalError(code: .invalidArgument, message: "forget a table's history outside of any open transaction")
        }
        guard try clockArchive(of: name) != nil else { return false }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            try dropClockArchive(of: name)
            try connection.exec("COMMIT")
            return true
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// Drops the archive of table `name`, if any.
    func dropClockArchive(of name: String) throws(ShoalError) {
        if let archive = try clockArchive(of: name) {
            try connection.exec("DROP TABLE IF EXISTS \(archive.table); DROP TABLE IF EXISTS \(archive.valuesTable)")
        }
        try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text(ClockArchive.metaKey(name))])
    }

    /// Continues the history `archive` kept for table number `number`, just replicated again (inside the
    /// caller's transaction, before its existing rows are captured): each archived row's causal length and
    /// counter contributions are restored, so its counters add only what changed while the table was not
    /// replicated. Returns, per key with an archived row, how the row's capture is to be recorded (which columns were
    /// written meanwhile: those whose value differs from the one archived, every one when none was); a row archived
    /// alive whose data row is gone now is recorded as deleted.
    func restoreArchivedRows(
        _ archive: ClockArchive,
        table number: Int
    ) throws(ShoalError) -> [[SQLValue]: (existed: Bool, counterDelta: [Int64], changed: [Bool]?)] {
        let table = capture.tables[number]
        guard archive.keyColumns == table.keyColumns else { return [:] }
        try refreshSites()
        let keys = table.keyColumns.indices.map { "k\($0)" }.joined(separator: ", ")
        let select = try connection.prepare("SELECT \(keys), meta FROM \(archive.table)")
        var restored: [[SQLValue]: (existed: Bool, counterDelta: [Int64], changed: [Bool]?)] = [:]
        let archivedValues = try archivedValueReader(archive, keyCount: table.keyColumns.count)
        var deleted: [[SQLValue]] = []
        // Tombstones kept as they were: no write records them, so the digest is told of them here.
        var tombstones: [UInt8] = []
        // Every restored stamp is logged again under its transaction (unreplicating dropped the table's log): this
        // node claims those transactions, so an answer must still send what they wrote.
        var logKeys: [Dot: (hlc: HLC, keys: [UInt8])] = [:]
        while try select.step() {
            let row = select.row()
            let key = Array(row.dropLast())
            guard case .blob(let bytes) = row.last! else { continue }
            let archived = try RowState(encoded: bytes, columnCount: archive.columns.count, sites: sites)
            var state = RowState(columnCount: table.columns.count)
            state.causalLength = archived.causalLength
            state.lengthStamp = archived.lengthStamp
            var archivedCounters = Array(repeating: Int64(0), count: table.columns.count)
            for (index, name) in table.columns.enumerated() {
                guard archived.isAlive, let old = archive.columns.firstIndex(of: name) else { continue }
                switch (archived.cells[old], table.isCounter[index]) {
                case (.counter, true):
                    state.cells[index] = archived.cells[old]
                    archivedCounters[index] = archived.counterValue(old)
                case (.value, false):
                    state.cells[index] = archived.cells[old]
                default:
                    break
                }
            }
            try saveState(state, table: table, key: key)
            for (dot, hlc) in state.dotClocks { appendLogKey(key, to: &logKeys[dot, default: (hlc, [])].keys) }
            guard try dataRowExists(table: table, key: key) else {
                if archived.isAlive { deleted.append(key) } else { appendLogKey(key, to: &tombstones) }
                continue
            }
            let current = try dataValues(table: table, key: key)
            let delta = table.columns.indices.map { index -> Int64 in
                guard table.isCounter[index] else { return 0 }
                let now = Int128(current[index].integerValue ?? 0)
                return Int64(clamping: archived.isAlive ? now - Int128(archivedCounters[index]) : now)
            }
            var changed: [Bool]?
            if archived.isAlive, let archivedValues, let before = try archivedValues(key) {
                changed = table.columns.enumerated().map { index, name in
                    guard let old = archive.columns.firstIndex(of: name) else { return true }
                    return current[index] != before[old]
                }
            }
            restored[key] = (archived.isAlive, delta, changed)
        }
        for (dot, entry) in logKeys { try appendLog(dot: dot, table: table.id, hlc: entry.hlc, keys: entry.keys) }
        for key in deleted { capture.addExistingRow(table: number, key: key, existed: true, exists: false) }
        try noteDigestPending(site: -1, seq: 0, table: table.id, keys: tombstones)
        return restored
    }

    /// Reads a row's archived values by key (``ClockArchive/valuesTable``), or `nil` when the archive kept none.
    private func archivedValueReader(
        _ archive: ClockArchive,
        keyCount: Int
    ) throws(ShoalError) -> ((_ key: [SQLValue]) throws(ShoalError) -> [SQLValue]?)? {
        guard case .integer(1) = try connection.scalar(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?", [.text(archive.valuesTable)]
        ) else { return nil }
        let values = archive.columns.indices.map { "v\($0)" }
        let select = try connection.prepare(
            "SELECT 1\(values.map { ", " + $0 }.joined()) FROM \(archive.valuesTable) WHERE "
                + (0..<keyCount).map { "k\($0) = ?" }.joined(separator: " AND ")
        )
        return { key throws(ShoalError) in
            try select.bind(key)
            defer { select.reset() }
            return try select.step() ? Array(select.row().dropFirst()) : nil
        }
    }
}
