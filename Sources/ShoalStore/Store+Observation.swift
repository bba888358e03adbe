import CSQLite
import ShoalCore

/// What observation needs from the store: which tables a query reads (as SQLite reports them, not by parsing the
/// SQL), and which replicated tables the commits since the last look wrote.
extension Store {
    /// The tables `sql` (one statement that writes nothing) reads, as SQLite's authorizer reports them while it
    /// prepares the statement (views and subqueries resolved to their tables). The statement is not run.
    public func tablesRead(by sql: String) throws(ShoalError) -> Set<String> {
        collectingReads = true
        tablesRead = []
        defer {
            collectingReads = false
            tablesRead = []
        }
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v2(connection.handle, sql, -1, &statement, nil)
        defer { sqlite3_finalize(statement) }
        guard code == SQLITE_OK else {
            throw ShoalError(
                code: .sqlite,
                message: "cannot prepare \(sql.prefix(200)): \(String(cString: sqlite3_errmsg(connection.handle)))",
                sqlite: ShoalError.SQLiteFailure(extendedResultCode: sqlite3_extended_errcode(connection.handle), statement: sql)
            )
        }
        guard sqlite3_stmt_readonly(statement) != 0, sqlite3_sql(statement).map({ String(cString: $0) }) != nil else {
            throw ShoalError(code: .invalidArgument, message: "an observed query must write nothing: \(sql.prefix(200))")
        }
        return tablesRead
    }

    /// The replicated tables written by what this store committed (its own writes, other connections' writes it
    /// captured, applied changes) since the last call, and those transactions' dots.
    public func takeCommitted() -> (tables: Set<String>, dots: Set<Dot>) {
        defer {
            committedTables = []
            committedDots = []
        }
        return (committedTables, committedDots)
    }
}
