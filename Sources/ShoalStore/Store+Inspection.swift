import ShoalCore

extension Store {
    /// SQLite's data version: it changes whenever another connection commits to the file.
    public func dataVersion() throws(ShoalError) -> Int64 {
        try connection.scalar("PRAGMA data_version").integerValue ?? 0
    }
}

extension Store {
    /// A row's replication metadata (causal length and per-column clocks), or `nil` if never seen.
    public func rowState(table: String, primaryKey: [SQLValue]) throws(ShoalError) -> RowState? {
        try refreshSchema()
        return try inReadSnapshot { () throws(ShoalError) in
            try refreshSchema()
            try refreshSites()
            guard let number = capture.tableNumbers[table] else {
                throw ShoalError(code: .notReplicated, message: "table \(table) is not replicated")
            }
            return try loadState(table: capture.tables[number], key: primaryKey)
        }
    }
}
