import CSQLite
import ShoalCore

#if canImport(Glibc)
import Glibc
#endif

/// Capture of writes made by other SQLite connections (the app's own driver, the `sqlite3` shell): the
/// outbox.
///
/// Every replicated table carries three AFTER triggers (insert, update, delete) that append what changed to
/// the table's outbox, `shoal_outbox_<id>`: the operation, the key (in columns declared with no type, so
/// values keep their storage class), for updates a mask of the columns whose value or type changed, and the
/// old and new values of counter columns, and, per other column, `OLD * NEW` when both are REAL zeros: SQLite
/// compares 0.0 and -0.0 as equal, and plain SQL cannot print a zero's sign, but the product is -0.0 exactly when the
/// signs differ, and a column with no type keeps it (``Store/drainOutbox()`` reads the sign back, so an update that
/// only turns 0.0 into -0.0 is captured like any other). A primary key update is recorded as a delete of the old key and
/// an insert of the new one. The triggers fire only on connections other than Shoal's: their `WHEN` clause
/// asks `sqlite_compileoption_used('SHOAL_OWN_CONNECTION')`, which is 0 everywhere except on a store's own
/// connection, where the store overrides that built-in function (so its own writes, captured by the
/// pre-update hook, and its applies of remote changes pay nothing and never echo into the outbox).
///
/// The store *stamps* the outbox in a write transaction of its own: before its own writes are flushed, at
/// the start of every apply and compaction, and when asked (``Store/captureForeignWrites()``, which a
/// running node calls whenever SQLite's `data_version` says another connection committed). It folds the
/// outbox rows, in order, into the same net per-row writes the hook produces, deletes them, and writes
/// clocks and the change log, all in that one transaction. A foreign transaction is therefore never split
/// across change sets; several foreign transactions drained together share one dot (one local sequence
/// number), which is allowed: a dot names what this node wrote together, and they reach peers together.
///
/// Even skipped, a trigger costs SQLite a sub-program call per row (it made the 100k-row write transaction
/// about 25 % slower), so Shoal's connection also turns triggers of the main schema off
/// (`SQLITE_DBCONFIG_ENABLE_TRIGGER`) while the database has no triggers but Shoal's; as soon as it has one
/// of its own (created by anyone), they are on, and the `WHEN` clause keeps Shoal's skipped. TEMP triggers
/// always run.
///
/// The same triggers refuse, for foreign connections, values larger than ``Store/maximumValueBytes``. Counter
/// columns have BEFORE triggers refusing anything but an integer. Shoal's own connection checks both in the
/// pre-update hook (O(1) per value: `sqlite3_value_type`, `sqlite3_value_bytes`) whether its triggers run
/// or not; the size check is skipped for statements that can store nothing longer than their arguments
/// (see ``Store/valueSizesBounded(_:arguments:)``), since reading an inserted row in the hook costs SQLite
/// an unpacking of the record.
extension Store {
    /// The largest TEXT or BLOB value, in bytes, a replicated table accepts: ``SQLValue/maximumBytes`` (256 MiB).
    /// A larger value is refused at write time (``ShoalError/Code/valueTooLarge``), by Shoal's connection and by
    /// any other.
    public static let maximumValueBytes = SQLValue.maximumBytes

    /// The compile-option name whose `sqlite_compileoption_used` answer tells Shoal's connection apart.
    static let ownConnectionOption = "SHOAL_OWN_CONNECTION"

    /// The outbox table of replicated table number `id`.
    static func outboxTable(_ id: Int64) -> String { "shoal_outbox_\(id)" }

