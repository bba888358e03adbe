import CSQLite
import ShoalCore

extension Store {
    /// Reads a table's schema as the store needs it.
    func describeTable(_ name: String, id: Int64, counters: [String]) throws(ShoalError) -> ReplicatedTable {
        let info = try connection.rows("PRAGMA table_xinfo(\(quote(name)))")
        guard !info.isEmpty else {
            throw ShoalError(code: .notReplicated, message: "no table named \(name) in this database")
        }
        var keys: [(order: Int64, name: String, position: Int32, type: String)] = []
        var columns: [(name: String, position: Int32, type: String)] = []
        for row in info {
            guard case .integer(let cid) = row[0], case .text(let column) = row[1] else {
                throw ShoalError.corruptMetadata("unexpected table_xinfo row for \(name)")
            }
            if case .integer(let hidden) = row[6], hidden != 0 {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "table \(name) has a generated or hidden column (\(column)); such tables cannot be "
                        + "replicated yet"
                )
            }
            let type = if case .text(let declared) = row[2] { declared } else { "" }
            if case .integer(let order) = row[5], order > 0 {
                keys.append((order, column, Int32(cid), type))
            } else {
                columns.append((column, Int32(cid), type))
            }
        }
        guard !keys.isEmpty else {
            throw ShoalError(
                code: .noPrimaryKey,
                message: "table \(name) has no PRIMARY KEY; replicated tables need one so that every node names "
                    + "the same row the same way"
            )
        }
        keys.sort { $0.order < $1.order }
        var isCounter = Array(repeating: false, count: columns.count)
        for counter in counters {
            guard let index = columns.firstIndex(where: { $0.name == counter }) else {
                let isKey = keys.contains { $0.name == counter }
                throw ShoalError(
                    code: .unknownColumn,
                    message: isKey
                        ? "column \(counter) is part of the primary key of \(name) and cannot be a counter"
                        : "table \(name) has no column \(counter) to use as a counter"
                )
            }
            isCounter[index] = true
        }
        let pkIndexes = try connection.rows("PRAGMA index_list(\(quote(name)))").filter {
            if case .text(let origin) = $0[3] { origin == "pk" } else { false }
        }
        let keyIsRowid = keys.count == 1 && keys[0].type.uppercased() == "INTEGER" && pkIndexes.isEmpty
        return ReplicatedTable(
            id: id,
            name: name,
            keyColumns: keys.map(\.name),
            keyPositions: keys.map(\.position),
            columns: columns.map(\.name),
            columnPositions: columns.map(\.position),
            isCounter: isCounter,
            keyIsRowid: keyIsRowid,
            keyAffinities: keys.map { ColumnAffinity(declaredType: $0.type) },
            affinities: columns.map { ColumnAffinity(declaredType: $0.type) }
        )
    }

    /// The tables this database replicates, by name.
    public func replicatedTables() throws(ShoalError) -> [String] {
        try refreshSchema()
        return capture.tables.map(\.name)
    }

    /// Marks `table` replicated. Rows already in it become changes of this node.
    ///
    /// The table needs a primary key; non-key `NOT NULL` columns need a default (a row revived by a remote
    /// change may arrive one column at a time); unique constraints other than the key are refused, since
    /// two nodes could each write a value the other already holds. `counters` names integer columns that
    /// merge as PN-counters: an UPDATE that moves such a column by d is this node's increment of d.
    /// Calling it again with the same counters does nothing.
    ///
    /// Returns what a person should know about the table (see ``replicationWarnings(_:)``); the CLI prints it.
    @discardableResult
    public func replicate(table: String, counters: [String] = []) throws(ShoalError) -> [String] {
        try refreshSchema()
        if let paused = pausedTableList.first(where: { $0.name == table }) {
            throw ShoalError(code: .tablePaused, message: paused.message)
        }
        if let number = capture.tableNumbers[table] {
            let existing = capture.tables[number]
            let current = existing.columns.indices.filter { existing.isCounter[$0] }.map { existing.columns[$0] }
            guard Set(current) == Set(counters) else {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "table \(table) is already replicated with counters [\(current.joined(separator: ", "))]; "
                        + "counters cannot be changed after the fact"
                )
            }
            return []
        }
        guard table == Self.rosterTable || !table.lowercased().hasPrefix("shoal_"), !table.lowercased().hasPrefix("sqlite_")
        else {
            throw ShoalError(
                code: .unsupportedSchema,
                message: "\(table) is an internal table and cannot be replicated"
            )
        }
        guard
            case .text("table") = try connection.scalar(
                "SELECT type FROM sqlite_schema WHERE name = ? COLLATE NOCASE",
                [.text(table)]
            )
        else {
            throw ShoalError(code: .notReplicated, message: "no table named \(table) in this database")
        }
        guard capture.hasUncommittedWork == false, connection.isAutocommit else {
            throw ShoalError(code: .invalidArgument, message: "replicate a table outside of any open transaction")
        }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            let described = try describeTable(table, id: 0, counters: counters)
            try validateReplicable(described)
            let warnings = replicationWarnings(described)
            try validateCounters(described)
            try connection.rows(
                "INSERT INTO shoal_tables(name, counters) VALUES (?, ?)",
                [.text(table), .text(counters.joined(separator: ","))]
            )
            let id = try connection.scalar("SELECT id FROM shoal_tables WHERE name = ?", [.text(table)]).integerValue!
            try connection.exec(try clockTableDefinition(described, id: id))
            for sql in captureSchema(try describeTable(table, id: id, counters: counters)) { try connection.exec(sql) }
            try refreshSchema()
            guard let number = capture.tableNumbers[table] else {
                throw ShoalError.corruptMetadata("table \(table) vanished while it was being replicated")
            }
            let replicated = capture.tables[number]
            let keys = replicated.keyColumns.map(quote).joined(separator: ", ")
            let columns = replicated.columns.map(quote)
            let select = try connection.prepare(
                "SELECT \(([keys] + columns).joined(separator: ", ")) FROM \(quote(table))"
            )
            let names = replicated.keyColumns + replicated.columns
            while try select.step() {
                let row = select.row()
                let key = Array(row[0..<replicated.keyColumns.count])
                let values = row[replicated.keyColumns.count...]
                try refuseUnreplicable(row, names: names, table: replicated)
                let counterValues = zip(values, replicated.isCounter).map { $1 ? ($0.integerValue ?? 0) : 0 }
                capture.addExistingRow(table: number, key: key, counterValues: counterValues)
            }
            try flushCaptured()
            try connection.exec("COMMIT")
            transactionStamp = nil
            return warnings
        } catch {
            capture.discardPending()
            try? connection.exec("ROLLBACK")
            transactionStamp = nil
            schemaVersion = -1
            throw error
        }
    }

    func validateReplicable(_ table: ReplicatedTable) throws(ShoalError) {
        try validateKeys(table)
        try validateChecks(table)
        for row in try connection.rows("PRAGMA table_info(\(quote(table.name)))") {
            guard case .text(let column) = row[1], case .integer(let notNull) = row[3], notNull != 0,
                case .null = row[4], table.columnIndex[column] != nil
            else { continue }
            throw ShoalError(
                code: .unsupportedSchema,
                message: "column \(table.name).\(column) is NOT NULL without a DEFAULT; give it a default so a "
                    + "row revived by a remote change can be written one column at a time"
            )
        }
        for row in try connection.rows("PRAGMA index_list(\(quote(table.name)))") {
            guard case .integer(let unique) = row[2], unique != 0, case .text(let origin) = row[3], origin != "pk",
                case .text(let index) = row[1]
            else { continue }
            throw ShoalError(
                code: .unsupportedSchema,
                message: "table \(table.name) has a unique constraint (\(index)) besides its primary key; two nodes "
                    + "could each write a value the other holds, so such tables cannot be replicated"
            )
        }
    }

    /// Keys must name one row the same way on every node: SQLite compares keys under their collation and affinity,
    /// so keys it considers equal (`BOB@x` and `bob@x` under NOCASE, `1` and `1.0` in a REAL or NUMERIC column)
    /// would be one row on a node that holds one of them and two rows across nodes. AUTOINCREMENT keys are
    /// assigned by each node from its own sequence: two nodes would give different rows the same key.
    private func validateKeys(_ table: ReplicatedTable) throws(ShoalError) {
        for (index, column) in table.keyColumns.enumerated() {
            let (type, collation, autoincrement) = try keyColumnMetadata(table.name, column)
            if autoincrement {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "the key of \(table.name) is AUTOINCREMENT: every node would number its new rows from its "
                        + "own sequence, and two nodes would give different rows the same key. Give each row a key "
                        + "unique across nodes (for example `id INTEGER PRIMARY KEY` filled with abs(random()), or a "
                        + "TEXT key filled with lower(hex(randomblob(16)))), then replicate"
                )
            }
            let collationName = collation ?? "BINARY"
            if collationName.uppercased() != "BINARY" {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "key column \(table.name).\(column) uses COLLATE \(collationName): keys SQLite considers "
                        + "equal under it (such as BOB@x and bob@x) would be one row on one node and two rows across "
                        + "nodes. Declare the key with the default (BINARY) collation and store it normalised (for "
                        + "example lower(email)), or keep a \(collationName) index beside it for lookups"
                )
            }
            switch table.keyAffinities[index] {
            case .real, .numeric:
                let declared = type
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "key column \(table.name).\(column) is declared \(declared): SQLite compares 1 and 1.0 "
                        + "as the same key there, and stores either, so nodes would keep one row under different "
                        + "keys. Declare the key INTEGER, TEXT or BLOB"
                )
            default:
                break
            }
        }
        // A key declared as a table constraint (`PRIMARY KEY(email COLLATE NOCASE)`) carries its collation in the
        // key's index, not in the column.
        for index in try connection.rows("PRAGMA index_list(\(quote(table.name)))") {
            guard case .text(let origin) = index[3], origin == "pk", case .text(let name) = index[1] else { continue }
            for part in try connection.rows("PRAGMA index_xinfo(\(quote(name)))") {
                guard part[5] == .integer(1), case .text(let collation) = part[4], collation.uppercased() != "BINARY",
                    case .text(let column) = part[2]
                else { continue }
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "the key of \(table.name) compares \(column) with COLLATE \(collation): keys SQLite considers "
                        + "equal under it (such as BOB@x and bob@x) would be one row on one node and two rows across "
                        + "nodes. Declare the key with the default (BINARY) collation and store it normalised (for "
                        + "example lower(email)), or keep a \(collation) index beside it for lookups"
                )
            }
        }
    }

    /// What ``replicate(table:counters:)`` warns about a table it accepts: an `INTEGER PRIMARY KEY` that SQLite
    /// fills when an INSERT leaves it out gives concurrent inserts on two nodes the same key, and they merge.
    func replicationWarnings(_ table: ReplicatedTable) -> [String] {
        guard table.keyIsRowid else { return [] }
        return [
            "\(table.name).\(table.keyColumns[0]) is a key SQLite assigns when an INSERT leaves it out; two nodes "
                + "inserting that way give different rows the same key, and the rows merge. Give every INSERT a key "
                + "unique across nodes, for example abs(random())"
        ]
    }

    /// A field-level merge combines columns that different nodes wrote: a CHECK relating several columns (or a
    /// counter, whose merged sum no node wrote) can be violated by a merge of two valid writes, and every node
    /// would refuse that merge forever. Such tables are refused, with the constraint named; a CHECK of one plain
    /// column holds for every value a node wrote, and so for the merge.
    private func validateChecks(_ table: ReplicatedTable) throws(ShoalError) {
        guard
            case .text(let sql) = try connection.scalar(
                "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?",
                [.text(table.name)]
            )
        else { return }
        let names = Dictionary(
            (table.keyColumns + table.columns).map { ($0.lowercased(), $0) },
            uniquingKeysWith: { first, _ in first }
        )
        for check in SQLText.checkExpressions(in: sql) {
            let referenced = Set(SQLText.identifiers(in: check).compactMap { names[$0.lowercased()] })
            let counters = referenced.filter { table.columnIndex[$0].map { table.isCounter[$0] } ?? false }
            if referenced.count > 1 || !counters.isEmpty {
                let reason =
                    counters.isEmpty
                    ? "it relates columns \(referenced.sorted().joined(separator: ", ")), which nodes may write "
                        + "concurrently; a merge of two valid edits could break it"
                    : "it constrains counter \(counters.sorted().joined(separator: ", ")), whose merged sum no node "
                        + "wrote; concurrent increments could break it"
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "table \(table.name) has CHECK(\(check)): \(reason), and every node would then refuse "
                        + "the merge. Drop the CHECK (keep the rule in the app), or keep the related values in one "
                        + "column, then replicate"
                )
            }
        }
    }

    /// Counter columns merge by adding integers: they must be declared with an integer type and have an
    /// integer DEFAULT (a row revived by a remote change may arrive without its counters, and NULL is not a
    /// count).
    private func validateCounters(_ table: ReplicatedTable) throws(ShoalError) {
        guard table.hasCounters else { return }
        for row in try connection.rows("PRAGMA table_info(\(quote(table.name)))") {
            guard case .text(let column) = row[1], let index = table.columnIndex[column], table.isCounter[index]
            else { continue }
            let declared = if case .text(let type) = row[2] { type } else { "" }
            guard declared.uppercased().contains("INT") else {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "column \(table.name).\(column) is declared "
                        + "\(declared.isEmpty ? "with no type" : declared); "
                        + "a counter column must be declared INTEGER, since counters merge by adding integers"
                )
            }
            let defaultValue = if case .text(let text) = row[4] { text } else { "" }
            let literal = defaultValue.filter { $0 != "(" && $0 != ")" && $0 != " " }
            guard Int64(literal) != nil else {
                throw ShoalError(
                    code: .unsupportedSchema,
                    message: "counter column \(table.name).\(column) needs an integer DEFAULT (for example "
                        + "`\(column) INTEGER DEFAULT 0`): a row revived by a remote change may arrive without its "
                        + "counters, and a counter refuses NULL"
                )
            }
        }
    }

    /// Refuses to replicate a table holding a row Shoal could not replicate: a counter that is not an
    /// integer, a value over the size maximum.
    private func refuseUnreplicable(_ row: [SQLValue], names: [String], table: ReplicatedTable) throws(ShoalError) {
        let keyCount = table.keyColumns.count
        if !table.keyIsRowid,
            let refusal = table.keyRefusal(Array(row[0..<keyCount]), ending: "a row holds one: fix it, then replicate")
        {
            throw refusal
        }
        for (position, value) in row.enumerated() {
            let bytes: Int =
                switch value {
                case .text(let text): text.utf8.count
                case .blob(let blob): blob.count
                default: 0
                }
            if bytes > Self.maximumValueBytes {
                throw ShoalError(
                    code: .valueTooLarge,
                    message: "\(table.name).\(names[position]) holds a value of \(bytes) bytes, larger than the "
                        + "maximum of \(Self.maximumValueBytes) bytes a replicated table accepts; shorten it, then "
                        + "replicate"
                )
            }
            let isInteger = if case .integer = value { true } else { false }
            if position >= keyCount, table.isCounter[position - keyCount], !isInteger {
                throw ShoalError(
                    code: .counterNotInteger,
                    message: "counter column \(table.name).\(names[position]) holds a value that is not an integer "
                        + "(\(value)); counters merge by adding integers: fix the rows, then replicate"
                )
            }
        }
    }

    private func clockTableDefinition(_ table: ReplicatedTable, id: Int64) throws(ShoalError) -> String {
        let name = "shoal_clock_\(id)"
        if table.keyIsRowid {
            return "CREATE TABLE \(name)(k0 INTEGER PRIMARY KEY, meta BLOB NOT NULL)"
        }
        var definitions: [String] = []
        for (index, column) in table.keyColumns.enumerated() {
            let (declared, collation, _) = try keyColumnMetadata(table.name, column)
            let collate = collation.map { " COLLATE \(quote($0))" } ?? ""
            definitions.append("k\(index)\(declared.isEmpty ? "" : " " + declared)\(collate)")
        }
        let keys = table.keyColumns.indices.map { "k\($0)" }.joined(separator: ", ")
        return "CREATE TABLE \(name)(\(definitions.joined(separator: ", ")), meta BLOB NOT NULL, "
            + "PRIMARY KEY(\(keys))) WITHOUT ROWID"
    }

    /// One active table's part of ``schemaFingerprint()``.
    func fingerprintPart(of table: ReplicatedTable) throws(ShoalError) -> String? {
        guard let shape = try currentShape(of: table.name) else { return nil }
        let sql = try connection.scalar(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?",
            [.text(table.name)]
        )
        let text = if case .text(let text) = sql { text } else { "" }
        let checks = SQLText.checkExpressions(in: text).map(SQLText.normalized)
        let counters = table.columns.indices.filter { table.isCounter[$0] }.map { table.columns[$0] }
        var part = shape.fingerprintText(table: table.name, counters: counters, checks: checks)
        // A STRICT table refuses values another would store; a rowid key takes integers only.
        if Self.isStrict(text) { part += " STRICT" }
        if table.keyIsRowid { part += " ROWID" }
        return part
    }

    /// Keeps a table's fingerprint part, so that it counts the same while paused (its shape then is not what it was
    /// replicated with). A read-only file only delays this.
    func keepFingerprint(_ part: String, of id: Int64) throws(ShoalError) {
        let key = "fingerprint_\(id)"
        guard try connection.scalar("SELECT value FROM shoal_meta WHERE key = ?", [.text(key)]) != .text(part) else {
            return
        }
        _ = try? connection.rows("INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)", [.text(key), .text(part)])
    }

    /// Whether a `CREATE TABLE` statement declares a STRICT table (its options follow the closing parenthesis).
    static func isStrict(_ sql: String) -> Bool {
        let tokens = SQLText.tokenize(sql)
        guard let close = tokens.lastIndex(where: { $0.kind == .symbol(")") }) else { return false }
        return tokens[close...].contains { if case .word(let word) = $0.kind { word.uppercased() == "STRICT" } else { false } }
    }

    /// A key column's declared type, collation (nil: none declared) and whether it is AUTOINCREMENT.
    private func keyColumnMetadata(
        _ table: String,
        _ column: String
    ) throws(ShoalError) -> (type: String, collation: String?, autoincrement: Bool) {
        var type: UnsafePointer<CChar>?
        var collation: UnsafePointer<CChar>?
        var notNull: Int32 = 0
        var primaryKey: Int32 = 0
        var autoincrement: Int32 = 0
        let code = sqlite3_table_column_metadata(
            connection.handle, "main", table, column, &type, &collation, &notNull, &primaryKey, &autoincrement
        )
        guard code == SQLITE_OK else { throw connection.error(code, "reading the key of \(table)") }
        return (type.map { String(cString: $0) } ?? "", collation.map { String(cString: $0) }, autoincrement != 0)
    }

    /// A fingerprint of the replicated schema: nodes that exchange changes should share it.
    ///
    /// It covers each replicated table's whole shape as far as it decides what the table stores (see
    /// ``TableShape/fingerprintText(table:counters:checks:)``), so that peers whose tables would store different
    /// rows for the same changes never exchange them, on the live path (the hello) and the offline one (the change
    /// stream's header).
    public func schemaFingerprint() throws(ShoalError) -> String {
        try refreshSchema()
        if let cached = fingerprintCache, cached.version == schemaVersion { return cached.text }
        var parts: [String] = []
        for table in capture.tables {
            guard let part = try fingerprintPart(of: table) else { continue }
            parts.append(part)
            try keepFingerprint(part, of: table.id)
        }
        // A paused table counts as it was replicated: a local schema problem does not turn every peer away.
        parts += pausedTableList.compactMap(\.fingerprintText)
        let text = parts.sorted().joined(separator: ";")
        fingerprintCache = (schemaVersion, text)
        return text
    }

    /// Refuses a change stream written by a database whose replicated tables would store other rows for the same
    /// changes (``schemaFingerprint()``): a column NOT NULL with a DEFAULT on one side and nullable on the other,
    /// another type affinity, another CHECK. A stream without a fingerprint (from an older Shoal) is taken as is.
    public func checkStreamSchema(_ schema: String?) throws(ShoalError) {
        guard let schema else { return }
        let local = try schemaFingerprint()
        guard schema != local else { return }
        func byTable(_ text: String) -> [String: String] {
            var parts: [String: String] = [:]
            for part in text.split(separator: ";") {
                let name = String(part.prefix { $0 != "(" })
                parts[name] = String(part)
            }
            return parts
        }
        let theirs = byTable(schema)
        let ours = byTable(local)
        let differing = Set(theirs.keys).union(ours.keys).filter { theirs[$0] != ours[$0] }.sorted()
        let described = differing.map { name in
            "\(name): here \(ours[name] ?? "not replicated"), in the stream \(theirs[name] ?? "not replicated")"
        }
        throw ShoalError(
            code: .unsupportedSchema,
            message: "the stream's replicated tables differ from this database's, so the same changes would leave "
                + "different rows: \(described.joined(separator: "; ")). Give both the same tables (columns, types, "
                + "NOT NULL, DEFAULT, CHECK), then apply again. Nothing was applied"
        )
    }
}
