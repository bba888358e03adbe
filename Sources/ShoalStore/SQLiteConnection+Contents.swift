import ShoalCore

extension SQLiteConnection {
    /// Every application table's rows (not Shoal's, not SQLite's), each value as its storage class and its bytes in
    /// hex, sorted: what two converged replicas must hold alike, read with plain SQL and no use of Shoal's metadata
    /// or digest. Columns are taken by name, each value prefixed with its column's name: two nodes that added two
    /// columns in turn, each its own first, hold them in another order and the same rows. The tests and the chaos
    /// harness compare replicas with it.
    package func applicationTableContents() throws(ShoalError) -> [String: [String]] {
        var result: [String: [String]] = [:]
        let tables = try rows(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'shoal\\_%' ESCAPE '\\' "
                + "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        )
        for case .text(let table) in tables.map({ $0[0] }) {
            let columns = try rows("SELECT name FROM pragma_table_info(?)", [.text(table)]).compactMap { row in
                if case .text(let name) = row[0] { name } else { nil }
            }
            let select = columns.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }.map { name in
                let quoted = "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                return "'\(name.replacingOccurrences(of: "'", with: "''"))=' || typeof(\(quoted)) || ':' || "
                    + "coalesce(hex(\(quoted)), '')"
            }.joined(separator: " || '|' || ")
            let quotedTable = "\"" + table.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            result[table] = try rows("SELECT \(select) FROM \(quotedTable)").map { row in
                if case .text(let line) = row[0] { line } else { "" }
            }.sorted()
        }
        return result
    }
}