    /// Overrides `sqlite_compileoption_used` on this connection: 1 for ``ownConnectionOption``, SQLite's
    /// answer for anything else.
    func installOwnConnectionMarker() throws(ShoalError) {
        let flags = SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_INNOCUOUS
        let code = sqlite3_create_function_v2(
            connection.handle,
            "sqlite_compileoption_used",
            1,
            flags,
            nil,
            { context, count, arguments in
                guard count == 1, let arguments, let argument = arguments[0],
                    sqlite3_value_type(argument) != SQLITE_NULL, let name = sqlite3_value_text(argument)
                else {
                    sqlite3_result_null(context)
                    return
                }
                let option = UnsafeRawPointer(name).assumingMemoryBound(to: CChar.self)
                if strcmp(option, Store.ownConnectionOption) == 0 {
                    sqlite3_result_int(context, 1)
                } else {
                    sqlite3_result_int(context, sqlite3_compileoption_used(option))
                }
            },
            nil,
            nil,
            nil
        )
        guard code == SQLITE_OK else { throw connection.error(code, "installing the capture switch") }
    }

    /// Turns the main schema's triggers off on this connection while the only triggers are Shoal's capture
    /// triggers (which skip this connection anyway), and on otherwise, so that users' triggers always fire.
    func updateTriggerSwitch() throws(ShoalError) {
        let count = try statement(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND substr(name, 1, 14) <> 'shoal_capture_'"
        )
        defer { count.reset() }
        try count.step()
        // (While remote changes are merged, the app's triggers stay off: see ``suspendAppTriggers()``. A schema
        // change applied in the middle of that reloads the schema, which must not turn them back on.)
        setTriggers(enabled: count.columnInt64(0) > 0 && !capture.isSuspended)
        // A default computed by an expression (`DEFAULT (randomblob(16))`) can be of any size.
        let defaults = try statement("SELECT count(*) FROM pragma_table_info(?) WHERE dflt_value LIKE '%(%'")
        var expressionDefaults: Set<Int> = []
        for (number, table) in capture.tables.enumerated() {
            try defaults.bind([.text(table.name)])
            if try defaults.step(), defaults.columnInt64(0) > 0 { expressionDefaults.insert(number) }
            defaults.reset()
        }
        capture.tablesWithExpressionDefaults = expressionDefaults
    }

    /// Switches triggers of the main schema on or off for this connection (prepared statements are
    /// recompiled by SQLite when they next run).
    func setTriggers(enabled: Bool) {
        guard enabled != triggersEnabled else { return }
        shoal_db_config_flag(connection.handle, SQLITE_DBCONFIG_ENABLE_TRIGGER, enabled ? 1 : 0)
        triggersEnabled = enabled
    }

    // MARK: - Triggers

