import Logging
import NIOCore
import NIOSSL
import PostgresNIO
import ShoalCore
import ShoalRelayProtocol

/// The relay's storage in PostgreSQL, for relays that outgrow one machine: any number of relay instances share one
/// database and serve the same clusters at once. Nothing an instance needs lives anywhere but in the database, and
/// uploads, rotations and new grants are announced to every instance with `NOTIFY`, so a pull waiting on one
/// instance wakes for an upload to another. Its rules are ``RelayRules``, shared with ``SQLiteRelayStorage``.
///
/// Its tables live in the schema `shoal_relay`, which the relay creates and migrates itself (``schemaVersion``),
/// holding an advisory lock while it does, so instances that start together migrate once. Uploads and rotations of
/// one cluster are serialised by a transaction-scoped advisory lock on the cluster; pulls take no lock.
public final class PostgresRelayStorage: RulesRelayStorage {
    /// The schema version this build creates and reads.
    public static let schemaVersion: Int64 = PostgresRelaySchema.version

    /// Where the database is.
    public let location: PostgresLocation
    private let client: PostgresClient
    private let running: Task<Void, Never>
    private let logger: Logger
    let rules: RelayRules<PostgresRelayDatabase>

    /// Connects to `location`, creates or migrates the relay's schema, and returns the storage; refused with a
    /// clear error when the server cannot be reached, refuses the login, or holds a schema newer than this build's.
    public static func open(
        _ location: PostgresLocation,
        logger: Logger
    ) async throws(ShoalError) -> PostgresRelayStorage {
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(
                configuration: try Self.connectionConfiguration(location),
                id: 0,
                logger: logger
            )
        } catch {
            throw ShoalError(
                code: .relay,
                message: "cannot connect to PostgreSQL at \(location): \(PostgresRelayDatabase.reason(error))"
            )
        }
        do {
            try await PostgresRelaySchema.migrate(connection, logger: logger)
            try? await connection.close()
        } catch {
            try? await connection.close()
            throw error
        }
        return PostgresRelayStorage(location: location, logger: logger)
    }

    private init(location: PostgresLocation, logger: Logger) {
        self.location = location
        self.logger = logger
        var configuration: PostgresClient.Configuration
        if let socket = location.socketPath {
            configuration = .init(
                unixSocketPath: socket,
                username: location.username,
                password: location.password,
                database: location.database
            )
        } else {
            let tls: PostgresClient.Configuration.TLS
            switch (location.tls, location.tlsConfiguration) {
            case (.prefer, let context?): tls = .prefer(context)
            case (_, let context?): tls = .require(context)
            case (_, nil): tls = .disable
            }
            configuration = .init(
                host: location.host,
                port: location.port,
                username: location.username,
                password: location.password,
                database: location.database,
                tls: tls
            )
        }
        configuration.options.maximumConnections = 16
        client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        running = Task { [client] in await client.run() }
        rules = RelayRules(database: PostgresRelayDatabase(client: client, logger: logger))
    }

    deinit {
        running.cancel()
    }

    /// Closes the storage's connections.
    public func close() async {
        running.cancel()
        _ = await running.value
    }

    private static func connectionConfiguration(_ location: PostgresLocation) throws -> PostgresConnection.Configuration
    {
        if let socket = location.socketPath {
            return .init(
                unixSocketPath: socket,
                username: location.username,
                password: location.password,
                database: location.database
            )
        }
        let tls: PostgresConnection.Configuration.TLS
        switch (location.tls, try location.tlsConfiguration.map { try NIOSSLContext(configuration: $0) }) {
        case (.prefer, let context?): tls = .prefer(context)
        case (_, let context?): tls = .require(context)
        case (_, nil): tls = .disable
        }
        return .init(
            host: location.host,
            port: location.port,
            username: location.username,
            password: location.password,
            database: location.database,
            tls: tls
        )
    }

    /// See ``RelayStorage``. Listens on the storage's channel until cancelled; when the listening connection is lost
    /// it reconnects with backoff, and wakes every cluster once it listens again (what was announced meanwhile was
    /// missed).
    public func watch(_ changed: @escaping @Sendable (String?) async -> Void) async {
        var backoff = Backoff(initialMilliseconds: 100, maximumMilliseconds: 5_000)
        var failing = false
        while !Task.isCancelled {
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: PostgresRelayDatabase.channel) { notifications in
                        if failing { logger.info("PostgreSQL notifications back") }
                        failing = false
                        backoff.reset()
                        await changed(nil)
                        for try await notification in notifications { await changed(notification.payload) }
                    }
                }
            } catch {
                guard !Task.isCancelled else { return }
                if !failing {
                    logger.warning(
                        "lost PostgreSQL notifications; reconnecting",
                        metadata: ["error": "\(PostgresRelayDatabase.reason(error))"]
                    )
                }
                failing = true
                try? await Task.sleep(for: .milliseconds(backoff.next()))
            }
        }
    }
}
