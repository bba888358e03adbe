import Logging
import NIOCore
import PostgresNIO
import ShoalCore

/// The PostgreSQL database as the rules use it: a pooled connection per read, a transaction per write holding a
/// transaction-scoped advisory lock on the cluster (uploads, rotations and grants of one cluster run one at a time,
/// from any instance), and `NOTIFY` on ``channel`` to tell the other instances.
struct PostgresRelayDatabase: RelayDatabase {
    /// The channel uploads, rotations and grants are announced on; the payload is the cluster.
    static let channel = "shoal_relay"

    let client: PostgresClient
    let logger: Logger

    var tablePrefix: String { "shoal_relay." }

    func read<T: Sendable>(
        _ what: String,
        _ body: @Sendable (Statements) async throws(ShoalError) -> T
    )
        async throws(ShoalError) -> T
    {
        let logger = logger
        return try await attempt(what) {
            try await client.withConnection { connection in
                try await body(Statements(connection: connection, what: what, logger: logger))
            }
        }
    }

    func write<T: Sendable>(
        cluster: String,
        _ what: String,
        _ body: @Sendable (Statements) async throws(ShoalError) -> T
    ) async throws(ShoalError) -> T {
        let logger = logger
        return try await attempt(what) {
            try await client.withTransaction(logger: logger) { connection in
                try await connection.query(
                    "SELECT pg_advisory_xact_lock(hashtextextended(\(cluster), 7))",
                    logger: logger
                )
                return try await body(Statements(connection: connection, what: what, logger: logger))
            }
        }
    }

    func notify(_ connection: Statements, cluster: String) async throws(ShoalError) {
        try await connection.execute("SELECT pg_notify($1, $2)", [.text(Self.channel), .text(cluster)])
    }

    /// Runs `body`, turning what PostgreSQL or the connection pool threw into a ``ShoalError`` that says what failed.
    private func attempt<T>(_ what: String, _ body: () async throws -> T) async throws(ShoalError) -> T {
        do {
            return try await body()
        } catch {
            if let error = Self.unwrap(error) as? ShoalError { throw error }
            throw ShoalError(code: .relay, message: "PostgreSQL failed to \(what): \(Self.reason(error))")
        }
    }

    static func unwrap(_ error: any Error) -> any Error {
        if let transaction = error as? PostgresTransactionError {
            return transaction.closureError ?? transaction.beginError ?? transaction.commitError ?? error
        }
        return error
    }

    /// What went wrong, in PostgreSQL's words where it said any (never the query's bound values).
    static func reason(_ error: any Error) -> String {
        let error = unwrap(error)
        if let shoal = error as? ShoalError { return shoal.message }
        if let psql = error as? PSQLError {
            if let message = psql.serverInfo?[.message] {
                return message + (psql.serverInfo?[.sqlState].map { " (SQLSTATE \($0))" } ?? "")
            }
            if let underlying = psql.underlying { return "\(underlying)" }
            return "\(psql.code)"
        }
        return "\(error)"
    }

    /// The statements of one connection (or transaction).
    struct Statements: RelaySQL {
        let connection: PostgresConnection
        /// What the statements are for, named in their errors.
        let what: String
        let logger: Logger

        func query(_ sql: String, _ arguments: [SQLValue]) async throws(ShoalError) -> [[SQLValue]] {
            var bindings = PostgresBindings(capacity: arguments.count)
            for argument in arguments {
                switch argument {
                case .null: bindings.appendNull()
                case .integer(let value): bindings.append(value)
                case .real(let value): bindings.append(value)
                case .text(let value): bindings.append(value)
                case .blob(let bytes), .invalidText(let bytes): bindings.append(ByteBuffer(bytes: bytes))
                }
            }
            do {
                var rows: [[SQLValue]] = []
                for try await row in try await connection.query(
                    PostgresQuery(unsafeSQL: sql, binds: bindings),
                    logger: logger
                ) {
                    rows.append(try row.map(Self.value))
                }
                return rows
            } catch {
                throw ShoalError(
                    code: .relay,
                    message: "PostgreSQL failed to \(what): \(PostgresRelayDatabase.reason(error))"
                )
            }
        }

        /// A cell as a ``SQLValue``: integers, text and bytes (the only types the relay's tables hold).
        private static func value(_ cell: PostgresCell) throws -> SQLValue {
            guard cell.bytes != nil else { return .null }
            switch cell.dataType {
            case .int8, .int4, .int2: return .integer(try cell.decode(Int64.self))
            case .bool: return .integer(try cell.decode(Bool.self) ? 1 : 0)
            case .bytea: return .blob(Array(try cell.decode(ByteBuffer.self).readableBytesView))
            case .float4, .float8: return .real(try cell.decode(Double.self))
            default: return .text(try cell.decode(String.self))
            }
        }
    }
}