    /// The outbox table and the triggers of one replicated table.
    func captureSchema(_ table: ReplicatedTable) -> [String] {
        let outbox = Self.outboxTable(table.id)
        let name = quote(table.name)
        let when = "WHEN NOT sqlite_compileoption_used('\(Self.ownConnectionOption)')"
        let keys = table.keyColumns.indices.map { "k\($0)" }
        let counters = table.columns.indices.filter { table.isCounter[$0] }
        let counterColumns = counters.flatMap { ["o\($0)", "n\($0)"] }
        let zeroColumns = Self.zeroSignColumns(table)
        var statements: [String] = []
        statements.append(
            "CREATE TABLE IF NOT EXISTS \(outbox)(seq INTEGER PRIMARY KEY, op INTEGER NOT NULL, "
                + (keys + ["changed"] + counterColumns + [Self.writeTimeColumn] + zeroColumns.map(\.name))
                .joined(separator: ", ") + ")"
        )
        let baseColumns = (["op"] + keys + ["changed"] + counterColumns + [Self.writeTimeColumn])
            .joined(separator: ", ")
        let insertColumns = ([baseColumns] + zeroColumns.map(\.name)).joined(separator: ", ")
        func row(op: String, _ side: String, changed: String, old: Bool, new: Bool) -> String {
            let keyValues = table.keyColumns.map { "\(side).\(quote($0))" }
            let counterValues = counters.flatMap { index in
                [
                    old ? "OLD.\(table.quotedColumns[index])" : "NULL",
                    new ? "NEW.\(table.quotedColumns[index])" : "NULL",
                ]
            }
            // Only an update compares a column's old and new zeros.
            let zeroValues = zeroColumns.map { column in
                let (before, after) = ("OLD.\(table.quotedColumns[column.index])", "NEW.\(table.quotedColumns[column.index])")
                return old && new
                    ? "CASE WHEN typeof(\(before)) = 'real' AND typeof(\(after)) = 'real' AND \(before) = 0 AND \(after) = 0 "
                        + "THEN \(before) * \(after) END"
                    : "NULL"
            }
            return ([op] + keyValues + [changed] + counterValues + [Self.writeTime] + zeroValues)
                .joined(separator: ", ")
        }
        // Whether a value differs, byte for byte and by storage class (a column's collation must not hide it).
        func differs(_ column: String) -> String {
            "(OLD.\(column) IS NOT NEW.\(column) COLLATE BINARY OR typeof(OLD.\(column)) IS NOT typeof(NEW.\(column)))"
        }
        let keyChanged = table.keyColumns.map { differs(quote($0)) }.joined(separator: " OR ")
        // Always TEXT, one "0"/"1" per non-key column (a lone comparison would be an integer).
        let mask = (["''"] + table.quotedColumns.map(differs)).joined(separator: " || ")
        // Sizes in bytes, O(1): `length` counts a BLOB's bytes but a TEXT's characters, hence the cast.
        let everyColumn = (table.keyIsRowid ? [] : table.keyColumns.map(quote)) + table.quotedColumns
        let tooLarge = everyColumn.map {
            "(CASE typeof(NEW.\($0)) WHEN 'text' THEN length(CAST(NEW.\($0) AS BLOB)) "
                + "WHEN 'blob' THEN length(NEW.\($0)) "
                + "ELSE 0 END > \(Self.maximumValueBytes))"
        }.joined(separator: " OR ")
        let raiseLarge =
            "RAISE(ABORT, 'shoal: a value written to table \(sqlText(table.name)) is larger than the "
            + "maximum of \(Self.maximumValueBytes) bytes (256 MiB) a replicated table accepts; nothing was "
            + "written')"
        var refuseLarge = everyColumn.isEmpty ? "" : "SELECT \(raiseLarge) WHERE \(tooLarge);"
        // A key SQLite would compare equal to another node's different key, or one with a NULL part (which no
        // node can name): refused, so that one bad row never reaches the metadata (see ReplicatedTable.keyRefusal).
        let badKey = table.keyIsRowid ? "" : table.keyColumns.enumerated().map { index, column in
            let value = "NEW.\(quote(column))"
            let loose = table.keyAffinities[index] == .blob
                ? " OR (typeof(\(value)) = 'real' AND \(value) = CAST(\(value) AS INTEGER))" : ""
            return "\(value) IS NULL\(loose)"
        }.joined(separator: " OR ")
        let raiseKey =
            "RAISE(ABORT, 'shoal: a row of replicated table \(sqlText(table.name)) needs a key with no NULL part, and "
            + "no REAL equal to an integer in a column declared with no type (1.0 and 1 are one key to SQLite); "
            + "nothing was written')"
        if !badKey.isEmpty { refuseLarge = "SELECT \(raiseKey) WHERE \(badKey); " + refuseLarge }
        // For inserts the checks ride in the outbox row's op: one statement per row rather than two.
        var insertOp = everyColumn.isEmpty ? "1" : "CASE WHEN \(tooLarge) THEN \(raiseLarge) ELSE 1 END"
        if !badKey.isEmpty { insertOp = "CASE WHEN \(badKey) THEN \(raiseKey) ELSE \(insertOp) END" }
        let prefix = "shoal_capture_\(table.id)"
        statements.append(
            "CREATE TRIGGER IF NOT EXISTS \(prefix)_insert AFTER INSERT ON \(name) \(when) BEGIN "
                + "INSERT INTO \(outbox)(\(insertColumns)) "
                + "VALUES (\(row(op: insertOp, "NEW", changed: "NULL", old: false, new: true))); END"
        )
        statements.append(
            "CREATE TRIGGER IF NOT EXISTS \(prefix)_update AFTER UPDATE ON \(name) \(when) BEGIN \(refuseLarge) "
                + "INSERT INTO \(outbox)(\(insertColumns)) "
                + "SELECT \(row(op: "2", "OLD", changed: "NULL", old: true, new: false)) WHERE \(keyChanged); "
                + "INSERT INTO \(outbox)(\(insertColumns)) "
                + "SELECT \(row(op: "1", "NEW", changed: "NULL", old: false, new: true)) WHERE \(keyChanged); "
                + "INSERT INTO \(outbox)(\(insertColumns)) "
                + "SELECT \(row(op: "3", "NEW", changed: mask, old: true, new: true)) WHERE NOT (\(keyChanged)); "
                + "END"
        )
        statements.append(
            "CREATE TRIGGER IF NOT EXISTS \(prefix)_delete AFTER DELETE ON \(name) \(when) BEGIN "
                + "INSERT INTO \(outbox)(\(insertColumns)) "
                + "VALUES (\(row(op: "2", "OLD", changed: "NULL", old: true, new: false))); "
                + "END"
        )
        if !counters.isEmpty {
            // INSERT OR REPLACE deletes the row it replaces without firing delete triggers (unless the writer
            // turned recursive triggers on): note the replaced row's counters, kept only when an insert of the
            // same key follows at once.
            let keyMatch = table.keyColumns.map { "\(quote($0)) IS NEW.\(quote($0))" }.joined(separator: " AND ")
            let oldCounters = counters.flatMap { [table.quotedColumns[$0], "NULL"] }
            statements.append(
                "CREATE TRIGGER IF NOT EXISTS \(prefix)_replace BEFORE INSERT ON \(name) \(when) BEGIN "
                    + "INSERT INTO \(outbox)(\(baseColumns)) SELECT "
                    + (["4"] + table.keyColumns.map(quote) + ["NULL"] + oldCounters + [Self.writeTime])
                    .joined(separator: ", ")
                    + " FROM \(name) WHERE \(keyMatch); END"
            )
            // Counters merge by adding increments: anything but an integer cannot be merged, on any connection.
            for index in counters {
                let column = table.columns[index]
                let quoted = table.quotedColumns[index]
                let checks = [
                    ("null", "NULL"), ("real", "a REAL (a fraction, or a sum that overflowed 64-bit integers)"),
                    ("text", "TEXT"),
                    ("blob", "a BLOB"),
                ].map { kind, words in
                    "SELECT RAISE(ABORT, 'shoal: counter column \(sqlText(table.name)).\(sqlText(column)) takes "
                        + "integers only; this write puts \(words) in it, nothing was written') "
                        + "WHERE typeof(NEW.\(quoted)) = '\(kind)';"
                }.joined(separator: " ")
                statements.append(
                    "CREATE TRIGGER IF NOT EXISTS \(prefix)_counter\(index)_insert BEFORE INSERT ON \(name) "
                        + "WHEN typeof(NEW.\(quoted)) IS NOT 'integer' BEGIN \(checks) END"
                )
                statements.append(
                    "CREATE TRIGGER IF NOT EXISTS \(prefix)_counter\(index)_update BEFORE UPDATE OF \(quoted) ON "
                        + "\(name) WHEN typeof(NEW.\(quoted)) IS NOT 'integer' BEGIN \(checks) END"
                )
            }
        }
        return statements
    }

