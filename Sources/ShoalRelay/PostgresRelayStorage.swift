import Logging
import NIOCore
import NIOSSL
import PostgresNIO
import ShoalCore
import ShoalRelayProtocol

/// The relay's storage in PostgreSQL, for relays that outgrow one machine: any number of relay instances share one
/// database and serve the same clusters at once. Nothing an instance needs lives anywhere but in the database, and
/// uploads, rotations and new grants are announced to every instance with `NOTIFY`, so a pull waiting on one
/// instance wakes for an upload to another.
///
/// Its tables live in the schema `shoal_relay`, which the relay creates and migrates itself (``schemaVersion``),
/// holding an advisory lock while it does, so instances that start together migrate once. Uploads and rotations of
/// one cluster are serialised by a transaction-scoped advisory lock on the cluster; pulls take no lock.
public final class PostgresRelayStorage: RelayStorage {
    /// The schema version this build creates and reads.
    public static let schemaVersion: Int64 = 2
    /// The channel uploads, rotations and grants are announced on; the payload is the cluster.
    static let channel = "shoal_relay"
    /// The advisory lock held while the schema is created or migrated (any number; the relay's own).
    static let migrationLock: Int64 = 0x5348_4F41_4C52_4C59

    /// Where the database is.
    public let location: PostgresLocation
    private let client: PostgresClient
    private let running: Task<Void, Never>
    private let logger: Logger

