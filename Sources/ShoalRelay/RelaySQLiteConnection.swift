import ShoalCore
import ShoalSQLite

/// The embedded storage's one SQLite connection (ShoalSQLite's wrapper, which the node's store shares), with each
/// statement prepared once and kept for the connection's life.
///
/// Not `Sendable`: the storage uses its one connection from one thread at a time.
final class RelaySQLiteConnection {
    private let sqlite: SQLiteConnection
    /// Prepared statements by their SQL.
    private var statements: [String: SQLiteStatement] = [:]

    /// Opens (creating when missing) the database at `path`.
    init(path: String) throws(ShoalError) {
        sqlite = try SQLiteConnection(path: path)
    }

    /// Runs SQL with no parameters and no results (several statements allowed).
    func exec(_ sql: String) throws(ShoalError) {
        try sqlite.exec(sql)
    }

    /// Runs one statement with `arguments` bound to its `?1`, `?2`, … parameters and returns its rows.
    @discardableResult
    func rows(_ sql: String, _ arguments: [SQLValue] = []) throws(ShoalError) -> [[SQLValue]] {
        let statement: SQLiteStatement
        if let prepared = statements[sql] {
            statement = prepared
        } else {
            statement = try sqlite.prepare(sql)
            statements[sql] = statement
        }
        defer {
            // What was bound (a chunk's bytes) is not kept past the statement's run.
            statement.reset()
            statement.clearBindings()
        }
        try statement.bind(arguments)
        var rows: [[SQLValue]] = []
        while try statement.step() { rows.append(statement.row()) }
        return rows
    }
}
