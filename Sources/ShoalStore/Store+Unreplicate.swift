import CSQLite
import ShoalCore

/// A replicated table whose shape was changed by another tool, or which is gone: Shoal neither captures,
/// applies, sends nor digests it until it is restored or unreplicated.
public struct PausedTable: Sendable, Hashable {
    /// The table's name as it was replicated.
    public var name: String
    /// What changed, in words.
    public var change: String
    /// What changed, what it means and what to do.
    public var message: String
    /// The table's part of the schema fingerprint as it was replicated: a local pause does not turn peers away.
    var fingerprintText: String?
}

/// The columns of a table as `PRAGMA table_xinfo` describes them, recorded when the table is replicated and
/// compared whenever the schema changes.
struct TableShape: Equatable {
    struct Column: Equatable {
        var name: String
        var type: String
        var notNull: Bool
        var defaultValue: String?
        var keyOrder: Int64
        var hidden: Int64

        var described: String {
            var text = name + (type.isEmpty ? "" : " " + type)
            if keyOrder > 0 { text += " (key)" }
            if notNull { text += " NOT NULL" }
            if let defaultValue { text += " DEFAULT \(defaultValue)" }
            return text
        }
    }

    var columns: [Column]

    /// One line per column, tab-separated: how it is stored in `shoal_shapes`.
    var encoded: String {
        columns.map { column in
            [
                column.name, column.type, column.notNull ? "1" : "0", column.defaultValue.map { "=" + $0 } ?? "",
                String(column.keyOrder), String(column.hidden),
            ].joined(separator: "\t")
        }.joined(separator: "\n")
    }

    init(columns: [Column]) {
        self.columns = columns
    }

    init?(encoded: String) {
        var columns: [Column] = []
        for line in encoded.split(separator: "\n", omittingEmptySubsequences: false) {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 6, let order = Int64(fields[4]), let hidden = Int64(fields[5]) else { return nil }
            columns.append(
                Column(
                    name: fields[0],
                    type: fields[1],
                    notNull: fields[2] == "1",
                    defaultValue: fields[3].isEmpty ? nil : String(fields[3].dropFirst()),
                    keyOrder: order,
                    hidden: hidden
                )
            )
        }
        self.columns = columns
    }

    /// The fingerprint text the table had when replicated with this shape (see ``ReplicatedTable/fingerprintText``).
    ///
    /// It holds what decides the values a table stores: each column's name, type affinity, NOT NULL and DEFAULT
    /// (a receiver whose column is NOT NULL DEFAULT 'x' stores 'x' where the sender holds NULL), which columns are
    /// counters, and the table's CHECK constraints (a value one side accepts, the other refuses).
    func fingerprintText(table: String, counters: [String], checks: [String] = []) -> String {
        func described(_ column: Column) -> String {
            var text = column.name + " " + "\(ColumnAffinity(declaredType: column.type))"
            if column.notNull { text += " NOT NULL" }
            if let defaultValue = column.defaultValue { text += " DEFAULT " + defaultValue }
            if counters.contains(column.name) { text += ":counter" }
            return text
        }
        let keys = columns.filter { $0.keyOrder > 0 }.sorted { $0.keyOrder < $1.keyOrder }.map(described)
        let cells = columns.filter { $0.keyOrder == 0 }.map(described)
        let constraints = checks.map { " CHECK(\($0))" }.joined()
        return "\(table)(\(keys.joined(separator: ","))|\(cells.joined(separator: ",")))\(constraints)"
    }

    /// The columns `current` adds at the end of this shape, when that is all that changed and each added column
    /// can be added on every node with the same result (nullable, or with a default; no key, no hidden column).
    func addedColumns(in current: TableShape) -> [Column]? {
        guard current.columns.count > columns.count, Array(current.columns.prefix(columns.count)) == columns else {
            return nil
        }
        let added = Array(current.columns.dropFirst(columns.count))
        guard added.allSatisfy({ $0.keyOrder == 0 && $0.hidden == 0 && (!$0.notNull || $0.defaultValue != nil) }) else {
            return nil
        }
        return added
    }

    /// What turned `self` into `current`, in words ("column note was added; …").
    func changes(to current: TableShape) -> String {
        var changes: [String] = []
        let before = Dictionary(columns.map { ($0.name.lowercased(), $0) }, uniquingKeysWith: { first, _ in first })
        let after = Dictionary(
            current.columns.map { ($0.name.lowercased(), $0) },
            uniquingKeysWith: { first, _ in first }
        )
        let added = current.columns.filter { before[$0.name.lowercased()] == nil }
        let removed = columns.filter { after[$0.name.lowercased()] == nil }
        if added.count == 1 && removed.count == 1 {
            changes.append("column \(removed[0].name) was renamed to \(added[0].name) (or dropped and another added)")
        } else {
            for column in removed { changes.append("column \(column.name) was dropped") }
            for column in added { changes.append("column \(column.described) was added") }
        }
        for column in columns {
            guard let now = after[column.name.lowercased()], now != column else { continue }
            changes.append("column \(column.described) is now \(now.described)")
        }
        if changes.isEmpty {
            let order = { (shape: TableShape) in shape.columns.map(\.name).joined(separator: ", ") }
            changes.append("the columns were reordered (\(order(self)) → \(order(current)))")
        }
        return changes.joined(separator: "; ")
    }
}

