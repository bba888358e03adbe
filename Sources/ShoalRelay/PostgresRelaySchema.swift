import Logging
import PostgresNIO
import ShoalCore

/// The PostgreSQL storage's tables, in the schema `shoal_relay`, versioned: `shoal_relay.meta` records the schema
/// version (key `schema`). The relay creates or migrates it at start under an advisory lock, so instances that start
/// together migrate once; a newer schema is refused.
enum PostgresRelaySchema {
    /// The schema version this build creates and reads.
    static let version: Int64 = 2
    /// The advisory lock held while the schema is created or migrated (any number; the relay's own).
    static let migrationLock: Int64 = 0x5348_4F41_4C52_4C59

    /// What each schema version adds, in order: version N is `migrations[N - 1]`.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE shoal_relay.tokens(hash text PRIMARY KEY, cluster text NOT NULL, label text NOT NULL,
            created bigint NOT NULL, revoked bigint, rotated bigint)
            """,
            "CREATE INDEX ON shoal_relay.tokens(cluster)",
            """
            CREATE TABLE shoal_relay.epochs(cluster text NOT NULL, epoch bigint NOT NULL, created bigint NOT NULL,
            PRIMARY KEY(cluster, epoch))
            """,
            """
            CREATE TABLE shoal_relay.upload_keys(cluster text NOT NULL, epoch bigint NOT NULL, key bytea NOT NULL,
            PRIMARY KEY(cluster, epoch))
            """,
            """
            CREATE TABLE shoal_relay.grants(cluster text NOT NULL, epoch bigint NOT NULL, recipient text NOT NULL,
            body text NOT NULL, PRIMARY KEY(cluster, epoch, recipient))
            """,
            """
            CREATE TABLE shoal_relay.heads(cluster text NOT NULL, site bytea NOT NULL, head bigint NOT NULL,
            PRIMARY KEY(cluster, site))
            """,
            """
            CREATE TABLE shoal_relay.ranges(cluster text NOT NULL, site bytea NOT NULL, from_seq bigint NOT NULL,
            to_seq bigint NOT NULL, upload bigint NOT NULL, chunks bigint NOT NULL, bytes bigint NOT NULL,
            created bigint NOT NULL, uploader text, PRIMARY KEY(cluster, site, from_seq))
            """,
            """
            CREATE TABLE shoal_relay.chunks(cluster text NOT NULL, site bytea NOT NULL, from_seq bigint NOT NULL,
            upload bigint NOT NULL, idx bigint NOT NULL, envelope bytea NOT NULL, created bigint NOT NULL,
            PRIMARY KEY(cluster, site, from_seq, upload, idx))
            """,
            // Envelopes are sealed, so already compressed as far as anything will: store them as they are.
            "ALTER TABLE shoal_relay.chunks ALTER COLUMN envelope SET STORAGE EXTERNAL",
        ],
        // Snapshots: ranges and chunks belong to the change log (snapshot 0) or to a snapshot.
        [
            "ALTER TABLE shoal_relay.ranges ADD COLUMN snapshot bigint NOT NULL DEFAULT 0",
            "ALTER TABLE shoal_relay.ranges DROP CONSTRAINT ranges_pkey",
            "ALTER TABLE shoal_relay.ranges ADD PRIMARY KEY (cluster, snapshot, site, from_seq)",
            "ALTER TABLE shoal_relay.chunks ADD COLUMN snapshot bigint NOT NULL DEFAULT 0",
            "ALTER TABLE shoal_relay.chunks DROP CONSTRAINT chunks_pkey",
            "ALTER TABLE shoal_relay.chunks ADD PRIMARY KEY (cluster, snapshot, site, from_seq, upload, idx)",
            """
            CREATE TABLE shoal_relay.snapshots(cluster text NOT NULL, snapshot bigint NOT NULL, vector text NOT NULL,
            bytes bigint NOT NULL, created bigint NOT NULL, PRIMARY KEY(cluster, snapshot))
            """,
        ],
    ]

    /// Creates the schema, or brings it to ``version``, under an advisory lock; refuses a newer one.
    static func migrate(_ connection: PostgresConnection, logger: Logger) async throws(ShoalError) {
        do {
            try await connection.withTransaction(logger: logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(\(migrationLock))", logger: logger)
                try await connection.query("CREATE SCHEMA IF NOT EXISTS shoal_relay", logger: logger)
                try await connection.query(
                    "CREATE TABLE IF NOT EXISTS shoal_relay.meta(key text PRIMARY KEY, value bigint NOT NULL)",
                    logger: logger
                )
                var stored: Int64 = 0
                for try await value in try await connection.query(
                    "SELECT value FROM shoal_relay.meta WHERE key = 'schema'",
                    logger: logger
                ).decode(Int64.self) {
                    stored = value
                }
                guard stored <= version else {
                    throw ShoalError(
                        code: .versionMismatch,
                        message: "the relay's PostgreSQL schema is version \(stored), and this build reads \(version): "
                            + "run a newer relay"
                    )
                }
                guard stored < version else { return }
                for migration in migrations[Int(max(0, stored))...] {
                    for statement in migration {
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                }
                try await connection.query(
                    """
                    INSERT INTO shoal_relay.meta(key, value) VALUES ('schema', \(version))
                    ON CONFLICT(key) DO UPDATE SET value = excluded.value
                    """,
                    logger: logger
                )
                logger.info("relay schema migrated", metadata: ["from": "\(stored)", "to": "\(version)"])
            }
        } catch {
            if let error = PostgresRelayDatabase.unwrap(error) as? ShoalError { throw error }
            throw ShoalError(
                code: .relay,
                message: "cannot create the relay's schema in PostgreSQL: \(PostgresRelayDatabase.reason(error))"
            )
        }
    }
}
