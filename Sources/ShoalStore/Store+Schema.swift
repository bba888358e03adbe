import CSQLite
import ShoalCore

extension Store {
    /// Whether `table` is one of Shoal's own (its name begins `shoal_`, in any case, as SQLite compares names): its
    /// metadata, and the replicated tables it keeps for itself (the roster, member reports, schema changes).
    public static func isShoalTable(_ table: String) -> Bool {
        table.lowercased().hasPrefix("shoal_")
    }

    /// Reads a table's schema as the store needs it.
    func describeTable(_ name: String, id: Int64, counters: [String]) throws(ShoalError) -> ReplicatedTable {
        let info = try connection.rows("PRAGMA table_xinfo(\(quote(name)))")
        guard !info.isEmpty else {
            throw ShoalError(code: .notReplicated, message: "no table named \(name) in this database")
        }
        var keys: [(order: Int64, name: String, position: Int32, type: String)] = []
        var columns: [(name: String, position: Int32, type: String)] = []
        var defaults: [SQLValue?] = []
        var notNull: [Bool] = []
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
                defaults.append(try constantDefault(row[4]))
                notNull.append(row[3].integerValue.map { $0 != 0 } ?? false)
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
            affinities: columns.map { ColumnAffinity(declaredType: $0.type) },
            defaults: defaults,
            notNull: notNull
        )
    }

    /// The value of a column's declared default (`PRAGMA table_xinfo`'s text) when it is a literal: a number, a
    /// string, a blob, NULL, TRUE or FALSE. `nil` for an expression such as `CURRENT_TIMESTAMP`, or no default.
    func constantDefault(_ declared: SQLValue) throws(ShoalError) -> SQLValue? {
        guard case .text(let text) = declared else { return .null }
        let literal = SQLText.tokenize(text).allSatisfy { token in
            switch token.kind {
            case .string: true
            case .symbol(let symbol): "+-().".contains(symbol)
            case .word(let word):
                word.first?.isNumber == true || ["NULL", "TRUE", "FALSE", "X"].contains(word.uppercased())
            case .quotedIdentifier: false
            }
        }
        guard literal else { return nil }
        return try? connection.scalar("SELECT \(text)")
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
        guard table == Self.rosterTable || !Self.isShoalTable(table), !table.lowercased().hasPrefix("sqlite_")
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
        let warnings: [String]
        do throws(ShoalError) {
            warnings = try replicateInTransaction(table, counters: counters)
            // A schema change of this node: peers create and replicate the table too.
            try recordTableCreation(table, counters: counters)
            try connection.exec("COMMIT")
            transactionStamp = nil
        } catch {
            abandonWrite()
            throw error
        }
        // Changes held for it (a peer replicated it first, or it was paused) are merged now, in a transaction of their
        // own: the table is replicated whether or not that goes through (what is not merged stays held).
        try replayHeldValues()
        return warnings
    }

    /// ``replicate(table:counters:)`` inside the caller's write transaction (the caller commits).
    func replicateInTransaction(_ table: String, counters: [String]) throws(ShoalError) -> [String] {
        let described = try describeTable(table, id: 0, counters: counters)
        try validateReplicable(described)
        let warnings = replicationWarnings(described)
        try validateCounters(described)
        if let id = try connection.scalar("SELECT id FROM shoal_tables WHERE name = ?", [.text(table)]).integerValue {
            // Replicated already, but not loaded on this connection: paused, or made by another process since this
            // connection last read the schema. Said plainly (a bare UNIQUE failure was seen in chaos runs, cause
            // unknown).
            let paused = pausedTableList.first { $0.name == table }.map { ": paused here (\($0.message))" } ?? ""
            throw ShoalError.corruptMetadata(
                "table \(table) is replicated already (number \(id)) but not loaded on this connection\(paused); "
                    + "schema version here \(schemaVersion)"
            )
        }
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
        // A table replicated before continues its history: counters add only what moved meanwhile.
        let archive = try clockArchive(of: table)
        if let archive, Set(archive.counters) != Set(counters) {
            let before = archive.counters.isEmpty ? "no counter" : "counters [\(archive.counters.joined(separator: ", "))]"
            throw ShoalError(
                code: .unsupportedSchema,
                message: "table \(table) was replicated before with \(before), and its history was kept: replicate it "
                    + "with the same counters to continue it (\(archive.counters.map { "--counter \($0)" }.joined(separator: " ")))"
                    + ", or forget that history first (shoal unreplicate \(table) --forget), after which its rows "
                    + "count as this node's writes and its counter values as this node's increments"
            )
        }
        // The tombstones it kept aside come back, under transactions collection may have passed meanwhile.
        if archive != nil { try reopenCollection() }
        let restored = try archive.map { archive throws(ShoalError) in
            try restoreArchivedRows(archive, table: number)
        } ?? [:]
        var seeds: [CounterSeed] = []
        while try select.step() {
            let row = select.row()
            let key = Array(row[0..<replicated.keyColumns.count])
            let values = row[replicated.keyColumns.count...]
            try refuseUnreplicable(row, names: names, table: replicated)
            if let (existed, delta, changed) = restored[key] {
                capture.addExistingRow(table: number, key: key, existed: existed, changed: changed, counterDelta: delta)
            } else {
                // Counter values found here are the table's seed (see ``recordCounterSeeds(_:table:)``), not
                // this node's increments: stamped as ours first, then moved to the seed's site.
                let counterValues = zip(values, replicated.isCounter).map { $1 ? ($0.integerValue ?? 0) : 0 }
                if counterValues.contains(where: { $0 != 0 }) { seeds.append(CounterSeed(key: key, values: counterValues)) }
                capture.addExistingRow(table: number, key: key, counterDelta: counterValues)
            }
        }
        try flushCaptured()
        try recordCounterSeeds(seeds, table: replicated)
        try dropClockArchive(of: table)
        return warnings
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
}
