import CSQLite
import ShoalCore

/// One SQLite connection of the relay's embedded storage: opening the file, running statements, reading rows. The
/// relay's own small wrapper, so that the relay server does not depend on the node's store.
///
/// Not `Sendable`: the storage uses its one connection from one thread at a time.
final class RelaySQLiteConnection {
    /// SQLite's "transient" destructor: SQLite copies bound text and blobs before the call returns.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    private let handle: OpaquePointer
    private let path: String
    /// Prepared statements by their SQL, kept for the connection's life.
    private var statements: [String: OpaquePointer] = [:]

    /// Opens (creating when missing) the database at `path`.
    init(path: String) throws(ShoalError) {
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let code = sqlite3_open_v2(path, &handle, flags, nil)
        guard code == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let handle { sqlite3_close_v2(handle) }
            throw ShoalError(code: .sqlite, message: "cannot open the relay database \(path): \(message)")
        }
        self.handle = handle
        self.path = path
        sqlite3_extended_result_codes(handle, 1)
        sqlite3_busy_timeout(handle, 10_000)
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(handle)
    }

    private func error(_ code: Int32, _ sql: String) -> ShoalError {
        let message = String(cString: sqlite3_errmsg(handle))
        return ShoalError(
            code: .sqlite,
            message: "the relay database \(path): \(message) (SQLite error \(code))",
            sqlite: ShoalError.SQLiteFailure(extendedResultCode: sqlite3_extended_errcode(handle), statement: sql)
        )
    }

    /// Runs SQL with no parameters and no results (several statements allowed).
    func exec(_ sql: String) throws(ShoalError) {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        guard code == SQLITE_OK else { throw error(code, sql) }
    }

    /// Runs one statement with `arguments` bound to its `?1`, `?2`, … parameters and returns its rows.
    @discardableResult
    func rows(_ sql: String, _ arguments: [SQLValue] = []) throws(ShoalError) -> [[SQLValue]] {
        let statement = try prepared(sql)
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        for (index, value) in arguments.enumerated() { try bind(value, at: Int32(index + 1), of: statement, sql) }
        var rows: [[SQLValue]] = []
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return rows }
            guard code == SQLITE_ROW else { throw error(code, sql) }
            rows.append((0..<sqlite3_column_count(statement)).map { column($0, of: statement) })
        }
    }

    private func prepared(_ sql: String) throws(ShoalError) -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else { throw error(code, sql) }
        statements[sql] = statement
        return statement
    }

    private func bind(
        _ value: SQLValue,
        at position: Int32,
        of statement: OpaquePointer,
        _ sql: String
    )
        throws(ShoalError)
    {
        let code: Int32
        switch value {
        case .null: code = sqlite3_bind_null(statement, position)
        case .integer(let integer): code = sqlite3_bind_int64(statement, position, integer)
        case .real(let real): code = sqlite3_bind_double(statement, position, real)
        case .text(let text):
            var text = text
            code = text.withUTF8 { buffer in
                sqlite3_bind_text64(
                    statement,
                    position,
                    UnsafeRawPointer(buffer.baseAddress ?? UnsafePointer(bitPattern: 1)!)
                        .assumingMemoryBound(to: CChar.self),
                    sqlite3_uint64(buffer.count),
                    Self.transient,
                    UInt8(SQLITE_UTF8)
                )
            }
        case .blob(let bytes), .invalidText(let bytes):
            code = bytes.withUnsafeBytes { buffer in
                sqlite3_bind_blob64(
                    statement,
                    position,
                    buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1),
                    sqlite3_uint64(buffer.count),
                    Self.transient
                )
            }
        }
        guard code == SQLITE_OK else { throw error(code, sql) }
    }

    private func column(_ index: Int32, of statement: OpaquePointer) -> SQLValue {
        switch sqlite3_column_type(statement, index) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, index))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(statement, index))
        case SQLITE_TEXT:
            return .text(
                start: sqlite3_column_text(statement, index),
                count: Int(sqlite3_column_bytes(statement, index))
            )
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, index))
            guard count > 0, let bytes = sqlite3_column_blob(statement, index) else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: bytes, count: count)))
        default: return .null
        }
    }
}
