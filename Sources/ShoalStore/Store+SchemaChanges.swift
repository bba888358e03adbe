import ShoalCore

/// Columns added at the end of a replicated table, found when the schema changed (see ``Store/adoptSchemaChanges()``).
struct SchemaAddition {
    let tableID: Int64
    let table: String
    let columns: [TableShape.Column]
    let shape: TableShape
}

/// How a node follows the schema changes its peers make.
public enum SchemaChangeFollowing: Sendable, Hashable {
    /// Peers' additive changes (a new column, a new replicated table) are applied here in the transaction that
    /// brings them (the default).
    case apply
    /// The app migrates itself: a peer's change is recorded and its values held until the app makes the same change
    /// (recognised as the same change, not a conflict).
    case manual
}

/// A schema change that met a different one: the same column added with two definitions on two nodes. One
/// definition wins everywhere (the replicated record's ordinary merge); a node that made the other keeps its column
/// (and every value in it) and reports this.
public struct SchemaConflict: Sendable, Hashable, CustomStringConvertible {
    /// The table.
    public var table: String
    /// The column, added on two nodes with different definitions.
    public var column: String
    /// The column's definition here.
    public var local: String
    /// The definition the cluster settled on (the replicated record's winner); empty when the column was declared
    /// on each device from the start, never recorded as a change.
    public var winner: String
    /// Values peers wrote to the column that it would store as other values here (another type, or NULL into NOT
    /// NULL), or whose rows a CHECK here refuses: held and not applied.
    public var heldValues: Int = 0

    /// What happened and what to run.
    public var description: String {
        guard !winner.isEmpty else {
            return "column \(table).\(column) is \(local) here, and \(heldValues) \(heldValues == 1 ? "value" : "values") peers wrote to it are held, "
                + "not applied: this node would store them as other values (another type, or NULL into NOT NULL), or "
                + "a CHECK here refuses their rows; another device declared the table differently from the start. To "
                + "resolve, add a new column with one "
                + "definition on every device and move the values (shoal sql \"ALTER TABLE \(quote(table)) ADD COLUMN "
                + "…\"), then stop using \(column)"
        }
        return "column \(table).\(column) is \(local) here, but the cluster settled on \(winner): its values are kept "
            + "here as they are; to resolve, add a new column with the agreed definition and move the values "
            + "(shoal sql \"ALTER TABLE \(quote(table)) ADD COLUMN …\"), then stop using \(column)"
    }
}

/// Schema changes as change sets. A replicated table's additive change (a column added at the end, nullable or with
/// a default; a new replicated table) made here through any connection is adopted (``adoptSchemaChanges()``) and
/// recorded in the replicated table ``schemaTable``, one row per column or table, as a change of this node: it
/// travels like any change (ordered with the data, through LAN and relay, sealed on the relay), and peers run the same
/// DDL in the transaction that applies it. Values for a column a node does not have yet are held meanwhile (see
/// ``hold(_:)``) and replayed once it does.
extension Store {
    /// The replicated table of schema changes: `(tbl, col)` names a column (`col` empty: the table itself), and
    /// `definition` is its SQL (a column's definition, or the table's `CREATE TABLE` statement).
    public static let schemaTable = "shoal_schema"

    /// Creates and replicates ``schemaTable`` inside the caller's write transaction, if it is missing.
    func prepareSchemaTableInTransaction() throws(ShoalError) {
        try prepareInternalTableInTransaction(
            Self.schemaTable, columns: "tbl TEXT NOT NULL, col TEXT NOT NULL, definition TEXT NOT NULL DEFAULT '', "
                + "PRIMARY KEY(tbl, col)"
        )
    }

    /// Creates and replicates one of Shoal's own replicated tables (`columns`: its definition's inside) inside the
    /// caller's write transaction, if it is missing.
    func prepareInternalTableInTransaction(_ name: String, columns: String) throws(ShoalError) {
        // Another process on the file (the node beside the app) may have made it since this connection looked.
        try refreshSchema()
        guard capture.tableNumbers[name] == nil else { return }
        try connection.exec("CREATE TABLE IF NOT EXISTS \(name)(\(columns))")
        _ = try replicateInTransaction(name, counters: [])
        try refreshSchema()
    }

    /// The SQL that defines a column, as `ALTER TABLE … ADD COLUMN` takes it.
    static func columnDefinition(_ column: TableShape.Column) -> String {
        var text = quote(column.name)
        if !column.type.isEmpty { text += " " + column.type }
        if column.notNull { text += " NOT NULL" }
        if let value = column.defaultValue { text += " DEFAULT " + value }
        return text
    }