    /// Creates the outbox and triggers of every replicated table that lacks them (databases replicated by
    /// an earlier version): a migration run when the store opens.
    /// Whether this database's replicated tables have capture triggers (set once they were installed): from
    /// then on, a table without them was re-created behind Shoal's back.
    var capturesForeignWrites: Bool {
        get throws(ShoalError) {
            try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'capture_triggers'").integerValue ?? 0 >= 1
        }
    }

    /// The outbox's columns for the sign of a zero (every column but counters): name and column index.
    static func zeroSignColumns(_ table: ReplicatedTable) -> [(name: String, index: Int)] {
        table.columns.indices.filter { !table.isCounter[$0] }.map { ("z\($0)", $0) }
    }

    /// The version of the capture triggers this build installs: 2 records the sign of zeros, 3 the time of each write.
    static let captureVersion: Int64 = 3

    /// The outbox column that holds when the writing statement ran, in Unix milliseconds by the writer's wall clock.
    static let writeTimeColumn = "t"

    /// The time a capture trigger records: SQLite's `'now'`, read once per statement (`sqlite3_step`), in Unix
    /// milliseconds (SQLite 3.40 has no `unixepoch('subsec')`; SQLite keeps whole milliseconds, which the Julian day's
    /// floating point only rounds).
    static let writeTime = "CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"

