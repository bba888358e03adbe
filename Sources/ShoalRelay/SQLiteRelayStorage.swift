import CSQLite
import NIOPosix
import ShoalCore
import ShoalRelayProtocol
import Synchronization

/// The relay's embedded storage: one SQLite database (`relay.sqlite` in the data directory), used from one thread
/// of its own so that no SQLite call ever blocks the server's event loops or the cooperative pool. Its rules are
/// ``RelayRules``, shared with ``PostgresRelayStorage``; this type only opens, migrates and runs statements.
///
/// Durability: WAL with `synchronous=NORMAL`: a killed relay process loses nothing it answered for; a power cut may
/// lose the last transactions, which nodes upload again (uploads are idempotent, and a node uploads whatever the
/// relay's heads lack).
public final class SQLiteRelayStorage: RulesRelayStorage {
    /// The schema version this build creates and reads (``RelaySQLiteSchema``).
    public static let schemaVersion: Int64 = RelaySQLiteSchema.version

    /// Where the database lives.
    public let path: String
    let rules: RelayRules<SQLiteRelayDatabase>

    /// Opens (creating when missing) the relay database in directory `data`, and brings its schema to this build's.
    public init(directory data: String) throws(ShoalError) {
        var isDirectory = false
        if Self.isDirectory(data, &isDirectory) {
            guard isDirectory else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "\(data) is not a directory: --data wants the relay's data directory"
                )
            }
        } else {
            guard mkdir(data, 0o700) == 0 || errno == EEXIST else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "cannot create the relay's data directory \(data): \(String(cString: strerror(errno)))"
                )
            }
        }
        path = data.hasSuffix("/") ? data + "relay.sqlite" : data + "/relay.sqlite"
        let sqlite = try RelaySQLiteConnection(path: path)
        try sqlite.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        try RelaySQLiteSchema.migrate(sqlite, path: path)
        rules = RelayRules(database: SQLiteRelayDatabase(sqlite))
    }

    private static func isDirectory(_ path: String, _ isDirectory: inout Bool) -> Bool {
        var info = stat()
        guard stat(path, &info) == 0 else { return false }
        isDirectory = (info.st_mode & S_IFMT) == S_IFDIR
        return true
    }

    /// See ``RelayStorage``: one process uses the file, and the server wakes its own pulls.
    public func watch(_ changed: @escaping @Sendable (String?) async -> Void) async {}

    /// See ``RelayStorage``.
    public func close() async {}
}

/// The embedded database as the rules use it: one connection, held by one reader or transaction at a time (an
/// awaited lock), each statement run on a thread of its own. Writes are `BEGIN IMMEDIATE` transactions; only one
/// process uses the file, so nothing needs notifying.
final class SQLiteRelayDatabase: RelayDatabase {
    private let connection: Mutex<RelaySQLiteConnection>
    private let pool: NIOThreadPool
    private let lock = RelayAsyncLock()

    init(_ connection: sending RelaySQLiteConnection) {
        self.connection = Mutex(connection)
        pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
    }

    deinit {
        pool.shutdownGracefully { _ in }
    }

    var tablePrefix: String { "" }

    /// Runs `body` with the connection on the storage's thread. A cancelled task still runs it: a transaction begun
    /// always ends, with its COMMIT or its ROLLBACK (the thread pool's `runIfActive` would skip the work).
    func run<T: Sendable>(
        _ body: @escaping @Sendable (RelaySQLiteConnection) throws(ShoalError) -> T
    )
        async throws(ShoalError) -> T
    {
        let result = await withCheckedContinuation { (done: CheckedContinuation<Result<T, ShoalError>, Never>) in
            pool.submit { state in
                guard case .active = state else {
                    done.resume(
                        returning: .failure(ShoalError(code: .relay, message: "the relay's storage is shutting down"))
                    )
                    return
                }
                done.resume(
                    returning: self.connection.withLock { connection in
                        do throws(ShoalError) {
                            return .success(try body(connection))
                        } catch {
                            return .failure(error)
                        }
                    }
                )
            }
        }
        return try result.get()
    }

    func read<T: Sendable>(
        _ what: String,
        _ body: @Sendable (Statements) async throws(ShoalError) -> T
    )
        async throws(ShoalError) -> T
    {
        await lock.lock()
        defer { lock.unlock() }
        return try await body(Statements(database: self))
    }

    func write<T: Sendable>(
        cluster: String,
        _ what: String,
        _ body: @Sendable (Statements) async throws(ShoalError) -> T
    ) async throws(ShoalError) -> T {
        await lock.lock()
        defer { lock.unlock() }
        try await run { connection throws(ShoalError) in try connection.exec("BEGIN IMMEDIATE") }
        do throws(ShoalError) {
            let result = try await body(Statements(database: self))
            try await run { connection throws(ShoalError) in try connection.exec("COMMIT") }
            return result
        } catch {
            _ = try? await run { connection throws(ShoalError) in try connection.exec("ROLLBACK") }
            throw error
        }
    }

    func notify(_ connection: Statements, cluster: String) async throws(ShoalError) {}

    /// The statements of one reader or transaction, each run on the storage's thread.
    struct Statements: RelaySQL {
        let database: SQLiteRelayDatabase

        func query(_ sql: String, _ arguments: [SQLValue]) async throws(ShoalError) -> [[SQLValue]] {
            // `$N` is a named parameter to SQLite; `?N` is its numbered one.
            let sql = sql.replacing("$", with: "?")
            return try await database.run { connection throws(ShoalError) in try connection.rows(sql, arguments) }
        }
    }
}