    /// Connects to `location`, creates or migrates the relay's schema, and returns the storage; refused with a
    /// clear error when the server cannot be reached, refuses the login, or holds a schema newer than this build's.
    public static func open(_ location: PostgresLocation, logger: Logger) async throws(ShoalError) -> PostgresRelayStorage {
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(
                configuration: try Self.connectionConfiguration(location),
                id: 0,
                logger: logger
            )
        } catch {
            throw ShoalError(code: .relay, message: "cannot connect to PostgreSQL at \(location): \(Self.reason(error))")
        }
        do {
            try await migrate(connection, logger: logger)
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
            configuration = .init(unixSocketPath: socket, username: location.username, password: location.password, database: location.database)
        } else {
            let tls: PostgresClient.Configuration.TLS
            switch (location.tls, location.tlsConfiguration) {
            case (.prefer, let context?): tls = .prefer(context)
            case (_, let context?): tls = .require(context)
            case (_, nil): tls = .disable
            }
            configuration = .init(
                host: location.host, port: location.port, username: location.username, password: location.password,
                database: location.database, tls: tls
            )
        }
        configuration.options.maximumConnections = 16
        client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        running = Task { [client] in await client.run() }
    }

    deinit {
        running.cancel()
    }

    /// Closes the storage's connections.
    public func close() async {
        running.cancel()
        _ = await running.value
    }

    private static func connectionConfiguration(_ location: PostgresLocation) throws -> PostgresConnection.Configuration {
        if let socket = location.socketPath {
            return .init(unixSocketPath: socket, username: location.username, password: location.password, database: location.database)
        }
        let tls: PostgresConnection.Configuration.TLS
        switch (location.tls, try location.tlsConfiguration.map { try NIOSSLContext(configuration: $0) }) {
        case (.prefer, let context?): tls = .prefer(context)
        case (_, let context?): tls = .require(context)
        case (_, nil): tls = .disable
        }
        return .init(host: location.host, port: location.port, username: location.username, password: location.password, database: location.database, tls: tls)
    }

    // MARK: Schema

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

    /// Creates the schema, or brings it to ``schemaVersion``, under an advisory lock; refuses a newer one.
    private static func migrate(_ connection: PostgresConnection, logger: Logger) async throws(ShoalError) {
        do {
            try await connection.withTransaction(logger: logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(\(migrationLock))", logger: logger)
                try await connection.query("CREATE SCHEMA IF NOT EXISTS shoal_relay", logger: logger)
                try await connection.query(
                    "CREATE TABLE IF NOT EXISTS shoal_relay.meta(key text PRIMARY KEY, value bigint NOT NULL)",
                    logger: logger
                )
                var version: Int64 = 0
                for try await stored in try await connection.query(
                    "SELECT value FROM shoal_relay.meta WHERE key = 'schema'",
                    logger: logger
                ).decode(Int64.self) {
                    version = stored
                }
                guard version <= schemaVersion else {
                    throw ShoalError(
                        code: .versionMismatch,
                        message: """
 the relay's PostgreSQL schema is version \(version), and this build reads \(schemaVersion):
 run a newer relay
 """
                    )
                }
                guard version < schemaVersion else { return }
                for migration in migrations[Int(version)...] {
                    for statement in migration {
                        try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                    }
                }
                try await connection.query(
                    """
                    INSERT INTO shoal_relay.meta(key, value) VALUES ('schema', \(schemaVersion))
                    ON CONFLICT(key) DO UPDATE SET value = excluded.value
                    """,
                    logger: logger
                )
                logger.info("relay schema migrated", metadata: ["from": "\(version)", "to": "\(schemaVersion)"])
            }
        } catch {
            if let error = Self.unwrap(error) as? ShoalError { throw error }
            throw ShoalError(code: .relay, message: "cannot create the relay's schema in PostgreSQL: \(Self.reason(error))")
        }
    }

    // MARK: Helpers

    /// Runs `body`, turning what PostgreSQL or the connection pool threw into a ``ShoalError`` that says what failed.
    private func attempt<T>(_ what: String, _ body: () async throws -> T) async throws(ShoalError) -> T {
        do {
            return try await body()
        } catch {
            if let error = Self.unwrap(error) as? ShoalError { throw error }
            throw ShoalError(code: .relay, message: "PostgreSQL failed to \(what): \(Self.reason(error))")
        }
    }

    /// Runs `body` in a transaction holding the cluster's advisory lock: uploads and rotations of one cluster, from
    /// any instance, run one at a time.
    private func locked<T: Sendable>(
        _ cluster: String,
        _ what: String,
        _ body: @Sendable (PostgresConnection) async throws -> T
    ) async throws(ShoalError) -> T {
        try await attempt(what) {
            try await client.withTransaction(logger: logger) { connection in
                try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended(\(cluster), 7))", logger: logger)
                return try await body(connection)
            }
        }
    }

    private static func unwrap(_ error: any Error) -> any Error {
        if let transaction = error as? PostgresTransactionError {
            return transaction.closureError ?? transaction.beginError ?? transaction.commitError ?? error
        }
        return error
    }

    /// What went wrong, in PostgreSQL's words where it said any (never the query's bound values).
    static func reason(_ error: any Error) -> String {
        let error = unwrap(error)
        if let psql = error as? PSQLError {
            if let message = psql.serverInfo?[.message] {
                return message + (psql.serverInfo?[.sqlState].map { " (SQLSTATE \($0))" } ?? "")
            }
            if let underlying = psql.underlying { return "\(underlying)" }
            return "\(psql.code)"
        }
        return "\(error)"
    }

    private static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }

    private static func bytes(_ buffer: ByteBuffer) -> [UInt8] { Array(buffer.readableBytesView) }

    private static func heads(_ connection: PostgresConnection, cluster: String, logger: Logger) async throws -> VersionVector {
        var vector = VersionVector()
        let rows = try await connection.query(
            "SELECT site, head FROM shoal_relay.heads WHERE cluster = \(cluster)",
            logger: logger
        )
        for try await (site, head) in rows.decode((ByteBuffer, Int64).self) {
            if let site = SiteID(bytes: bytes(site)) { vector.advance(site, to: UInt64(bitPattern: head)) }
        }
        return vector
    }

    private static func currentEpoch(_ connection: PostgresConnection, cluster: String, logger: Logger) async throws -> UInt32 {
        var epoch: Int64 = 0
        let rows = try await connection.query(
            "SELECT coalesce(max(epoch), 0) FROM shoal_relay.epochs WHERE cluster = \(cluster)",
            logger: logger
        )
        for try await value in rows.decode(Int64.self) { epoch = value }
        return UInt32(truncatingIfNeeded: epoch)
    }

    private static func notify(_ connection: PostgresConnection, cluster: String, logger: Logger) async throws {
        try await connection.query("SELECT pg_notify(\(channel), \(cluster))", logger: logger)
    }

    // MARK: Tokens

    /// See ``RelayStorage``.
    public func createToken(cluster: String, label: String) async throws(ShoalError) -> String {
        let token = RelayTokens.make()
        let hash = RelayTokens.hash(token)
        try await attempt("store a token") {
            try await client.query(
                "INSERT INTO shoal_relay.tokens(hash, cluster, label, created) VALUES (\(hash), \(cluster), \(label), \(Self.now()))",
                logger: logger
            )
        }
        return token
    }

    /// See ``RelayStorage``.
    public func revokeTokens(matching token: String, wholeCluster: Bool) async throws(ShoalError) -> Int {
        let now = Self.now()
        let hash = RelayTokens.hash(token)
        return try await attempt("revoke tokens") {
            let rows =
                wholeCluster
                ? try await client.query(
                    "UPDATE shoal_relay.tokens SET revoked = \(now) WHERE cluster = \(token) AND revoked IS NULL RETURNING 1",
                    logger: logger
                )
                : try await client.query(
                    """
                    UPDATE shoal_relay.tokens SET revoked = \(now) WHERE (hash = \(hash) OR hash = \(token))
                    AND revoked IS NULL RETURNING 1
                    """,
                    logger: logger
                )
            var count = 0
            for try await _ in rows { count += 1 }
            return count
        }
    }

    private static func tokens(_ rows: PostgresRowSequence) async throws -> [RelayToken] {
        var tokens: [RelayToken] = []
        for try await (hash, cluster, label, created, revoked, rotated) in rows.decode(
            (String, String, String, Int64, Int64?, Int64?).self
        ) {
            tokens.append(
                RelayToken(
                    hash: hash,
                    cluster: cluster,
                    label: label,
                    created: created,
                    revoked: revoked,
                    rotatedAtEpoch: rotated.map { UInt32(truncatingIfNeeded: $0) }
                )
            )
        }
        return tokens
    }

    /// See ``RelayStorage``.
    public func tokens() async throws(ShoalError) -> [RelayToken] {
        try await attempt("list tokens") {
            try await Self.tokens(
                try await client.query(
                    "SELECT hash, cluster, label, created, revoked, rotated FROM shoal_relay.tokens ORDER BY created",
                    logger: logger
                )
            )
        }
    }

    /// See ``RelayStorage``.
    public func token(hash: String) async throws(ShoalError) -> RelayToken? {
        try await attempt("look a token up") {
            try await Self.tokens(
                try await client.query(
                    "SELECT hash, cluster, label, created, revoked, rotated FROM shoal_relay.tokens WHERE hash = \(hash)",
                    logger: logger
                )
            ).first
        }
    }

    // MARK: Change sets

    /// See ``RelayStorage``.
    public func heads(cluster: String) async throws(ShoalError) -> VersionVector {
        try await attempt("read heads") {
            try await client.withConnection { connection in
                try await Self.heads(connection, cluster: cluster, logger: logger)
            }
        }
    }

    /// The head per site of the change log (`snapshot` 0) or of a snapshot: where its chain of ranges ends.
    private static func heads(
        _ connection: PostgresConnection,
        cluster: String,
        snapshot: Int64,
        logger: Logger
    ) async throws -> VersionVector {
        guard snapshot != 0 else { return try await heads(connection, cluster: cluster, logger: logger) }
        var vector = VersionVector()
        let rows = try await connection.query(
            "SELECT site, max(to_seq) FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot = \(snapshot) GROUP BY site",
            logger: logger
        )
        for try await (site, head) in rows.decode((ByteBuffer, Int64).self) {
            if let site = SiteID(bytes: bytes(site)) { vector.advance(site, to: UInt64(bitPattern: head)) }
        }
        return vector
    }

    /// See ``RelayStorage``.
    public func store(
        cluster: String,
        snapshot: UInt64,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult {
        let logger = logger
        let snapshot = Int64(bitPattern: snapshot)
        let items = envelopes.map { (envelope: $0.envelope, encoded: $0.encoded) }
        return try await locked(cluster, "store change sets") { connection in
            var heads = try await Self.heads(connection, cluster: cluster, snapshot: snapshot, logger: logger)
            var result = RelayUploadResult(stored: 0, alreadyHeld: 0, gaps: 0, heads: [:])
            let now = Self.now()
            for (envelope, encoded) in items {
                let head = heads[envelope.site]
                if envelope.from < head {
                    result.alreadyHeld += 1
                    continue
                }
                if envelope.from > head {
                    result.gaps += 1
                    continue
                }
                let site = ByteBuffer(bytes: envelope.site.bytes)
                let from = Int64(bitPattern: envelope.from)
                let upload = Int64(bitPattern: envelope.upload)
                let index = Int64(envelope.index)
                var inserted = 0
                for try await _ in try await connection.query(
                    """
                    INSERT INTO shoal_relay.chunks(cluster, snapshot, site, from_seq, upload, idx, envelope, created) VALUES
                    (\(cluster), \(snapshot), \(site), \(from), \(upload), \(index), \(ByteBuffer(bytes: encoded)), \(now))
                    ON CONFLICT DO NOTHING RETURNING 1
                    """,
                    logger: logger
                ) { inserted += 1 }
                if inserted == 1 { result.stored += 1 } else { result.alreadyHeld += 1 }
                guard envelope.endsRange else { continue }
                var present: Int64 = 0
                var bytes: Int64 = 0
                for try await (count, total) in try await connection.query(
                    """
                    SELECT count(*), coalesce(sum(length(envelope)), 0)::bigint FROM shoal_relay.chunks
                    WHERE cluster = \(cluster) AND snapshot = \(snapshot) AND site = \(site) AND from_seq = \(from)
                    AND upload = \(upload) AND idx <= \(index)
                    """,
                    logger: logger
                ).decode((Int64, Int64).self) {
                    present = count
                    bytes = total
                }
                guard present == index + 1 else {
                    // An earlier chunk of this upload never arrived: the uploader sends the range again.
                    result.gaps += 1
                    continue
                }
                try await connection.query(
                    """
                    INSERT INTO shoal_relay.ranges(cluster, snapshot, site, from_seq, to_seq, upload, chunks, bytes, created,
                    uploader) VALUES (\(cluster), \(snapshot), \(site), \(from), \(Int64(bitPattern: envelope.to)),
                    \(upload), \(index + 1), \(bytes), \(now), \(uploader))
                    """,
                    logger: logger
                )
                // Chunks of other uploads of the same range (an uploader that gave up, or lost a race) go.
                try await connection.query(
                    """
                    DELETE FROM shoal_relay.chunks WHERE cluster = \(cluster) AND snapshot = \(snapshot) AND site = \(site)
                    AND from_seq = \(from) AND upload != \(upload)
                    """,
                    logger: logger
                )
                if snapshot == 0 {
                    try await connection.query(
                        """
                        INSERT INTO shoal_relay.heads(cluster, site, head) VALUES (\(cluster), \(site),
                        \(Int64(bitPattern: envelope.to))) ON CONFLICT(cluster, site) DO UPDATE SET head = excluded.head
                        """,
                        logger: logger
                    )
                }
                heads.advance(envelope.site, to: envelope.to)
            }
            if result.stored > 0 && snapshot == 0 { try await Self.notify(connection, cluster: cluster, logger: logger) }
            result.heads = RelayAPI.json(heads)
            return result
        }
    }

    /// See ``RelayStorage``.
    public func page(
        cluster: String,
        vector: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        maximumBytes: Int,
        uploader: String?
    ) async throws(ShoalError) -> RelayPage {
        let logger = logger
        return try await attempt("read change sets") {
            try await client.withConnection { connection in
                let heads = try await Self.heads(connection, cluster: cluster, logger: logger)
                let snapshot = try await Self.snapshot(connection, cluster: cluster, logger: logger)
                var page = RelayPage(envelopes: [], more: false)
                var bytes = 0
                /// Adds the ranges of `site` in `source` (0: the change log) that end after `after`; false once the
                /// page is full.
                func add(_ source: Int64, _ site: SiteID, after: UInt64) async throws -> Bool {
                    let siteValue = ByteBuffer(bytes: site.bytes)
                    let after = Int64(bitPattern: min(after, UInt64(Int64.max)))
                    var ranges: [(from: Int64, upload: Int64)] = []
                    for try await (from, upload, own) in try await connection.query(
                        """
                        SELECT from_seq, upload, uploader IS NOT DISTINCT FROM \(uploader) FROM shoal_relay.ranges
                        WHERE cluster = \(cluster) AND snapshot = \(source) AND site = \(siteValue) AND to_seq > \(after)
                        ORDER BY from_seq
                        """,
                        logger: logger
                    ).decode((Int64, Int64, Bool).self) {
                        // What the asking process uploaded itself it holds: left out.
                        if uploader != nil, own { continue }
                        ranges.append((from, upload))
                    }
                    for range in ranges {
                        var index: Int64 = 0
                        if let point = resume[site], point.from == UInt64(bitPattern: range.from) { index = Int64(point.index) }
                        // One chunk at a time: a page stops at its budget without reading what it would not send.
                        while true {
                            if bytes > 0 && bytes >= maximumBytes {
                                page.more = true
                                return false
                            }
                            var envelope: [UInt8]?
                            for try await value in try await connection.query(
                                """
                                SELECT envelope FROM shoal_relay.chunks WHERE cluster = \(cluster) AND snapshot = \(source)
                                AND site = \(siteValue) AND from_seq = \(range.from) AND upload = \(range.upload)
                                AND idx = \(index)
                                """,
                                logger: logger
                            ).decode(ByteBuffer.self) {
                                envelope = Self.bytes(value)
                            }
                            guard let envelope else { break }
                            bytes += envelope.count
                            page.envelopes.append(envelope)
                            index += 1
                        }
                    }
                    return true
                }
                for (site, head) in heads.sorted where head > vector[site] {
                    var after = vector[site]
                    // The change log no longer holds what this node lacks of the site (the retention dropped it):
                    // the snapshot's ranges of the site first, then the log's after what the snapshot covers.
                    var held = head
                    for try await from in try await connection.query(
                        """
                        SELECT min(from_seq) FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot = 0
                        AND site = \(ByteBuffer(bytes: site.bytes)) AND to_seq > \(Int64(bitPattern: min(after, UInt64(Int64.max))))
                        """,
                        logger: logger
                    ).decode(Int64?.self) {
                        if let from { held = UInt64(bitPattern: from) }
                    }
                    if after < held, let snapshot, snapshot.vector[site] > after {
                        guard try await add(Int64(bitPattern: snapshot.id), site, after: after) else { return page }
                        after = snapshot.vector[site]
                    }
                    guard try await add(0, site, after: after) else { return page }
                }
                return page
            }
        }
    }

    private static func snapshot(_ connection: PostgresConnection, cluster: String, logger: Logger) async throws -> RelaySnapshot? {
        var snapshot: RelaySnapshot?
        for try await (id, vector, bytes, created) in try await connection.query(
            """
            SELECT snapshot, vector, bytes, created FROM shoal_relay.snapshots WHERE cluster = \(cluster)
            ORDER BY created DESC LIMIT 1
            """,
            logger: logger
        ).decode((Int64, String, Int64, Int64).self) {
            snapshot = RelaySnapshot(
                id: UInt64(bitPattern: id),
                vector: RelaySnapshotVector.decode(vector),
                bytes: bytes,
                created: created
            )
        }
        return snapshot
    }

    /// See ``RelayStorage``.
    public func completeSnapshot(cluster: String, snapshot: UInt64, vector: VersionVector, retention: RelayRetention)
        async throws(ShoalError) -> RelaySnapshotOutcome
    {
        let logger = logger
        let id = Int64(bitPattern: snapshot)
        return try await locked(cluster, "complete a snapshot") { connection in
            let heads = try await Self.heads(connection, cluster: cluster, snapshot: id, logger: logger)
            if let missing = RelaySnapshotVector.mismatch(heads: heads, vector: vector) {
                return RelaySnapshotOutcome.incomplete(missing)
            }
            var bytes: Int64 = 0
            for try await total in try await connection.query(
                "SELECT coalesce(sum(bytes), 0)::bigint FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot = \(id)",
                logger: logger
            ).decode(Int64.self) { bytes = total }
            let now = Self.now()
            try await connection.query(
                """
                INSERT INTO shoal_relay.snapshots(cluster, snapshot, vector, bytes, created) VALUES (\(cluster), \(id),
                \(RelaySnapshotVector.encode(vector)), \(bytes), \(now)) ON CONFLICT(cluster, snapshot) DO UPDATE
                SET vector = excluded.vector, bytes = excluded.bytes, created = excluded.created
                """,
                logger: logger
            )
            // The snapshots before it go: complete ones, and those still under way that started earlier.
            try await connection.query(
                """
                DELETE FROM shoal_relay.chunks WHERE cluster = \(cluster) AND snapshot != 0 AND snapshot != \(id)
                AND created <= \(now)
                """,
                logger: logger
            )
            try await connection.query(
                """
                DELETE FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot != 0 AND snapshot != \(id)
                AND created <= \(now)
                """,
                logger: logger
            )
            try await connection.query(
                "DELETE FROM shoal_relay.snapshots WHERE cluster = \(cluster) AND snapshot != \(id)",
                logger: logger
            )
            return RelaySnapshotOutcome.completed(
                dropped: try await Self.retain(connection, cluster: cluster, retention, logger: logger)
            )
        }
    }

    /// Drops the ranges of `cluster`'s change log that its snapshot covers and `retention` lets go (oldest first:
    /// per site a prefix of its chain, so what is kept still runs on from the snapshot); returns how many went.
    private static func retain(
        _ connection: PostgresConnection,
        cluster: String,
        _ retention: RelayRetention,
        logger: Logger
    ) async throws -> Int {
        guard let snapshot = try await snapshot(connection, cluster: cluster, logger: logger) else { return 0 }
        var ranges: [RetainedRange] = []
        for try await (site, from, upload, to, bytes, created) in try await connection.query(
            """
            SELECT site, from_seq, upload, to_seq, bytes, created FROM shoal_relay.ranges WHERE cluster = \(cluster)
            AND snapshot = 0 ORDER BY created DESC, site, from_seq DESC
            """,
            logger: logger
        ).decode((ByteBuffer, Int64, Int64, Int64, Int64, Int64).self) {
            guard let site = SiteID(bytes: Self.bytes(site)) else { continue }
            ranges.append(
                RetainedRange(site: site, from: from, upload: upload, to: UInt64(bitPattern: to), bytes: bytes, created: created)
            )
        }
        let drops = retention.drops(ranges, snapshot: snapshot.vector, now: now())
        for range in drops {
            let site = ByteBuffer(bytes: range.site.bytes)
            try await connection.query(
                """
                DELETE FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot = 0 AND site = \(site)
                AND from_seq = \(range.from)
                """,
                logger: logger
            )
            try await connection.query(
                """
                DELETE FROM shoal_relay.chunks WHERE cluster = \(cluster) AND snapshot = 0 AND site = \(site)
                AND from_seq = \(range.from) AND upload = \(range.upload)
                """,
                logger: logger
            )
        }
        return drops.count
    }

    /// See ``RelayStorage``.
    public func snapshotState(cluster: String) async throws(ShoalError) -> (snapshot: RelaySnapshot?, uncoveredBytes: Int64) {
        let logger = logger
        return try await attempt("read the snapshot") {
            try await client.withConnection { connection in
                let snapshot = try await Self.snapshot(connection, cluster: cluster, logger: logger)
                var uncovered: Int64 = 0
                for try await (site, to, bytes) in try await connection.query(
                    "SELECT site, to_seq, bytes FROM shoal_relay.ranges WHERE cluster = \(cluster) AND snapshot = 0",
                    logger: logger
                ).decode((ByteBuffer, Int64, Int64).self) {
                    guard let site = SiteID(bytes: Self.bytes(site)) else { continue }
                    if UInt64(bitPattern: to) > snapshot?.vector[site] ?? 0 { uncovered += bytes }
                }
                return (snapshot, uncovered)
            }
        }
    }

    /// See ``RelayStorage``.
    public func retain(_ retention: RelayRetention) async throws(ShoalError) -> Int {
        let logger = logger
        var clusters: [String] = []
        try await attempt("list clusters") {
            for try await cluster in try await client.query("SELECT DISTINCT cluster FROM shoal_relay.snapshots", logger: logger)
                .decode(String.self)
            {
                clusters.append(cluster)
            }
        }
        var dropped = 0
        for cluster in clusters {
            dropped += try await locked(cluster, "drop covered change sets") { connection in
                try await Self.retain(connection, cluster: cluster, retention, logger: logger)
            }
        }
        return dropped
    }

    /// See ``RelayStorage``.
    public func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int {
        try await attempt("sweep incomplete uploads") {
            // Chunks of ranges never completed, and the ranges of snapshots never completed.
            var count = 0
            for try await _ in try await client.query(
                """
                DELETE FROM shoal_relay.chunks c WHERE c.created < \(milliseconds) AND (NOT EXISTS (
                    SELECT 1 FROM shoal_relay.ranges r WHERE r.cluster = c.cluster AND r.snapshot = c.snapshot
                        AND r.site = c.site AND r.from_seq = c.from_seq AND r.upload = c.upload)
                    OR (c.snapshot != 0 AND NOT EXISTS (
                        SELECT 1 FROM shoal_relay.snapshots s WHERE s.cluster = c.cluster AND s.snapshot = c.snapshot)))
                RETURNING 1
                """,
                logger: logger
            ) { count += 1 }
            try await client.query(
                """
                DELETE FROM shoal_relay.ranges r WHERE r.snapshot != 0 AND r.created < \(milliseconds) AND NOT EXISTS (
                    SELECT 1 FROM shoal_relay.snapshots s WHERE s.cluster = r.cluster AND s.snapshot = r.snapshot)
                """,
                logger: logger
            )
            return count
        }
    }

    // MARK: Key epochs

    /// See ``RelayStorage``.
    public func rotate(cluster: String, epoch: UInt32, tokenHash: String, grants: [RelayGrant], uploadKey: [UInt8]?)
        async throws(ShoalError) -> RelayRotationOutcome
    {
        let logger = logger
        return try await locked(cluster, "rotate the key epoch") { connection in
            let current = try await Self.currentEpoch(connection, cluster: cluster, logger: logger)
            guard epoch == current + 1 else { return RelayRotationOutcome.taken(current: current) }
            let now = Self.now()
            let label = "key epoch \(epoch)"
            try await connection.query(
                "INSERT INTO shoal_relay.epochs(cluster, epoch, created) VALUES (\(cluster), \(Int64(epoch)), \(now))",
                logger: logger
            )
            _ = try await Self.insertGrants(connection, cluster: cluster, grants.filter { $0.epoch == epoch }, logger: logger)
            if let uploadKey {
                try await connection.query(
                    """
                    INSERT INTO shoal_relay.upload_keys(cluster, epoch, key) VALUES (\(cluster), \(Int64(epoch)),
                    \(ByteBuffer(bytes: uploadKey))) ON CONFLICT(cluster, epoch) DO UPDATE SET key = excluded.key
                    """,
                    logger: logger
                )
            }
            try await connection.query(
                """
                UPDATE shoal_relay.tokens SET revoked = \(now), rotated = \(Int64(epoch)) WHERE cluster = \(cluster)
                AND revoked IS NULL
                """,
                logger: logger
            )
            try await connection.query(
                """
                INSERT INTO shoal_relay.tokens(hash, cluster, label, created) VALUES (\(tokenHash), \(cluster),
                \(label), \(now)) ON CONFLICT(hash) DO UPDATE SET cluster = excluded.cluster,
                label = excluded.label, created = excluded.created, revoked = NULL, rotated = NULL
                """,
                logger: logger
            )
            try await Self.notify(connection, cluster: cluster, logger: logger)
            return RelayRotationOutcome.rotated
        }
    }

    /// See ``RelayStorage``.
    public func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> (key: [UInt8]?, newest: UInt32) {
        let logger = logger
        return try await attempt("read an upload key") {
            try await client.withConnection { connection in
                var key: [UInt8]?
                for try await value in try await connection.query(
                    "SELECT key FROM shoal_relay.upload_keys WHERE cluster = \(cluster) AND epoch = \(Int64(epoch))",
                    logger: logger
                ).decode(ByteBuffer.self) {
                    key = Self.bytes(value)
                }
                return (key, try await Self.currentEpoch(connection, cluster: cluster, logger: logger))
            }
        }
    }

    /// See ``RelayStorage``.
    public func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool {
        try await attempt("register an upload key") {
            try await client.query(
                """
                INSERT INTO shoal_relay.upload_keys(cluster, epoch, key) VALUES (\(cluster), \(Int64(epoch)),
                \(ByteBuffer(bytes: key))) ON CONFLICT DO NOTHING
                """,
                logger: logger
            )
            var held: [UInt8]?
            for try await value in try await client.query(
                "SELECT key FROM shoal_relay.upload_keys WHERE cluster = \(cluster) AND epoch = \(Int64(epoch))",
                logger: logger
            ).decode(ByteBuffer.self) {
                held = Self.bytes(value)
            }
            return held == key
        }
    }

    /// See ``RelayStorage``.
    public func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int {
        let logger = logger
        return try await locked(cluster, "store key grants") { connection in
            let current = try await Self.currentEpoch(connection, cluster: cluster, logger: logger)
            let stored = try await Self.insertGrants(
                connection,
                cluster: cluster,
                grants.filter { $0.epoch >= 1 && $0.epoch <= current },
                logger: logger
            )
            if stored > 0 { try await Self.notify(connection, cluster: cluster, logger: logger) }
            return stored
        }
    }

    /// See ``RelayStorage``.
    public func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants {
        let logger = logger
        return try await attempt("read key grants") {
            try await client.withConnection { connection in
                var grants: [RelayGrant] = []
                for try await (grantEpoch, recipient, body) in try await connection.query(
                    """
                    SELECT epoch, recipient, body FROM shoal_relay.grants WHERE cluster = \(cluster)
                    AND epoch > \(Int64(epoch)) ORDER BY epoch, recipient
                    """,
                    logger: logger
                ).decode((Int64, String, String).self) {
                    grants.append(RelayGrant(epoch: UInt32(truncatingIfNeeded: grantEpoch), recipient: recipient, body: body))
                }
                return RelayGrants(grants: grants, epoch: try await Self.currentEpoch(connection, cluster: cluster, logger: logger))
            }
        }
    }

    private static func insertGrants(
        _ connection: PostgresConnection,
        cluster: String,
        _ grants: [RelayGrant],
        logger: Logger
    ) async throws -> Int {
        var stored = 0
        for grant in grants {
            for try await _ in try await connection.query(
                """
                INSERT INTO shoal_relay.grants(cluster, epoch, recipient, body) VALUES (\(cluster), \(Int64(grant.epoch)),
                \(grant.recipient), \(grant.body)) ON CONFLICT DO NOTHING RETURNING 1
                """,
                logger: logger
            ) { stored += 1 }
        }
        return stored
    }

    // MARK: Operators

    /// See ``RelayStorage``.
    public func ping() async throws(ShoalError) {
        try await attempt("answer") { try await client.query("SELECT 1", logger: logger) }
    }

    /// See ``RelayStorage``.
    public func statistics() async throws(ShoalError) -> [RelayClusterStatistics] {
        try await attempt("count what the relay holds") {
            var statistics: [RelayClusterStatistics] = []
            for try await (cluster, sites, ranges, chunks, bytes) in try await client.query(
                """
                SELECT cluster, count(DISTINCT site), count(*), sum(chunks)::bigint, sum(bytes)::bigint
                FROM shoal_relay.ranges GROUP BY cluster ORDER BY cluster
                """,
                logger: logger
            ).decode((String, Int64, Int64, Int64, Int64).self) {
                statistics.append(
                    RelayClusterStatistics(cluster: cluster, sites: Int(sites), ranges: Int(ranges), chunks: Int(chunks), bytes: bytes)
                )
            }
            return statistics
        }
    }

    // MARK: Notifications

    /// See ``RelayStorage``. Listens on ``channel`` until cancelled; when the listening connection is lost it
    /// reconnects with backoff, and wakes every cluster once it listens again (what was announced meanwhile was missed).
    public func watch(_ changed: @escaping @Sendable (String?) async -> Void) async {
        var backoff = Backoff(initialMilliseconds: 100, maximumMilliseconds: 5_000)
        var failing = false
        while !Task.isCancelled {
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: Self.channel) { notifications in
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
                    logger.warning("lost PostgreSQL notifications; reconnecting", metadata: ["error": "\(Self.reason(error))"])
                }
                failing = true
                try? await Task.sleep(for: .milliseconds(backoff.next()))
            }
        }
    }
}
