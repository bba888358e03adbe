import CSQLite
import ShoalCore

/// SQLite's "transient" destructor: SQLite copies bound text and blobs before the call returns.
package let SQLITE_TRANSIENT = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

/// Owns one SQLite connection handle.
///
/// Not `Sendable`: a connection is used from one thread at a time, by its owner (the node's `Store`, the relay's
/// embedded storage).
package final class SQLiteConnection {
    package let handle: OpaquePointer

    package init(path: String) throws(ShoalError) {
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI
        let code = sqlite3_open_v2(path, &handle, flags, nil)
        guard code == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let handle { sqlite3_close_v2(handle) }
            let extended = handle.map { sqlite3_extended_errcode($0) } ?? code
            throw ShoalError(
                code: .sqlite,
                message: "cannot open database \(path): \(message)",
                sqlite: ShoalError.SQLiteFailure(extendedResultCode: extended)
            )
        }
        self.handle = handle
        sqlite3_extended_result_codes(handle, 1)
        sqlite3_busy_timeout(handle, 10_000)
    }

    deinit {
        if writeHolds != nil { sqlite3_wal_hook(handle, nil, nil) }
        sqlite3_close_v2(handle)
    }

    /// The error for result `code`, with SQLite's message, its extended result code and the failing `statement`.
    package func error(_ code: Int32, _ context: String? = nil, statement: String? = nil) -> ShoalError {
        let message = String(cString: sqlite3_errmsg(handle))
        let prefix = context.map { "\($0): " } ?? ""
        // The connection reports extended codes; a primary one (from a call that does not) is refined by the
        // connection's last error when that is the same failure.
        let extended = sqlite3_extended_errcode(handle)
        let failure = ShoalError.SQLiteFailure(
            extendedResultCode: extended & 0xFF == code & 0xFF ? extended : code,
            statement: statement
        )
        return ShoalError(code: .sqlite, message: "\(prefix)\(message) (SQLite error \(code))", sqlite: failure)
    }

    /// Runs SQL with no parameters and no results (several statements allowed).
    package func exec(_ sql: String) throws(ShoalError) {
        guard let writeHolds else {
            let code = sqlite3_exec(handle, sql, nil, nil, nil)
            guard code == SQLITE_OK else { throw error(code, statement: sql) }
            return
        }
        let wasWriting = sqlite3_txn_state(handle, nil) == SQLITE_TXN_WRITE
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        let isWriting = sqlite3_txn_state(handle, nil) == SQLITE_TXN_WRITE
        if !wasWriting && isWriting {
            writeHoldStarted = ContinuousClock.now
        } else if wasWriting && !isWriting, let started = writeHoldStarted {
            // The lock was released when the commit reached the write-ahead log (the WAL hook noted when), before any
            // checkpoint that commit ran: readers and writers do not wait for a checkpoint.
            let held = ((writeReleased ?? ContinuousClock.now) - started).components
            writeHolds.record(UInt64(held.seconds) * 1_000_000_000 + UInt64(held.attoseconds / 1_000_000_000))
            writeHoldStarted = nil
        }
        writeReleased = nil
        guard code == SQLITE_OK else { throw error(code, statement: sql) }
    }

    /// Where the write transactions opened and ended by ``exec(_:)`` are timed, when set. Setting it installs a WAL
    /// hook that notes when each commit released the lock and then checkpoints as `wal_autocheckpoint` does (every
    /// 1,000 pages), so that a checkpoint's time does not count as a hold.
    package var writeHolds: WriteHoldMeter? {
        didSet {
            guard writeHolds != nil, oldValue == nil else { return }
            sqlite3_wal_hook(handle, { context, database, name, pages in
                let connection = Unmanaged<SQLiteConnection>.fromOpaque(context!).takeUnretainedValue()
                connection.writeReleased = ContinuousClock.now
                if pages >= 1_000 { sqlite3_wal_checkpoint_v2(database, name, SQLITE_CHECKPOINT_PASSIVE, nil, nil) }
                return SQLITE_OK
            }, Unmanaged.passUnretained(self).toOpaque())
        }
    }
    /// When the last commit released the write lock (set by the WAL hook).
    private var writeReleased: ContinuousClock.Instant?
    /// When the write transaction open now took the lock (see ``writeHolds``).
    private var writeHoldStarted: ContinuousClock.Instant?

    package func prepare(_ sql: String) throws(ShoalError) -> SQLiteStatement {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else { throw error(code, statement: sql) }
        return SQLiteStatement(statement, connection: self)
    }

    /// Runs one query and returns all of its rows.
    @discardableResult
    package func rows(_ sql: String, _ arguments: [SQLValue] = []) throws(ShoalError) -> [[SQLValue]] {
        let statement = try prepare(sql)
        try statement.bind(arguments)
        var result: [[SQLValue]] = []
        while try statement.step() { result.append(statement.row()) }
        return result
    }

    /// Runs one query and returns the first column of its first row.
    package func scalar(_ sql: String, _ arguments: [SQLValue] = []) throws(ShoalError) -> SQLValue {
        try rows(sql, arguments).first?.first ?? .null
    }

    package var isAutocommit: Bool { sqlite3_get_autocommit(handle) != 0 }
}