    /// Brings the capture triggers of a database made by an earlier build to ``captureVersion``: adds the outbox's
    /// zero-sign and write-time columns and re-creates the triggers that fill them, in one transaction (no other
    /// connection's write can fall between the old trigger and the new). Rows the earlier triggers recorded keep no
    /// time; they are stamped at the time they are found, as before.
    ///
    /// Looked at in every open, table by table, not only by the version: a table paused when the file was upgraded (its
    /// shape changed behind Shoal's back) kept its earlier triggers, and gets these once it is replicated again; every
    /// outbox, a paused table's too, gets the write-time column the drain reads.
    func upgradeCaptureTriggers() throws(ShoalError) {
        guard try capturesForeignWrites else { return }
        // What needs doing, read again once the write lock is held: another process may have upgraded the file between.
        func pending() throws(ShoalError) -> (version: Int64, untimed: [String], stale: [ReplicatedTable]) {
            let version = try connection.scalar(
                "SELECT value FROM shoal_meta WHERE key = 'capture_version'"
            ).integerValue ?? 1
            var untimed: [String] = []
            for row in try connection.rows(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name GLOB 'shoal_outbox_[0-9]*'"
            ) {
                guard case .text(let outbox) = row.first else { continue }
                if try !outboxColumns(outbox).contains(Self.writeTimeColumn) { untimed.append(outbox) }
            }
            var stale: [ReplicatedTable] = []
            for table in capture.tables where try hasCaptureTriggers(tableID: table.id) {
                let timed = try connection.scalar(
                    "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name IN (?, ?, ?) AND instr(sql, ?) > 0",
                    ["insert", "update", "delete"].map { .text("shoal_capture_\(table.id)_\($0)") }
                        + [.text(Self.writeTime)]
                )
                if timed.integerValue != 3 { stale.append(table) }
            }
            return (version, untimed, stale)
        }
        func due(_ work: (version: Int64, untimed: [String], stale: [ReplicatedTable])) -> Bool {
            // A file a later build upgraded further is left to it: its triggers are not ours to rewrite.
            work.version <= Self.captureVersion
                && (work.version < Self.captureVersion || !work.untimed.isEmpty || !work.stale.isEmpty)
        }
        guard due(try pending()) else { return }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            let (_, untimed, stale) = try pending()
            for outbox in untimed { try connection.exec("ALTER TABLE \(outbox) ADD COLUMN \(Self.writeTimeColumn)") }
            for table in stale {
                let outbox = Self.outboxTable(table.id)
                let existing = try outboxColumns(outbox)
                for column in Self.zeroSignColumns(table).map(\.name) where !existing.contains(column) {
                    try connection.exec("ALTER TABLE \(outbox) ADD COLUMN \(column)")
                }
                for trigger in ["insert", "update", "delete", "replace"] {
                    try connection.exec("DROP TRIGGER IF EXISTS \(quote("shoal_capture_\(table.id)_\(trigger)"))")
                }
                for sql in captureSchema(table) { try connection.exec(sql) }
            }
            try connection.rows(
                "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES ('capture_version', ?)", [.integer(Self.captureVersion)]
            )
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
        schemaVersion = -1
        try refreshSchema()
    }

