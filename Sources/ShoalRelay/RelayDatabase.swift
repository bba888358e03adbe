import ShoalCore

/// One connection to the relay's tables, as the storage rules (``RelayRules``) use it: parameterised SQL whose
/// parameters are written `$1`, `$2`, …, and rows as ``SQLValue``s. SQLite and PostgreSQL each give one; every
/// statement the rules run is written once, in the SQL both understand.
protocol RelaySQL {
    /// Runs one statement with `arguments` bound to its parameters and returns its rows.
    func query(_ sql: String, _ arguments: [SQLValue]) async throws(ShoalError) -> [[SQLValue]]
}

extension RelaySQL {
    /// Runs one statement for its effect.
    func execute(_ sql: String, _ arguments: [SQLValue]) async throws(ShoalError) {
        _ = try await query(sql, arguments)
    }
}

/// Where the relay's tables live, and the little in which the two databases differ besides their SQL: how a
/// connection is had, how writes of one cluster are serialised, and how other processes sharing the tables hear of
/// them.
protocol RelayDatabase: Sendable {
    /// The connection the rules run their statements through.
    associatedtype Connection: RelaySQL

    /// What every table name is prefixed with: `""`, or a schema and a dot.
    var tablePrefix: String { get }

    /// Runs `body` on one connection, outside any transaction of the rules' own (`what` names it in errors).
    func read<T: Sendable>(
        _ what: String,
        _ body: @Sendable (Connection) async throws(ShoalError) -> T
    )
        async throws(ShoalError) -> T

    /// Runs `body` in one transaction that writes `cluster`'s tables: such transactions of one cluster run one at a
    /// time, from every process sharing the tables.
    func write<T: Sendable>(
        cluster: String,
        _ what: String,
        _ body: @Sendable (Connection) async throws(ShoalError) -> T
    ) async throws(ShoalError) -> T

    /// Tells every other process sharing the tables that `cluster` changed, once the transaction commits.
    func notify(_ connection: Connection, cluster: String) async throws(ShoalError)
}

extension SQLValue {
    /// The integer the column holds (0 for NULL).
    var relayInteger: Int64 {
        switch self {
        case .integer(let value): value
        case .real(let value): Int64(exactly: value.rounded()) ?? 0
        default: 0
        }
    }

    /// The integer the column holds, nil for NULL.
    var relayOptionalInteger: Int64? {
        if case .null = self { return nil }
        return relayInteger
    }

    /// The text the column holds ("" for NULL).
    var relayText: String {
        switch self {
        case .text(let text): text
        case .invalidText(let bytes), .blob(let bytes): String(decoding: bytes, as: UTF8.self)
        default: ""
        }
    }

    /// The text the column holds, nil for NULL.
    var relayOptionalText: String? {
        if case .null = self { return nil }
        return relayText
    }

    /// The bytes the column holds (empty for NULL).
    var relayBytes: [UInt8] {
        switch self {
        case .blob(let bytes), .invalidText(let bytes): bytes
        case .text(let text): Array(text.utf8)
        default: []
        }
    }

    /// A sequence number or another unsigned 64-bit value, stored as its bit pattern.
    static func unsigned(_ value: UInt64) -> SQLValue { .integer(Int64(bitPattern: value)) }
}
