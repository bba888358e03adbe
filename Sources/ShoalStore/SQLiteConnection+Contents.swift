import ShoalCore

extension SQLiteConnection {
    /// Every application table's rows (not Shoal's, not SQLite's), each value as its storage class and its bytes in
    /// hex, sorted: what two converged replicas must hold alike, read with plain SQL and no use of Shoal's metadata
    /// or digest. The tests and the chaos harness compare replicas with it.
    package func applicationTableContents() throws(ShoalError) -> [String: [String]] {
        var result: [String: [String]] = [:]
        let tables = try rows(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'shoal\\_%' ESCAPE '\\' "
                + "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        )
        for case .text(let table) in tables.map({ $0[0] }) {
            let columns = try rows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [.text(table)])
            let select = columns.compactMap { row -> String? in
                guard case .text(let name) = row[0] else { return nil }
                let quoted = "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                return "typeof(\(quoted)) || ':' || coalesce(hex(\(quoted)), '')"
            }.joined(separator: " || '|' || ")
            let quotedTable = "\"" + table.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            result[table] = try rows("SELECT \(select) FROM \(quotedTable)").map { row in
                if case .text(let line) = row[0] { line } else { "" }
            }.sorted()
        }
        return result
    }
}