    /// Adds the outbox columns a table's added columns need (a counter's old and new values, the others' zero signs),
    /// if missing.
    func extendOutbox(of table: ReplicatedTable) throws(ShoalError) {
        let outbox = Self.outboxTable(table.id)
        let existing = try outboxColumns(outbox)
        guard !existing.isEmpty else { return }
        // A counter column added has its old and new values; any other, the sign of its zeros.
        let counterColumns = table.columns.indices.filter { table.isCounter[$0] }.flatMap { ["o\($0)", "n\($0)"] }
        for column in counterColumns + Self.zeroSignColumns(table).map(\.name) where !existing.contains(column) {
            try connection.exec("ALTER TABLE \(outbox) ADD COLUMN \(column)")
        }
    }

    /// The names of outbox table `outbox`'s columns (none when it does not exist).
    func outboxColumns(_ outbox: String) throws(ShoalError) -> Set<String> {
        Set(
            try connection.rows("SELECT name FROM pragma_table_info('\(outbox)')").compactMap { row -> String? in
                if case .text(let name) = row.first { name } else { nil }
            }
        )
    }

    /// Whether table `tableID`'s capture triggers exist.
    func hasCaptureTriggers(tableID: Int64) throws(ShoalError) -> Bool {
        try connection.scalar(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name = ?",
            [.text("shoal_capture_\(tableID)_delete")]
        ).integerValue ?? 0 > 0
    }