    /// Adopts the additive schema changes made to replicated tables since the last call (by this connection or any
    /// other tool): each added column is recorded as a change of this node, the table's capture follows the new
    /// shape, and values held for the column are merged. Returns the columns adopted, as `table.column`. Does
    /// nothing while a transaction is open on this connection (the next call adopts them).
    @discardableResult
    public func adoptSchemaChanges() throws(ShoalError) -> [String] {
        try refreshSchema()
        guard !schemaAdditions.isEmpty, connection.isAutocommit, !capture.hasUncommittedWork else { return [] }
        let adopted = try adoptInWriteTransaction {}
        for name in adopted { options.logger.info("schema change adopted and replicated", metadata: ["column": "\(name)"]) }
        // Values held for the new columns are merged in a transaction of their own (what is not stays held).
        try replayHeldValues()
        return adopted
    }

    /// Records `additions` as the tables' shapes, follows them with the capture triggers, and records each column not
    /// recorded yet with the same definition in ``schemaTable`` (a change of this node). Inside the caller's write
    /// transaction.
    func adoptInTransaction(_ additions: [SchemaAddition]) throws(ShoalError) -> [String] {
        guard !additions.isEmpty else { return [] }
        try prepareSchemaTableInTransaction()
        var adopted: [String] = []
        for addition in additions {
            try connection.rows(
                "INSERT OR REPLACE INTO shoal_shapes(tbl, shape) VALUES (?, ?)",
                [.integer(addition.tableID), .text(addition.shape.encoded)]
            )
            try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text("fingerprint_\(addition.tableID)")])
            // No row's metadata or hash changes: cells of the new columns read as never written, and a column never
            // written that holds its default adds nothing to a row's hash.
            if try hasCaptureTriggers(tableID: addition.tableID), let number = capture.tableNumbers[addition.table] {
                let table = capture.tables[number]
                try extendOutbox(of: table)
                for kind in ["insert", "update", "delete"] {
                    try connection.exec("DROP TRIGGER IF EXISTS \(quote("shoal_capture_\(table.id)_\(kind)"))")
                }
                for sql in captureSchema(table) { try connection.exec(sql) }
            }
            for column in addition.columns {
                adopted.append("\(addition.table).\(column.name)")
                try recordSchemaChange(
                    table: addition.table, column: column.name, definition: recordedDefinition(column, of: addition.table)
                )
            }
        }
        schemaAdditions.removeAll()
        heldMayReplay = true
        return adopted
    }

    /// The marker that ends a table's recorded `CREATE TABLE` with its counter columns (an SQL comment).
    static let countersMarker = "\n-- shoal counters: "

    /// The marker that ends a counter column's recorded definition (an SQL comment): peers add it as a counter.
    static let counterMarker = "\n-- shoal counter"

    /// A column's definition as recorded in ``schemaTable``: its SQL, and the counter marker if it is a counter.
    func recordedDefinition(_ column: TableShape.Column, of table: String) -> String {
        let counter = capture.tableNumbers[table].map { number in
            capture.tables[number].columnIndex[column.name].map { capture.tables[number].isCounter[$0] } ?? false
        } ?? false
        return Self.columnDefinition(column) + (counter ? Self.counterMarker : "")
    }

    /// Adds a counter column to replicated `table`: `ALTER TABLE … ADD COLUMN column INTEGER NOT NULL DEFAULT 0`,
    /// merging as a PN-counter, recorded as a schema change so that every peer adds it as a counter too (peers that
    /// follow schema changes by hand make the same call). Every row's value starts at 0; no row is written.
    public func addCounterColumn(_ column: String, to table: String) throws(ShoalError) {
        try refreshSchema()
        guard let number = capture.tableNumbers[table] else {
            throw ShoalError(code: .notReplicated, message: "table \(table) is not replicated: replicate it first")
        }
        let existing = capture.tables[number]
        guard existing.columnIndex[column] == nil, !existing.keyColumns.contains(column) else {
            throw ShoalError(code: .invalidArgument, message: "table \(table) already has a column named \(column)")
        }
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "add a counter column outside of any open transaction")
        }
        _ = try adoptInWriteTransaction { () throws(ShoalError) in
            try connection.exec("ALTER TABLE \(quote(table)) ADD COLUMN \(quote(column)) INTEGER NOT NULL DEFAULT 0")
            try markCounter(column, of: table)
        }
        options.logger.info("counter column added and replicated", metadata: ["column": "\(table).\(column)"])
        try replayHeldValues()
    }

    /// In one write transaction: stamps what other connections wrote (with the shape they wrote in), runs `change`
    /// (a schema change of this node's, or nothing when another tool made it), adopts what the tables gained, and
    /// commits. Returns the columns adopted.
    private func adoptInWriteTransaction(_ change: () throws(ShoalError) -> Void) throws(ShoalError) -> [String] {
        try beginWriting()
        do throws(ShoalError) {
            try stampForeignWrites()
            try change()
            try refreshSchema()
            let adopted = try adoptInTransaction(schemaAdditions)
            try flushCaptured()
            try connection.exec("COMMIT")
            transactionStamp = nil
            schemaVersion = -1
            return adopted
        } catch {
            abandonWrite()
            throw error
        }
    }

    /// Adds `column` to the counters of replicated `table` (inside the caller's write transaction).
    private func markCounter(_ column: String, of table: String) throws(ShoalError) {
        guard case .text(let counters) = try connection.scalar(
            "SELECT counters FROM shoal_tables WHERE name = ?", [.text(table)]
        ) else { throw ShoalError.corruptMetadata("table \(table) has no counters entry") }
        let names = counters.split(separator: ",").map(String.init) + [column]
        try connection.rows(
            "UPDATE shoal_tables SET counters = ? WHERE name = ?", [.text(names.joined(separator: ",")), .text(table)]
        )
        // The schema cookie does not move for a metadata row: the tables are read again at the next refresh.
        schemaVersion = -1
    }

    /// Records that this node replicated `table` (inside the caller's write transaction): its `CREATE TABLE`
    /// statement and counters, so that peers create and replicate it too. A table already recorded with the same
    /// definition (a peer replicated it first) is that change.
    ///
    /// Only once this database syncs with others (it holds a change another node made): the tables an app creates
    /// on each device before its first sync are that device's starting schema, not a change to a cluster.
    func recordTableCreation(_ table: String, counters: [String]) throws(ShoalError) {
        let synced = try statement("SELECT 1 FROM shoal_log WHERE site <> ? AND hlc > 65536 LIMIT 1")
        try synced.bind([.integer(ownSiteIndex)])
        let hasPeers = try synced.step()
        synced.reset()
        guard hasPeers, !Self.isShoalTable(table),
            case .text(let sql) = try connection.scalar(
                "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?", [.text(table)]
            )
        else { return }
        let definition = sql + (counters.isEmpty ? "" : Self.countersMarker + counters.joined(separator: ","))
        try recordSchemaChange(table: table, column: "", definition: definition)
    }

    /// Records one schema change in ``schemaTable`` (inside the caller's write transaction), as the one transaction
    /// of a site derived from the change itself, like a counter seed (see ``recordCounterSeeds(_:table:)``): every
    /// node that makes the same change (replicates the same table, adds the same column with the same definition:
    /// a peer first, then the app following by hand) writes the very same transaction, which is one change however
    /// many make it; different definitions of one column are different transactions, and one wins everywhere. Its
    /// clock is the earliest there is.
    func recordSchemaChange(table: String, column: String, definition: String) throws(ShoalError) {
        try prepareSchemaTableInTransaction()
        let content = Array("shoal schema change\0\(table)\0\(column)\0\(definition)".utf8)
        let dot = Dot(site: SiteID.derived(from: content), seq: 1)
        let change = Change(
            table: Self.schemaTable,
            primaryKey: [.text(table), .text(column)],
            payload: .column("definition", .text(definition)),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(milliseconds: 0, logical: 1), site: dot.site, seq: dot.seq)
        )
        let wasSuspended = capture.isSuspended
        capture.isSuspended = true
        defer { capture.isSuspended = wasSuspended }
        _ = try applyInTransaction([change], claim: VersionVector([dot.site: dot.seq]), since: nil, replaying: true)
    }

    /// Runs the schema changes recorded in ``schemaTable`` that this database has not made yet (a peer's new column),
    /// inside the caller's apply transaction; in manual following, only records what is pending. Returns whether the
    /// schema changed.
    func executeSchemaRecords() throws(ShoalError) -> Bool {
        guard options.schemaChanges == .apply, capture.tableNumbers[Self.schemaTable] != nil else { return false }
        var executed = false
        for row in try connection.rows("SELECT tbl, definition FROM \(Self.schemaTable) WHERE col = '' ORDER BY tbl") {
            // A peer's new table: created and replicated here, unless a table of that name exists (then the app
            // decides: status lists it as not made here).
            guard case .text(let table) = row[0], case .text(let definition) = row[1],
                capture.tableNumbers[table] == nil, try currentShape(of: table) == nil
            else { continue }
            let parts = definition.components(separatedBy: Self.countersMarker)
            let counters = parts.count > 1 ? parts[1].split(separator: ",").map(String.init) : []
            do throws(ShoalError) {
                try connection.exec("SAVEPOINT shoal_new_table")
                do throws(ShoalError) {
                    try connection.exec(parts[0])
                    _ = try replicateInTransaction(table, counters: counters)
                    try connection.exec("RELEASE shoal_new_table")
                } catch {
                    try? connection.exec("ROLLBACK TO shoal_new_table")
                    try? connection.exec("RELEASE shoal_new_table")
                    schemaVersion = -1
                    try refreshSchema()
                    throw error
                }
                executed = true
                options.logger.info("created and replicated a peer's new table", metadata: ["table": "\(table)"])
            } catch {
                options.logger.warning(
                    "cannot create a peer's new table; its changes are held",
                    metadata: ["table": "\(table)", "error": "\(error.message)"]
                )
            }
        }
        try refreshSchema()
        for row in try connection.rows("SELECT tbl, col, definition FROM \(Self.schemaTable) ORDER BY tbl, col") {
            guard case .text(let table) = row[0], case .text(let column) = row[1], case .text(let definition) = row[2],
                !column.isEmpty, let number = capture.tableNumbers[table],
                capture.tables[number].columnIndex[column] == nil,
                capture.tables[number].keyColumns.contains(column) == false
            else { continue }
            let parts = definition.components(separatedBy: Self.counterMarker)
            do throws(ShoalError) {
                try connection.exec("SAVEPOINT shoal_new_column")
                do throws(ShoalError) {
                    try connection.exec("ALTER TABLE \(quote(table)) ADD COLUMN \(parts[0])")
                    if parts.count > 1 { try markCounter(column, of: table) }
                    try connection.exec("RELEASE shoal_new_column")
                } catch {
                    try? connection.exec("ROLLBACK TO shoal_new_column")
                    try? connection.exec("RELEASE shoal_new_column")
                    throw error
                }
                executed = true
                options.logger.info(
                    "applied a peer's schema change", metadata: ["table": "\(table)", "column": "\(column)"]
                )
            } catch {
                // Not a definition this database can take (SQLite refused it): its values stay held, status says so.
                options.logger.warning(
                    "cannot apply a peer's schema change; its values are held",
                    metadata: ["table": "\(table)", "column": "\(column)", "error": "\(error.message)"]
                )
            }
        }
        guard executed else { return false }
        try refreshSchema()
        _ = try adoptInTransaction(schemaAdditions)
        try refreshSchema()
        return true
    }

    /// Columns added with different definitions on different nodes, where this node's lost, and columns declared
    /// differently from the start whose peers' values are held here (see ``SchemaConflict``).
    public func schemaConflicts() throws(ShoalError) -> [SchemaConflict] {
        try refreshSchema()
        var conflicts: [SchemaConflict] = []
        // Values held for a column this node has: it would store them as other values.
        for row in try connection.rows("SELECT tbl, col, count(*) FROM shoal_held WHERE col <> '' GROUP BY tbl, col") {
            guard case .text(let table) = row[0], case .text(let column) = row[1], case .integer(let count) = row[2],
                let number = capture.tableNumbers[table], capture.tables[number].columnIndex[column] != nil,
                let local = try currentShape(of: table)?.columns.first(where: { $0.name == column })
            else { continue }
            conflicts.append(
                SchemaConflict(
                    table: table, column: column, local: Self.columnDefinition(local), winner: "", heldValues: Int(count)
                )
            )
        }
        guard capture.tableNumbers[Self.schemaTable] != nil else { return conflicts }
        for row in try connection.rows("SELECT tbl, col, definition FROM \(Self.schemaTable) WHERE col <> ''") {
            guard case .text(let table) = row[0], case .text(let column) = row[1], case .text(let winner) = row[2],
                let shape = try currentShape(of: table),
                let local = shape.columns.first(where: { $0.name == column })
            else { continue }
            let definition = recordedDefinition(local, of: table)
            if definition != winner, !conflicts.contains(where: { $0.table == table && $0.column == column }) {
                let readable = { (text: String) in text.replacingOccurrences(of: Self.counterMarker, with: " (a counter)") }
                conflicts.append(
                    SchemaConflict(table: table, column: column, local: readable(definition), winner: readable(winner))
                )
            }
        }
        return conflicts
    }

    /// This node's schema position: how many schema changes it holds, and those recorded but not made here.
    public func schemaPosition() throws(ShoalError) -> (changes: Int, pending: [String]) {
        try refreshSchema()
        guard capture.tableNumbers[Self.schemaTable] != nil else { return (0, []) }
        var count = 0
        var pending: [String] = []
        for row in try connection.rows("SELECT tbl, col FROM \(Self.schemaTable)") {
            guard case .text(let table) = row[0], case .text(let column) = row[1] else { continue }
            count += 1
            guard !column.isEmpty else {
                if capture.tableNumbers[table] == nil { pending.append(table) }
                continue
            }
            if let number = capture.tableNumbers[table], capture.tables[number].columnIndex[column] != nil { continue }
            pending.append("\(table).\(column)")
        }
        return (count, pending.sorted())
    }
}