/// Owns one prepared statement.
package final class SQLiteStatement {
    package let handle: OpaquePointer
    package unowned let connection: SQLiteConnection

    package init(_ handle: OpaquePointer, connection: SQLiteConnection) {
        self.handle = handle
        self.connection = connection
    }

    deinit {
        sqlite3_finalize(handle)
    }

    package var isReadOnly: Bool { sqlite3_stmt_readonly(handle) != 0 }
    package var columnCount: Int { Int(sqlite3_column_count(handle)) }
    package var parameterCount: Int { Int(sqlite3_bind_parameter_count(handle)) }
    package var sql: String { sqlite3_sql(handle).map { String(cString: $0) } ?? "" }

    package func columnName(_ index: Int) -> String {
        sqlite3_column_name(handle, Int32(index)).map { String(cString: $0) } ?? ""
    }

    package func bind(_ arguments: [SQLValue]) throws(ShoalError) {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        guard arguments.count == parameterCount else {
            throw ShoalError(
                code: .invalidArgument,
                message: "the statement takes \(parameterCount) parameters, \(arguments.count) were given"
            )
        }
        for (index, value) in arguments.enumerated() { try bind(value, at: index + 1) }
    }

    package func bind(_ value: SQLValue, at index: Int) throws(ShoalError) {
        let position = Int32(index)
        let code: Int32
        switch value {
        case .null: code = sqlite3_bind_null(handle, position)
        case .integer(let integer): code = sqlite3_bind_int64(handle, position, integer)
        case .real(let real): code = sqlite3_bind_double(handle, position, real)
        case .text(let text):
            // By byte count, never up to the first NUL.
            var text = text
            code = text.withUTF8 { buffer in bindText(UnsafeRawBufferPointer(buffer), at: position) }
        case .invalidText(let bytes):
            code = bytes.withUnsafeBytes { buffer in bindText(buffer, at: position) }
        case .blob(let bytes):
            code = bytes.withUnsafeBytes { buffer in
                sqlite3_bind_blob64(
                    handle,
                    position,
                    buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1),
                    sqlite3_uint64(buffer.count),
                    SQLITE_TRANSIENT
                )
            }
        }
        guard code == SQLITE_OK else { throw connection.error(code, statement: sql) }
    }

    /// Binds TEXT of exactly these bytes (NULs and invalid UTF-8 included; SQLite stores them as they are).
    private func bindText(_ buffer: UnsafeRawBufferPointer, at position: Int32) -> Int32 {
        sqlite3_bind_text64(
            handle,
            position,
            (buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1)!).assumingMemoryBound(to: CChar.self),
            sqlite3_uint64(buffer.count),
            SQLITE_TRANSIENT,
            UInt8(SQLITE_UTF8)
        )
    }

    package func bind(_ bytes: [UInt8], at index: Int) throws(ShoalError) {
        try bind(.blob(bytes), at: index)
    }

    /// Binds bytes without copying them: `bytes` must stay valid until the statement is rebound or its
    /// bindings are cleared.
    package func bindStatic(_ bytes: UnsafeRawBufferPointer, at index: Int) throws(ShoalError) {
        let code = sqlite3_bind_blob64(
            handle,
            Int32(index),
            bytes.baseAddress ?? UnsafeRawPointer(bitPattern: 1),
            sqlite3_uint64(bytes.count),
            nil
        )
        guard code == SQLITE_OK else { throw connection.error(code, statement: sql) }
    }

    package func clearBindings() {
        sqlite3_clear_bindings(handle)
    }

    package func bind(_ integer: Int64, at index: Int) {
        sqlite3_bind_int64(handle, Int32(index), integer)
    }

    /// Steps once: `true` when a row is available, `false` when done.
    @discardableResult
    package func step() throws(ShoalError) -> Bool {
        let code = sqlite3_step(handle)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            sqlite3_reset(handle)
            throw connection.error(code, statement: sql)
        }
    }

    /// Steps to completion and resets, for statements run for their effect.
    package func run() throws(ShoalError) {
        defer { sqlite3_reset(handle) }
        while try step() {}
    }

    package func reset() {
        sqlite3_reset(handle)
    }

    package func column(_ index: Int) -> SQLValue {
        let position = Int32(index)
        switch sqlite3_column_type(handle, position) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(handle, position))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(handle, position))
        case SQLITE_TEXT:
            let text = sqlite3_column_text(handle, position)
            return .text(start: text, count: Int(sqlite3_column_bytes(handle, position)))
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(handle, position))
            guard count > 0, let bytes = sqlite3_column_blob(handle, position) else { return .blob([]) }
            return .blob(Array(UnsafeRawBufferPointer(start: bytes, count: count)))
        default: return .null
        }
    }

    package func columnBytes(_ index: Int) -> [UInt8] {
        let position = Int32(index)
        let count = Int(sqlite3_column_bytes(handle, position))
        guard count > 0, let bytes = sqlite3_column_blob(handle, position) else { return [] }
        return Array(UnsafeRawBufferPointer(start: bytes, count: count))
    }

    package func columnInt64(_ index: Int) -> Int64 {
        sqlite3_column_int64(handle, Int32(index))
    }

    package func row() -> [SQLValue] {
        (0..<columnCount).map(column)
    }
}

/// Converts an `sqlite3_value` (from the pre-update hook) to a ``SQLValue``.
package func sqlValue(_ value: OpaquePointer?) -> SQLValue {
    guard let value else { return .null }
    switch sqlite3_value_type(value) {
    case SQLITE_INTEGER: return .integer(sqlite3_value_int64(value))
    case SQLITE_FLOAT: return .real(sqlite3_value_double(value))
    case SQLITE_TEXT:
        let text = sqlite3_value_text(value)
        return .text(start: text, count: Int(sqlite3_value_bytes(value)))
    case SQLITE_BLOB:
        let count = Int(sqlite3_value_bytes(value))
        guard count > 0, let bytes = sqlite3_value_blob(value) else { return .blob([]) }
        return .blob(Array(UnsafeRawBufferPointer(start: bytes, count: count)))
    default: return .null
    }
}

/// Quotes an SQL identifier.
package func quote(_ identifier: String) -> String {
    guard identifier.utf8.contains(UInt8(ascii: "\"")) else { return "\"" + identifier + "\"" }
    return "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
}

extension String {
    fileprivate func replacingOccurrences(of target: String, with replacement: String) -> String {
        split(separator: Character(target), omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