extension Store {
    /// The shape of table `name` now, or `nil` if there is no such table.
    func currentShape(of name: String) throws(ShoalError) -> TableShape? {
        guard
            case .text("table") = try connection.scalar(
                "SELECT type FROM sqlite_schema WHERE name = ? COLLATE NOCASE",
                [.text(name)]
            )
        else { return nil }
        func text(_ value: SQLValue) -> String? { if case .text(let text) = value { text } else { nil } }
        var columns: [TableShape.Column] = []
        for row in try connection.rows("PRAGMA table_xinfo(\(quote(name)))") {
            guard case .text(let column) = row[1] else { continue }
            columns.append(
                TableShape.Column(
                    name: column,
                    type: text(row[2]) ?? "",
                    notNull: row[3].integerValue.map { $0 != 0 } ?? false,
                    defaultValue: text(row[4]),
                    keyOrder: row[5].integerValue ?? 0,
                    hidden: row[6].integerValue ?? 0
                )
            )
        }
        return TableShape(columns: columns)
    }

    /// Loads every replicated table whose shape is the one recorded when it was replicated; the others are
    /// returned as paused, with what changed. A table seen for the first time (just replicated, or replicated
    /// by an earlier version of Shoal) has its shape recorded now.
    func loadReplicatedTables() throws(ShoalError) -> (active: [ReplicatedTable], paused: [PausedTable]) {
        var recorded: [Int64: String] = [:]
        for row in try connection.rows("SELECT tbl, shape FROM shoal_shapes") {
            guard case .integer(let id) = row[0], case .text(let shape) = row[1] else { continue }
            recorded[id] = shape
        }
        var storedFingerprints: [Int64: String] = [:]
        for row in try connection.rows("SELECT key, value FROM shoal_meta WHERE key LIKE 'fingerprint\\_%' ESCAPE '\\'") {
            guard case .text(let key) = row[0], let id = Int64(key.dropFirst("fingerprint_".count)),
                case .text(let text) = row[1]
            else { continue }
            storedFingerprints[id] = text
        }
        var active: [ReplicatedTable] = []
        var paused: [PausedTable] = []
        var additions: [SchemaAddition] = []
        defer { schemaAdditions = additions }
        for row in try connection.rows("SELECT id, name, counters FROM shoal_tables ORDER BY name") {
            guard case .integer(let id) = row[0], case .text(let name) = row[1], case .text(let counters) = row[2]
            else { throw ShoalError.corruptMetadata("bad shoal_tables row") }
            let counterNames = counters.split(separator: ",").map(String.init)
            // As the table was last fingerprinted while active (see ``schemaFingerprint()``), or from its shape.
            let fingerprint =
                storedFingerprints[id]
                ?? recorded[id].flatMap(TableShape.init(encoded:)).map {
                    $0.fingerprintText(table: name, counters: counterNames)
                }
            guard let current = try currentShape(of: name) else {
                paused.append(
                    Self.paused(
                        name,
                        fingerprint: fingerprint,
                        change: "the table is gone (dropped or renamed by another tool)",
                        remedy: "if it was renamed, rename it back; otherwise run `shoal unreplicate \(name)` to "
                            + "drop Shoal's metadata for it"
                    )
                )
                continue
            }
            if let shape = recorded[id], let before = TableShape(encoded: shape), before != current,
                let added = before.addedColumns(in: current)
            {
                // Columns added at the end, each nullable or with a default: a schema change this node adopts
                // (``adoptSchemaChanges()``) and replicates, not a reason to pause.
                additions.append(SchemaAddition(tableID: id, table: name, columns: added, shape: current))
            } else if let shape = recorded[id] {
                let before = TableShape(encoded: shape)
                guard before == current else {
                    let change = before.map { $0.changes(to: current) } ?? "its recorded shape is unreadable"
                    paused.append(
                        Self.paused(
                            name,
                            fingerprint: fingerprint,
                            change: change,
                            remedy: "undo the change, or run `shoal unreplicate \(name)` (it keeps the table and its "
                                + "rows) and then `shoal replicate \(name)` on every node to replicate it in its new "
                                + "shape"
                        )
                    )
                    continue
                }
            } else {
                // First sight: record the shape (a failure to write, e.g. a read-only file, only delays this).
                _ = try? connection.rows(
                    "INSERT OR IGNORE INTO shoal_shapes(tbl, shape) VALUES (?, ?)",
                    [.integer(id), .text(current.encoded)]
                )
            }
            if try capturesForeignWrites, try !hasCaptureTriggers(tableID: id) {
                // Dropped and created again (a table rebuild: copy, drop, rename) by another tool: the triggers went
                // with the old table, so writes made since were not captured.
                paused.append(
                    Self.paused(
                        name,
                        fingerprint: fingerprint,
                        change: "the table was dropped and created again by another tool, so writes made to it since "
                            + "may not have been captured",
                        remedy: "run `shoal unreplicate \(name)` and then `shoal replicate \(name)` (its rows become "
                            + "this node's changes again)"
                    )
                )
                continue
            }
            do throws(ShoalError) {
                let described = try describeTable(name, id: id, counters: counterNames)
                // A unique index or a NOT NULL column without a default added since it was replicated.
                try validateReplicable(described)
                if storedFingerprints[id] == nil, let part = try fingerprintPart(of: described) {
                    try keepFingerprint(part, of: id)
                }
                active.append(described)
            } catch {
                paused.append(
                    Self.paused(
                        name,
                        fingerprint: fingerprint,
                        change: error.message,
                        remedy: "undo the change (drop the index, give the column a default), or run "
                            + "`shoal unreplicate \(name)` to drop Shoal's metadata for it"
                    )
                )
            }
        }
        return (active, paused)
    }

