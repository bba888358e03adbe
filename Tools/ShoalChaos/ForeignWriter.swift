import CSQLite
import Shoal

/// A plain SQLite connection to a node's file, standing for an app that writes with its own SQLite library:
/// Shoal's code never runs on it, so its writes reach peers only if the node captures them.
final class ForeignWriter {
    private let handle: OpaquePointer

    init(path: String) throws {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK, let handle else {
            throw ChaosError("cannot open \(path) with a plain connection")
        }
        self.handle = handle
        sqlite3_busy_timeout(handle, 10_000)
    }

    deinit {
        sqlite3_close_v2(handle)
    }

    /// Runs `sql` with `arguments` bound to its `?` parameters, in a transaction of its own.
    func run(_ sql: String, _ arguments: [ChaosValue.Binding]) throws {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            throw ChaosError("foreign writer: \(String(cString: sqlite3_errmsg(handle)))")
        }
        defer { sqlite3_finalize(statement) }
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
        for (offset, argument) in arguments.enumerated() {
            let index = Int32(offset + 1)
            switch argument {
            case .integer(let value): sqlite3_bind_int64(statement, index, value)
            case .real(let value): sqlite3_bind_double(statement, index, value)
            case .null: sqlite3_bind_null(statement, index)
            case .text(let bytes):
                // Bound by byte count, so NULs and bytes that are not UTF-8 are stored as given.
                (bytes + [0]).withUnsafeBufferPointer { buffer in
                    buffer.withMemoryRebound(to: CChar.self) { text in
                        _ = sqlite3_bind_text64(
                            statement, index, text.baseAddress, sqlite3_uint64(bytes.count), transient,
                            UInt8(SQLITE_UTF8))
                    }
                }
            case .blob(let bytes):
                bytes.withUnsafeBytes { buffer in
                    _ = sqlite3_bind_blob64(
                        statement, index, buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1),
                        sqlite3_uint64(buffer.count), transient)
                }
            }
        }
        let code = sqlite3_step(statement)
        guard code == SQLITE_DONE || code == SQLITE_ROW else {
            throw ChaosError("foreign writer: \(String(cString: sqlite3_errmsg(handle))) (SQLite error \(code))")
        }
    }
}

extension ChaosValue {
    /// A value as the foreign writer binds it: text as its raw bytes.
    enum Binding {
        case null
        case integer(Int64)
        case real(Double)
        case text([UInt8])
        case blob([UInt8])
    }

    /// The value for a plain connection, which binds TEXT bytes directly (no CAST needed).
    var binding: Binding {
        switch self {
        case .text(let bytes): .text(bytes)
        case .plain(.null): .null
        case .plain(.integer(let value)): .integer(value)
        case .plain(.real(let value)): .real(value)
        case .plain(.text(let text)): .text(Array(text.utf8))
        case .plain(.invalidText(let bytes)): .text(bytes)
        case .plain(.blob(let bytes)): .blob(bytes)
        }
    }
}

struct ChaosError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