    /// Notes that every replicated table now has its capture triggers.
    func recordCaptureTriggers() throws(ShoalError) {
        try connection.rows("INSERT OR REPLACE INTO shoal_meta(key, value) VALUES ('capture_triggers', 1)")
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES ('capture_version', ?)", [.integer(Self.captureVersion)]
        )
    }

    /// Once a database's tables all had their triggers, one that lacks them was re-created by another tool and is
    /// paused (``loadReplicatedTables()``), never silently re-armed.
    func installMissingCaptureTriggers() throws(ShoalError) {
        guard try !capturesForeignWrites else { return }
        var missing: [ReplicatedTable] = []
        let exists = try statement("SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name = ?")
        for table in capture.tables {
            try exists.bind([.text("shoal_capture_\(table.id)_delete")])
            let present = try exists.step() && exists.columnInt64(0) > 0
            exists.reset()
            if !present { missing.append(table) }
        }
        guard !missing.isEmpty else {
            // (A read-only file only delays this.)
            _ = try? recordCaptureTriggers()
            return
        }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            for table in missing {
                for sql in captureSchema(table) { try connection.exec(sql) }
            }
            try recordCaptureTriggers()
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
        schemaVersion = -1
        try refreshSchema()
    }

    /// Drops the triggers and the outbox of table `id` (when it stops being replicated): other connections'
    /// writes to it are no longer recorded, and what they recorded is forgotten.
    func dropCapture(ofTable id: Int64) throws(ShoalError) {
        let triggers = try connection.rows(
            "SELECT name FROM sqlite_schema WHERE type = 'trigger' AND name LIKE ? ESCAPE '\\'",
            [.text("shoal\\_capture\\_\(id)\\_%")]
        )
        for row in triggers {
            guard case .text(let name) = row.first else { continue }
            try connection.exec("DROP TRIGGER IF EXISTS \(quote(name))")
        }
        try connection.exec("DROP TABLE IF EXISTS \(Self.outboxTable(id))")
    }

    // MARK: - Draining

    /// Captures writes other SQLite connections made to replicated tables since the last call: gives them
    /// clocks and a dot of this node in one transaction. Returns whether there were any.
    ///
    /// A running node calls this whenever SQLite's `data_version` changes; reads that must see every write
    /// (``changes(since:maxChangesPerBatch:)``, ``digest()``, ``status()``, ``deltaCursor(since:)``) call
    /// it too, and every write transaction of the store stamps pending foreign writes first.
    @discardableResult
    public func captureForeignWrites() throws(ShoalError) -> Bool {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(
                code: .invalidArgument,
                message: "capture foreign writes outside of any open transaction"
            )
        }
        try refreshSchema()
        // A column another tool added: adopted (and its writes stamped) first.
        if !schemaAdditions.isEmpty, try !adoptSchemaChanges().isEmpty { return true }
        guard try outboxMayHoldRows() else { return false }
        try beginWriting()
        do throws(ShoalError) {
            let found = try stampForeignWrites()
            try connection.exec("COMMIT")
            return found
        } catch {
            capture.discardPending()
            transactionStamp = nil
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// ``captureForeignWrites()`` when no transaction is open; nothing otherwise (an open transaction of
    /// the store stamps them when it writes).
    func captureForeignWritesIfIdle() throws(ShoalError) {
        guard connection.isAutocommit, !capture.hasUncommittedWork else { return }
        try captureForeignWrites()
    }

    /// Inside a write transaction that has no captured writes of its own (apply, compaction): stamps the
    /// outbox with a dot of its own. Returns whether there was anything.
    @discardableResult
    func stampForeignWrites() throws(ShoalError) -> Bool {
        guard try drainOutbox() else { return false }
        try flushCaptured()
        transactionStamp = nil
        return true
    }

    /// Whether another connection committed since the outbox was last found empty (cheap: one pragma).
    func outboxMayHoldRows() throws(ShoalError) -> Bool {
        guard !capture.tables.isEmpty else { return false }
        let version = try statement("PRAGMA data_version")
        defer { version.reset() }
        guard try version.step() else { return true }
        let current = version.columnInt64(0)
        return outboxCheckedAt != current
    }

    /// Folds every outbox row into the capture's pending writes, ahead of any writes this connection made
    /// in the open transaction (the outbox holds only commits that came before it), and empties the outbox.
    /// Must run in a write transaction. Returns whether the outbox held anything.
    @discardableResult
    func drainOutbox() throws(ShoalError) -> Bool {
        guard try outboxMayHoldRows() else { return false }
        let version = try statement("PRAGMA data_version")
        try version.step()
        let checkedAt = version.columnInt64(0)
        version.reset()
        var own: [PendingTable]?
        // When the drained writes were made (the latest), unless a row has no time (recorded by an earlier build).
        var latestWrite: UInt64?
        var untimed = false
        for (number, table) in capture.tables.enumerated() {
            let outbox = Self.outboxTable(table.id)
            let counters = table.columns.indices.filter { table.isCounter[$0] }
            let zeroColumns = Self.zeroSignColumns(table)
            // A table with columns added since its outbox was made (not adopted yet): the outbox follows first.
            if schemaAdditions.contains(where: { $0.tableID == table.id }) { try extendOutbox(of: table) }
            let keyCount = table.keyColumns.count
            let select = try statement(
                "SELECT "
                    + (["op"] + table.keyColumns.indices.map { "k\($0)" } + ["changed"]
                    + counters.flatMap { ["o\($0)", "n\($0)"] } + zeroColumns.map(\.name) + [Self.writeTimeColumn])
                    .joined(separator: ", ")
                    + " FROM \(outbox) ORDER BY seq"
            )
            let timeAt = keyCount + 2 + 2 * counters.count + zeroColumns.count
            var events: [CapturedEvent] = []
            var replaced: (key: PendingKey, counters: [Int64])?
            do {
                defer { select.reset() }
                while try select.step() {
                    let op = select.columnInt64(0)
                    let key: PendingKey =
                        table.keyIsRowid
                        ? .rowid(select.columnInt64(1)) : .values((0..<keyCount).map { select.column(1 + $0) })
                    func counterValues(new: Bool) -> [Int64] {
                        var values = table.noDelta
                        for (position, index) in counters.enumerated() {
                            values[index] = select.column(keyCount + 2 + 2 * position + (new ? 1 : 0)).integerValue ?? 0
                        }
                        return values
                    }
                    if case .integer(let time) = select.column(timeAt), time > 0 {
                        latestWrite = max(latestWrite ?? 0, UInt64(time))
                    } else {
                        untimed = true
                    }
                    let pendingReplace = replaced
                    replaced = nil
                    switch op {
                    case 1:
                        if let pendingReplace, pendingReplace.key == key {
                            events.append(
                                CapturedEvent(
                                    table: number,
                                    kind: .delete,
                                    key: key,
                                    changed: nil,
                                    counterDelta: pendingReplace.counters.map { 0 &- $0 }
                                )
                            )
                        }
                        events.append(
                            CapturedEvent(
                                table: number,
                                kind: .insert,
                                key: key,
                                changed: nil,
                                counterDelta: table.hasCounters ? counterValues(new: true) : nil
                            )
                        )
                    case 2:
                        events.append(
                            CapturedEvent(
                                table: number,
                                kind: .delete,
                                key: key,
                                changed: nil,
                                counterDelta: table.hasCounters ? counterValues(new: false).map { 0 &- $0 } : nil
                            )
                        )
                    case 3:
                        // One flag per non-key column, as text ("0110"); with a single column SQLite leaves the one
                        // comparison an integer.
                        var changed: [Bool]
                        switch select.column(keyCount + 1) {
                        case .text(let mask) where mask.utf8.count == table.columns.count:
                            changed = mask.utf8.map { $0 == UInt8(ascii: "1") }
                        case .text(let mask) where mask.utf8.count < table.columns.count:
                            // Recorded before columns were added (by the trigger of the table's earlier shape): the
                            // added columns count as written, so a value the writer put there is not missed.
                            changed = mask.utf8.map { $0 == UInt8(ascii: "1") }
                                + Array(repeating: true, count: table.columns.count - mask.utf8.count)
                        case .integer(let flag) where table.columns.count > 1:
                            changed = [flag != 0] + Array(repeating: true, count: table.columns.count - 1)
                        case .integer(let flag) where table.columns.count == 1:
                            changed = [flag != 0]
                        case .null where table.columns.isEmpty, .text("") where table.columns.isEmpty:
                            changed = []
                        default:
                            throw ShoalError.corruptMetadata("bad change mask in \(outbox)")
                        }
                        // Zeros whose sign changed (their product is -0.0): SQLite's comparison saw no change.
                        let zerosAt = keyCount + 2 + 2 * counters.count
                        for (position, column) in zeroColumns.enumerated() where !changed[column.index] {
                            if case .real(let product) = select.column(zerosAt + position), product.sign == .minus {
                                changed[column.index] = true
                            }
                        }
                        var delta: [Int64]?
                        if table.hasCounters {
                            delta = zip(counterValues(new: true), counterValues(new: false)).map { $0 &- $1 }
                        }
                        events.append(
                            CapturedEvent(table: number, kind: .update, key: key, changed: changed, counterDelta: delta)
                        )
                    case 4:
                        replaced = (key, counterValues(new: false))
                    default:
                        throw ShoalError.corruptMetadata("unknown operation \(op) in \(outbox)")
                    }
                }
            }
            guard !events.isEmpty else { continue }
            if own == nil { own = capture.takePending() }
            for event in events { capture.foldForeign(event) }
            // Without a pre-update hook SQLite empties a table in one step rather than row by row.
            sqlite3_preupdate_hook(connection.handle, nil, nil)
            defer { installPreupdateHook() }
            try statement("DELETE FROM \(outbox)").run()
        }
        outboxCheckedAt = checkedAt
        guard let own else { return false }
        // Writes found with nothing else pending are stamped at the time they were made, not found (``localStamp()``).
        foreignWriteTime = own.allSatisfy(\.isEmpty) && !untimed ? latestWrite : nil
        capture.foldAfter(own)
        return true
    }
}

/// Escapes text for a single-quoted SQL string literal.
private func sqlText(_ text: String) -> String {
    text.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "''")
}