    private static func paused(_ name: String, fingerprint: String?, change: String, remedy: String) -> PausedTable {
        PausedTable(
            name: name,
            change: change,
            message: "replication of table \(name) is paused: \(change). Its rows are neither captured, applied "
                + "nor sent until this is resolved; every other table keeps replicating. To resolve: \(remedy)",
            fingerprintText: fingerprint
        )
    }

    /// Replicated tables whose replication is paused because another tool changed or dropped them.
    public func pausedTables() throws(ShoalError) -> [PausedTable] {
        try refreshSchema()
        return pausedTableList
    }

    /// Stops replicating `table`: drops Shoal's metadata for it (row clocks, its part of the change log and of
    /// the digest) and keeps the table and its rows. Works on paused tables (even one that is gone), which is
    /// the way out after another tool changed a replicated table's shape.
    ///
    /// What the table's transactions wrote until now stays with this node as held changes, forwarded to peers like
    /// the changes that arrive for the table later (this node has claimed those transactions, so a peer catching up
    /// from it alone is still sent their rows); the app's writes from now on are not captured. `replicate(table:)`
    /// afterwards replicates it again, continuing the rows' history.
    public func unreplicate(table: String) throws(ShoalError) {
        guard capture.hasUncommittedWork == false, connection.isAutocommit else {
            throw ShoalError(code: .invalidArgument, message: "unreplicate a table outside of any open transaction")
        }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            guard
                case .integer(let id) = try connection.scalar(
                    "SELECT id FROM shoal_tables WHERE name = ?",
                    [.text(table)]
                )
            else {
                throw ShoalError(code: .notReplicated, message: "table \(table) is not replicated")
            }
            if let replicated = capture.tables.first(where: { $0.id == id }) { try holdTransactions(of: replicated) }
            // The metadata is kept aside: replicating the table again continues its history (see `ClockArchive`).
            try archiveClock(ofTable: id, name: table)
            try connection.exec("DROP TABLE IF EXISTS shoal_clock_\(id)")
            try dropCapture(ofTable: id)
            // The log keeps this node's newest entry (its next sequence number comes from it), emptied of keys:
            // nothing of the table is sent any more, and a table replicated later under the same id reads no
            // stale keys.
            try connection.rows(
                "DELETE FROM shoal_log WHERE tbl = ? AND NOT (site = ? AND seq = "
                    + "(SELECT max(seq) FROM shoal_log WHERE site = ?))",
                [.integer(id), .integer(ownSiteIndex), .integer(ownSiteIndex)]
            )
            try connection.rows("UPDATE shoal_log SET keys = x'' WHERE tbl = ?", [.integer(id)])
            try connection.rows("DELETE FROM shoal_shapes WHERE tbl = ?", [.integer(id)])
            try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text("fingerprint_\(id)")])
            try forgetDigest(ofTable: id)
            try connection.rows("DELETE FROM shoal_tables WHERE id = ?", [.integer(id)])
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            schemaVersion = -1
            throw error
        }
        schemaVersion = -1
        try refreshSchema()
    }

    /// Keeps what every transaction still has in `table` as held changes logged under the same transactions (inside
    /// the caller's transaction, before the table's metadata and log go): what an answer would have sent of them.
    private func holdTransactions(of table: ReplicatedTable) throws(ShoalError) {
        try refreshSites()
        let keys = table.keyColumns.indices.map { "k\($0)" }.joined(separator: ", ")
        let select = try connection.prepare("SELECT \(keys), meta FROM shoal_clock_\(table.id)")
        var changes: [Change] = []
        while try select.step() {
            let row = select.row()
            guard case .blob(let bytes) = row.last! else { continue }
            let key = Array(row.dropLast())
            let state = try RowState(encoded: bytes, columnCount: table.columns.count, sites: sites)
            for dot in state.dots { _ = try collect(dot: dot, table: table, key: key, into: &changes) }
            if changes.count >= 10_000 {
                _ = try hold(changes)
                changes.removeAll(keepingCapacity: true)
            }
        }
        _ = try hold(changes)
    }
}
