import CSQLite
import ShoalCore

// What a table must be for Shoal to replicate it: checked at `replicate`, and again whenever the schema changes
// (a table that no longer qualifies is paused).
extension Store {
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
    func validateCounters(_ table: ReplicatedTable) throws(ShoalError) {
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
    func refuseUnreplicable(_ row: [SQLValue], names: [String], table: ReplicatedTable) throws(ShoalError) {
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

    /// A key column's declared type, collation (nil: none declared) and whether it is AUTOINCREMENT.
    func keyColumnMetadata(
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
}
