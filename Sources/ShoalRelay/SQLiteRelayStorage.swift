import CSQLite
import NIOPosix
import ShoalCore
import ShoalRelayProtocol
import ShoalStore
import Synchronization

/// The relay's embedded storage: one SQLite database (`relay.sqlite` in the data directory), used from one thread
/// of its own so that no SQLite call ever blocks the server's event loops or the cooperative pool.
///
/// Durability: WAL with `synchronous=NORMAL`: a killed relay process loses nothing it answered for; a power cut may
/// lose the last transactions, which nodes upload again (uploads are idempotent, and a node uploads whatever the
/// relay's heads lack).
public final class SQLiteRelayStorage: RelayStorage {
    /// The schema version this build creates and reads.
    public static let schemaVersion: Int64 = 2

    /// What each schema version adds, in order: version N is `migrations[N - 1]`.
    static let migrations: [String] = [
        """
        CREATE TABLE tokens(
            hash TEXT PRIMARY KEY, cluster TEXT NOT NULL, label TEXT NOT NULL, created INTEGER NOT NULL,
            revoked INTEGER, rotated INTEGER) WITHOUT ROWID;
        CREATE TABLE epochs(
            cluster TEXT NOT NULL, epoch INTEGER NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(cluster, epoch)
        ) WITHOUT ROWID;
        CREATE TABLE upload_keys(
            cluster TEXT NOT NULL, epoch INTEGER NOT NULL, key BLOB NOT NULL, PRIMARY KEY(cluster, epoch)
        ) WITHOUT ROWID;
        CREATE TABLE grants(
            cluster TEXT NOT NULL, epoch INTEGER NOT NULL, recipient TEXT NOT NULL, body TEXT NOT NULL,
            PRIMARY KEY(cluster, epoch, recipient)) WITHOUT ROWID;
        CREATE TABLE heads(
            cluster TEXT NOT NULL, site BLOB NOT NULL, head INTEGER NOT NULL, PRIMARY KEY(cluster, site)
        ) WITHOUT ROWID;
        CREATE TABLE ranges(
            cluster TEXT NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL, to_seq INTEGER NOT NULL,
            upload INTEGER NOT NULL, chunks INTEGER NOT NULL, bytes INTEGER NOT NULL, created INTEGER NOT NULL,
            uploader TEXT, PRIMARY KEY(cluster, site, from_seq)) WITHOUT ROWID;
        CREATE TABLE chunks(
            cluster TEXT NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL, upload INTEGER NOT NULL,
            idx INTEGER NOT NULL, envelope BLOB NOT NULL, created INTEGER NOT NULL,
            PRIMARY KEY(cluster, site, from_seq, upload, idx));
        """,
        // Snapshots: ranges and chunks belong to the change log (snapshot 0) or to a snapshot.
        """
        ALTER TABLE ranges RENAME TO ranges_1;
        CREATE TABLE ranges(
            cluster TEXT NOT NULL, snapshot INTEGER NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL,
            to_seq INTEGER NOT NULL, upload INTEGER NOT NULL, chunks INTEGER NOT NULL, bytes INTEGER NOT NULL,
            created INTEGER NOT NULL, uploader TEXT, PRIMARY KEY(cluster, snapshot, site, from_seq)) WITHOUT ROWID;
        INSERT INTO ranges SELECT cluster, 0, site, from_seq, to_seq, upload, chunks, bytes, created, uploader FROM ranges_1;
        DROP TABLE ranges_1;
        ALTER TABLE chunks RENAME TO chunks_1;
        CREATE TABLE chunks(
            cluster TEXT NOT NULL, snapshot INTEGER NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL,
            upload INTEGER NOT NULL, idx INTEGER NOT NULL, envelope BLOB NOT NULL, created INTEGER NOT NULL,
            PRIMARY KEY(cluster, snapshot, site, from_seq, upload, idx));
        INSERT INTO chunks SELECT cluster, 0, site, from_seq, upload, idx, envelope, created FROM chunks_1;
        DROP TABLE chunks_1;
        CREATE TABLE snapshots(
            cluster TEXT NOT NULL, snapshot INTEGER NOT NULL, vector TEXT NOT NULL, bytes INTEGER NOT NULL,
            created INTEGER NOT NULL, PRIMARY KEY(cluster, snapshot)) WITHOUT ROWID;
        """,
    ]

    /// Brings the schema to ``schemaVersion`` in one transaction; refuses a newer one.
    private static func migrate(_ sqlite: SQLiteConnection, path: String) throws(ShoalError) {
        try sqlite.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            var version: Int64 = 0
            switch try sqlite.scalar("SELECT value FROM relay_meta WHERE key = 'schema'") {
            case .null:
                break
            case .integer(let stored):
                version = stored
            case let other:
                throw ShoalError(code: .corruptMetadata, message: "the relay database \(path) records schema \(other)")
            }
            guard version <= schemaVersion else {
                throw ShoalError(
                    code: .versionMismatch,
                    message: "the relay database \(path) has schema \(version), and this build reads \(schemaVersion): run a newer relay"
                )
            }
            for migration in migrations[Int(version)...] { try sqlite.exec(migration) }
            try sqlite.exec("INSERT OR REPLACE INTO relay_meta VALUES ('schema', \(schemaVersion))")
            try sqlite.exec("COMMIT")
        } catch {
            try? sqlite.exec("ROLLBACK")
            throw error
        }
    }

    private let connection: Mutex<Connection>
    private let pool: NIOThreadPool
    /// Where the database lives.
    public let path: String

    /// A connection and its prepared statements.
    private final class Connection {
        let sqlite: SQLiteConnection
        var statements: [String: SQLiteStatement] = [:]

        init(_ sqlite: SQLiteConnection) { self.sqlite = sqlite }

        func statement(_ sql: String) throws(ShoalError) -> SQLiteStatement {
            if let statement = statements[sql] { return statement }
            let statement = try sqlite.prepare(sql)
            statements[sql] = statement
            return statement
        }
    }

    /// Opens (creating when missing) the relay database in directory `data`.
    public init(directory data: String) throws(ShoalError) {
        var isDirectory = false
        if Self.isDirectory(data, &isDirectory) {
            guard isDirectory else {
                throw ShoalError(code: .invalidArgument, message: "\(data) is not a directory: --data wants the relay's data directory")
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
        let sqlite = try SQLiteConnection(path: path)
        try sqlite.exec(
            """
            PRAGMA journal_mode=WAL;
            PRAGMA synchronous=NORMAL;
            CREATE TABLE IF NOT EXISTS relay_meta(key TEXT PRIMARY KEY, value ANY) WITHOUT ROWID;
            """
        )
        try Self.migrate(sqlite, path: path)
        connection = Mutex(Connection(sqlite))
        pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
    }

    deinit {
        pool.shutdownGracefully { _ in }
    }

    /// See ``RelayStorage``: one process uses the file, and the server wakes its own pulls.
    public func watch(_ changed: @escaping @Sendable (String?) async -> Void) async {}

    /// See ``RelayStorage``.
    public func close() async {}

    private static func isDirectory(_ path: String, _ isDirectory: inout Bool) -> Bool {
        var info = stat()
        guard stat(path, &info) == 0 else { return false }
        isDirectory = (info.st_mode & S_IFMT) == S_IFDIR
        return true
    }

    /// Runs `body` on the storage's thread.
    private func run<T: Sendable>(_ body: @escaping @Sendable (Connection) throws(ShoalError) -> T) async throws(ShoalError) -> T {
        let result: Result<T, ShoalError>
        do {
            result = try await pool.runIfActive {
                self.connection.withLock { connection in
                    do throws(ShoalError) {
                        return .success(try body(connection))
                    } catch {
                        return .failure(error)
                    }
                }
            }
        } catch {
            throw ShoalError(code: .relay, message: "the relay's storage is shutting down")
        }
        return try result.get()
    }

    private static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }

    private static func transaction<T>(_ connection: Connection, _ body: () throws(ShoalError) -> T) throws(ShoalError) -> T {
        try connection.sqlite.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            let result = try body()
            try connection.sqlite.exec("COMMIT")
            return result
        } catch {
            try? connection.sqlite.exec("ROLLBACK")
            throw error
        }
    }

    /// See ``RelayStorage``.
    public func createToken(cluster: String, label: String) async throws(ShoalError) -> String {
        let token = RelayTokens.make()
        try await run { connection throws(ShoalError) in
            let insert = try connection.statement("INSERT INTO tokens(hash, cluster, label, created) VALUES (?, ?, ?, ?)")
            try insert.bind([.text(RelayTokens.hash(token)), .text(cluster), .text(label), .integer(Self.now())])
            try insert.run()
        }
        return token
    }

    /// See ``RelayStorage``.
    public func revokeTokens(matching token: String, wholeCluster: Bool) async throws(ShoalError) -> Int {
        try await run { connection throws(ShoalError) in
            let sql = wholeCluster
                ? "UPDATE tokens SET revoked = ? WHERE cluster = ? AND revoked IS NULL"
                : "UPDATE tokens SET revoked = ? WHERE (hash = ? OR hash = ?) AND revoked IS NULL"
            let update = try connection.statement(sql)
            var arguments: [SQLValue] = [.integer(Self.now()), .text(wholeCluster ? token : RelayTokens.hash(token))]
            if !wholeCluster { arguments.append(.text(token)) }
            try update.bind(arguments)
            try update.run()
            return Int(sqlite3_changes(connection.sqlite.handle))
        }
    }

    /// See ``RelayStorage``.
    public func tokens() async throws(ShoalError) -> [RelayToken] {
        try await run { connection throws(ShoalError) in
            try connection.sqlite.rows("SELECT hash, cluster, label, created, revoked, rotated FROM tokens ORDER BY created")
                .map(Self.token(row:))
        }
    }

    /// See ``RelayStorage``.
    public func token(hash: String) async throws(ShoalError) -> RelayToken? {
        try await run { connection throws(ShoalError) in
            let select = try connection.statement("SELECT hash, cluster, label, created, revoked, rotated FROM tokens WHERE hash = ?")
            defer { select.reset() }
            try select.bind([.text(hash)])
            guard try select.step() else { return nil }
            return Self.token(row: select.row())
        }
    }

    private static func text(_ value: SQLValue) -> String {
        if case .text(let text) = value { return text }
        return ""
    }

    private static func token(row: [SQLValue]) -> RelayToken {
        RelayToken(
            hash: Self.text(row[0]),
            cluster: Self.text(row[1]),
            label: Self.text(row[2]),
            created: row[3].integerValue ?? 0,
            revoked: row[4].integerValue,
            rotatedAtEpoch: row[5].integerValue.map { UInt32(truncatingIfNeeded: $0) }
        )
    }

    /// See ``RelayStorage``.
    public func heads(cluster: String) async throws(ShoalError) -> VersionVector {
        try await run { connection throws(ShoalError) in try Self.heads(connection, cluster: cluster) }
    }

    private static func heads(_ connection: Connection, cluster: String) throws(ShoalError) -> VersionVector {
        let select = try connection.statement("SELECT site, head FROM heads WHERE cluster = ?")
        defer { select.reset() }
        try select.bind([.text(cluster)])
        var vector = VersionVector()
        while try select.step() {
            if let site = SiteID(bytes: select.columnBytes(0)) {
                vector.advance(site, to: UInt64(bitPattern: select.columnInt64(1)))
            }
        }
        return vector
    }

    /// The head per site of the change log (`snapshot` 0) or of a snapshot: where its chain of ranges ends.
    private static func heads(_ connection: Connection, cluster: String, snapshot: Int64) throws(ShoalError) -> VersionVector {
        guard snapshot != 0 else { return try heads(connection, cluster: cluster) }
        let select = try connection.statement(
            "SELECT site, max(to_seq) FROM ranges WHERE cluster = ? AND snapshot = ? GROUP BY site"
        )
        defer { select.reset() }
        try select.bind([.text(cluster), .integer(snapshot)])
        var vector = VersionVector()
        while try select.step() {
            if let site = SiteID(bytes: select.columnBytes(0)) {
                vector.advance(site, to: UInt64(bitPattern: select.columnInt64(1)))
            }
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
        let snapshot = Int64(bitPattern: snapshot)
        return try await run { connection throws(ShoalError) in
            try Self.transaction(connection) { () throws(ShoalError) -> RelayUploadResult in
                var heads = try Self.heads(connection, cluster: cluster, snapshot: snapshot)
                var result = RelayUploadResult(stored: 0, alreadyHeld: 0, gaps: 0, heads: [:])
                let now = Self.now()
                let insert = try connection.statement(
                    "INSERT OR IGNORE INTO chunks(cluster, snapshot, site, from_seq, upload, idx, envelope, created) "
                        + "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                )
                for (envelope, encoded) in envelopes {
                    let head = heads[envelope.site]
                    if envelope.from < head {
                        result.alreadyHeld += 1
                        continue
                    }
                    if envelope.from > head {
                        result.gaps += 1
                        continue
                    }
                    let site = SQLValue.blob(envelope.site.bytes)
                    let from = SQLValue.integer(Int64(bitPattern: envelope.from))
                    let upload = SQLValue.integer(Int64(bitPattern: envelope.upload))
                    let key: [SQLValue] = [.text(cluster), .integer(snapshot), site, from]
                    try insert.bind(key + [upload, .integer(Int64(envelope.index)), .blob(encoded), .integer(now)])
                    try insert.run()
                    if sqlite3_changes(connection.sqlite.handle) == 1 { result.stored += 1 } else { result.alreadyHeld += 1 }
                    guard envelope.endsRange else { continue }
                    let count = try connection.statement(
                        "SELECT count(*), sum(length(envelope)) FROM chunks "
                            + "WHERE cluster = ? AND snapshot = ? AND site = ? AND from_seq = ? AND upload = ? AND idx <= ?"
                    )
                    try count.bind(key + [upload, .integer(Int64(envelope.index))])
                    _ = try count.step()
                    let present = count.columnInt64(0)
                    let bytes = count.columnInt64(1)
                    count.reset()
                    guard present == Int64(envelope.index) + 1 else {
                        // An earlier chunk of this upload never arrived: the uploader sends the range again.
                        result.gaps += 1
                        continue
                    }
                    let range = try connection.statement(
                        "INSERT INTO ranges(cluster, snapshot, site, from_seq, to_seq, upload, chunks, bytes, created, uploader) "
                            + "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    )
                    try range.bind(key + [.integer(Int64(bitPattern: envelope.to)), upload,
                        .integer(Int64(envelope.index) + 1), .integer(bytes), .integer(now), uploader.map { .text($0) } ?? .null])
                    try range.run()
                    // Chunks of other uploads of the same range (an uploader that gave up, or lost a race) go.
                    let losers = try connection.statement(
                        "DELETE FROM chunks WHERE cluster = ? AND snapshot = ? AND site = ? AND from_seq = ? AND upload != ?"
                    )
                    try losers.bind(key + [upload])
                    try losers.run()
                    if snapshot == 0 {
                        let setHead = try connection.statement(
                            "INSERT INTO heads(cluster, site, head) VALUES (?, ?, ?) "
                                + "ON CONFLICT(cluster, site) DO UPDATE SET head = excluded.head"
                        )
                        try setHead.bind([.text(cluster), site, .integer(Int64(bitPattern: envelope.to))])
                        try setHead.run()
                    }
                    heads.advance(envelope.site, to: envelope.to)
                }
                result.heads = RelayAPI.json(heads)
                return result
            }
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
        try await run { connection throws(ShoalError) in
            let heads = try Self.heads(connection, cluster: cluster)
            let snapshot = try Self.snapshot(connection, cluster: cluster)
            var page = RelayPage(envelopes: [], more: false)
            var bytes = 0
            // The first range of the log that the node still lacks part of: starting after what it holds, the log
            // serves it; starting later (retention dropped what came before, or a hole), the snapshot goes first.
            let floor = try connection.statement(
                "SELECT min(from_seq) FROM ranges WHERE cluster = ? AND snapshot = 0 AND site = ? AND to_seq > ?"
            )
            let ranges = try connection.statement(
                "SELECT from_seq, upload, uploader IS ? FROM ranges WHERE cluster = ? AND snapshot = ? AND site = ? "
                    + "AND to_seq > ? ORDER BY from_seq"
            )
            let chunks = try connection.statement(
                "SELECT envelope FROM chunks WHERE cluster = ? AND snapshot = ? AND site = ? AND from_seq = ? AND upload = ? "
                    + "AND idx >= ? ORDER BY idx"
            )
            defer {
                floor.reset()
                ranges.reset()
                chunks.reset()
            }
            /// Adds the ranges of `site` in `source` (0: the change log) that end after `after`; false once the page
            /// is full.
            func add(_ source: Int64, _ site: SiteID, after: UInt64) throws(ShoalError) -> Bool {
                let siteValue = SQLValue.blob(site.bytes)
                try ranges.bind([uploader.map { .text($0) } ?? .null, .text(cluster), .integer(source), siteValue,
                    .integer(Int64(bitPattern: min(after, UInt64(Int64.max))))])
                defer { ranges.reset() }
                while try ranges.step() {
                    let from = ranges.columnInt64(0)
                    let upload = ranges.columnInt64(1)
                    // What the asking process uploaded itself it holds: left out (a range of its own follows
                    // another of its own, or one the node gets, since it holds what it uploads, from the cursor on).
                    if uploader != nil, ranges.columnInt64(2) == 1 { continue }
                    var first: Int64 = 0
                    if let point = resume[site], point.from == UInt64(bitPattern: from) { first = Int64(point.index) }
                    try chunks.bind([.text(cluster), .integer(source), siteValue, .integer(from), .integer(upload), .integer(first)])
                    defer { chunks.reset() }
                    while try chunks.step() {
                        if bytes > 0 && bytes >= maximumBytes {
                            page.more = true
                            return false
                        }
                        let envelope = chunks.columnBytes(0)
                        bytes += envelope.count
                        page.envelopes.append(envelope)
                    }
                }
                return true
            }
            for (site, head) in heads.sorted where head > vector[site] {
                var after = vector[site]
                // The change log no longer holds what this node lacks of the site (the retention dropped it): the
                // snapshot's ranges of the site first, then the log's after what the snapshot covers.
                try floor.bind([.text(cluster), .blob(site.bytes), .integer(Int64(bitPattern: min(after, UInt64(Int64.max))))])
                var held = head
                if try floor.step(), case .integer(let from) = floor.row()[0] { held = UInt64(bitPattern: from) }
                floor.reset()
                if after < held, let snapshot, snapshot.vector[site] > after {
                    guard try add(Int64(bitPattern: snapshot.id), site, after: after) else { return page }
                    after = snapshot.vector[site]
                }
                guard try add(0, site, after: after) else { return page }
            }
            return page
        }
    }

    private static func snapshot(_ connection: Connection, cluster: String) throws(ShoalError) -> RelaySnapshot? {
        let select = try connection.statement(
            "SELECT snapshot, vector, bytes, created FROM snapshots WHERE cluster = ? ORDER BY created DESC LIMIT 1"
        )
        defer { select.reset() }
        try select.bind([.text(cluster)])
        guard try select.step() else { return nil }
        let row = select.row()
        return RelaySnapshot(
            id: UInt64(bitPattern: row[0].integerValue ?? 0),
            vector: RelaySnapshotVector.decode(Self.text(row[1])),
            bytes: row[2].integerValue ?? 0,
            created: row[3].integerValue ?? 0
        )
    }

    /// See ``RelayStorage``.
    public func completeSnapshot(cluster: String, snapshot: UInt64, vector: VersionVector, retention: RelayRetention)
        async throws(ShoalError) -> RelaySnapshotOutcome
    {
        let id = Int64(bitPattern: snapshot)
        return try await run { connection throws(ShoalError) in
            try Self.transaction(connection) { () throws(ShoalError) -> RelaySnapshotOutcome in
                let heads = try Self.heads(connection, cluster: cluster, snapshot: id)
                if let missing = RelaySnapshotVector.mismatch(heads: heads, vector: vector) { return .incomplete(missing) }
                let size = try connection.statement("SELECT coalesce(sum(bytes), 0) FROM ranges WHERE cluster = ? AND snapshot = ?")
                try size.bind([.text(cluster), .integer(id)])
                _ = try size.step()
                let bytes = size.columnInt64(0)
                size.reset()
                let insert = try connection.statement(
                    "INSERT OR REPLACE INTO snapshots(cluster, snapshot, vector, bytes, created) VALUES (?, ?, ?, ?, ?)"
                )
                try insert.bind([.text(cluster), .integer(id), .text(RelaySnapshotVector.encode(vector)), .integer(bytes),
                    .integer(Self.now())])
                try insert.run()
                // The snapshots before it go: complete ones, and those still under way that started earlier.
                for table in ["chunks", "ranges"] {
                    let older = try connection.statement(
                        "DELETE FROM \(table) WHERE cluster = ? AND snapshot != 0 AND snapshot != ? AND created <= ?"
                    )
                    try older.bind([.text(cluster), .integer(id), .integer(Self.now())])
                    try older.run()
                }
                let others = try connection.statement("DELETE FROM snapshots WHERE cluster = ? AND snapshot != ?")
                try others.bind([.text(cluster), .integer(id)])
                try others.run()
                return .completed(dropped: try Self.retain(connection, cluster: cluster, retention))
            }
        }
    }

    /// Drops the ranges of `cluster`'s change log that its snapshot covers and `retention` lets go (oldest first:
    /// per site a prefix of its chain, so what is kept still runs on from the snapshot); returns how many went.
    private static func retain(_ connection: Connection, cluster: String, _ retention: RelayRetention) throws(ShoalError) -> Int {
        guard let snapshot = try snapshot(connection, cluster: cluster) else { return 0 }
        let select = try connection.statement(
            "SELECT site, from_seq, upload, to_seq, bytes, created FROM ranges WHERE cluster = ? AND snapshot = 0 "
                + "ORDER BY created DESC, site, from_seq DESC"
        )
        try select.bind([.text(cluster)])
        var ranges: [RetainedRange] = []
        while try select.step() {
            guard let site = SiteID(bytes: select.columnBytes(0)) else { continue }
            ranges.append(
                RetainedRange(
                    site: site,
                    from: select.columnInt64(1),
                    upload: select.columnInt64(2),
                    to: UInt64(bitPattern: select.columnInt64(3)),
                    bytes: select.columnInt64(4),
                    created: select.columnInt64(5)
                )
            )
        }
        select.reset()
        let drops = retention.drops(ranges, snapshot: snapshot.vector, now: now())
        let dropRange = try connection.statement("DELETE FROM ranges WHERE cluster = ? AND snapshot = 0 AND site = ? AND from_seq = ?")
        let dropChunks = try connection.statement(
            "DELETE FROM chunks WHERE cluster = ? AND snapshot = 0 AND site = ? AND from_seq = ? AND upload = ?"
        )
        for range in drops {
            try dropRange.bind([.text(cluster), .blob(range.site.bytes), .integer(range.from)])
            try dropRange.run()
            try dropChunks.bind([.text(cluster), .blob(range.site.bytes), .integer(range.from), .integer(range.upload)])
            try dropChunks.run()
        }
        return drops.count
    }

    /// See ``RelayStorage``.
    public func snapshotState(cluster: String) async throws(ShoalError) -> (snapshot: RelaySnapshot?, uncoveredBytes: Int64) {
        try await run { connection throws(ShoalError) in
            let snapshot = try Self.snapshot(connection, cluster: cluster)
            let select = try connection.statement("SELECT site, to_seq, bytes FROM ranges WHERE cluster = ? AND snapshot = 0")
            defer { select.reset() }
            try select.bind([.text(cluster)])
            var uncovered: Int64 = 0
            while try select.step() {
                guard let site = SiteID(bytes: select.columnBytes(0)) else { continue }
                if UInt64(bitPattern: select.columnInt64(1)) > snapshot?.vector[site] ?? 0 { uncovered += select.columnInt64(2) }
            }
            return (snapshot, uncovered)
        }
    }

    /// See ``RelayStorage``.
    public func retain(_ retention: RelayRetention) async throws(ShoalError) -> Int {
        try await run { connection throws(ShoalError) in
            let clusters = try connection.sqlite.rows("SELECT DISTINCT cluster FROM snapshots").map { Self.text($0[0]) }
            var dropped = 0
            for cluster in clusters {
                dropped += try Self.transaction(connection) { () throws(ShoalError) in
                    try Self.retain(connection, cluster: cluster, retention)
                }
            }
            return dropped
        }
    }

    /// See ``RelayStorage``.
    public func rotate(cluster: String, epoch: UInt32, tokenHash: String, grants: [RelayGrant], uploadKey: [UInt8]?)
        async throws(ShoalError) -> RelayRotationOutcome
    {
        try await run { connection throws(ShoalError) in
            try Self.transaction(connection) { () throws(ShoalError) -> RelayRotationOutcome in
                let current = try Self.currentEpoch(connection, cluster: cluster)
                guard epoch == current + 1 else { return .taken(current: current) }
                let now = Self.now()
                let insert = try connection.statement("INSERT INTO epochs(cluster, epoch, created) VALUES (?, ?, ?)")
                try insert.bind([.text(cluster), .integer(Int64(epoch)), .integer(now)])
                try insert.run()
                try Self.insertGrants(connection, cluster: cluster, grants.filter { $0.epoch == epoch })
                if let uploadKey {
                    let key = try connection.statement("INSERT OR REPLACE INTO upload_keys(cluster, epoch, key) VALUES (?, ?, ?)")
                    try key.bind([.text(cluster), .integer(Int64(epoch)), .blob(uploadKey)])
                    try key.run()
                }
                let retire = try connection.statement(
                    "UPDATE tokens SET revoked = ?, rotated = ? WHERE cluster = ? AND revoked IS NULL"
                )
                try retire.bind([.integer(now), .integer(Int64(epoch)), .text(cluster)])
                try retire.run()
                let token = try connection.statement(
                    "INSERT OR REPLACE INTO tokens(hash, cluster, label, created) VALUES (?, ?, ?, ?)"
                )
                try token.bind([.text(tokenHash), .text(cluster), .text("key epoch \(epoch)"), .integer(now)])
                try token.run()
                return .rotated
            }
        }
    }

    /// See ``RelayStorage``.
    public func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> (key: [UInt8]?, newest: UInt32) {
        try await run { connection throws(ShoalError) in
            let select = try connection.statement("SELECT key FROM upload_keys WHERE cluster = ? AND epoch = ?")
            defer { select.reset() }
            try select.bind([.text(cluster), .integer(Int64(epoch))])
            let key = try select.step() ? select.columnBytes(0) : nil
            return (key, try Self.currentEpoch(connection, cluster: cluster))
        }
    }

    /// See ``RelayStorage``.
    public func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool {
        try await run { connection throws(ShoalError) in
            let insert = try connection.statement("INSERT OR IGNORE INTO upload_keys(cluster, epoch, key) VALUES (?, ?, ?)")
            try insert.bind([.text(cluster), .integer(Int64(epoch)), .blob(key)])
            try insert.run()
            let select = try connection.statement("SELECT key FROM upload_keys WHERE cluster = ? AND epoch = ?")
            defer { select.reset() }
            try select.bind([.text(cluster), .integer(Int64(epoch))])
            return try select.step() && select.columnBytes(0) == key
        }
    }

    /// See ``RelayStorage``.
    public func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int {
        try await run { connection throws(ShoalError) in
            try Self.transaction(connection) { () throws(ShoalError) -> Int in
                let current = try Self.currentEpoch(connection, cluster: cluster)
                return try Self.insertGrants(connection, cluster: cluster, grants.filter { $0.epoch >= 1 && $0.epoch <= current })
            }
        }
    }

    /// See ``RelayStorage``.
    public func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants {
        try await run { connection throws(ShoalError) in
            let select = try connection.statement(
                "SELECT epoch, recipient, body FROM grants WHERE cluster = ? AND epoch > ? ORDER BY epoch, recipient"
            )
            defer { select.reset() }
            try select.bind([.text(cluster), .integer(Int64(epoch))])
            var grants: [RelayGrant] = []
            while try select.step() {
                let row = select.row()
                grants.append(
                    RelayGrant(epoch: UInt32(truncatingIfNeeded: row[0].integerValue ?? 0), recipient: Self.text(row[1]), body: Self.text(row[2]))
                )
            }
            return RelayGrants(grants: grants, epoch: try Self.currentEpoch(connection, cluster: cluster))
        }
    }

    private static func currentEpoch(_ connection: Connection, cluster: String) throws(ShoalError) -> UInt32 {
        let select = try connection.statement("SELECT max(epoch) FROM epochs WHERE cluster = ?")
        defer { select.reset() }
        try select.bind([.text(cluster)])
        _ = try select.step()
        return UInt32(truncatingIfNeeded: select.columnInt64(0))
    }

    @discardableResult
    private static func insertGrants(_ connection: Connection, cluster: String, _ grants: [RelayGrant]) throws(ShoalError) -> Int {
        let insert = try connection.statement(
            "INSERT OR IGNORE INTO grants(cluster, epoch, recipient, body) VALUES (?, ?, ?, ?)"
        )
        var stored = 0
        for grant in grants {
            try insert.bind([.text(cluster), .integer(Int64(grant.epoch)), .text(grant.recipient), .text(grant.body)])
            try insert.run()
            stored += Int(sqlite3_changes(connection.sqlite.handle))
        }
        return stored
    }

    /// See ``RelayStorage``.
    public func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int {
        try await run { connection throws(ShoalError) in
            // Chunks of ranges never completed, and the ranges of snapshots never completed.
            try connection.sqlite.exec(
                """
                DELETE FROM chunks WHERE created < \(milliseconds) AND (NOT EXISTS (
                    SELECT 1 FROM ranges r WHERE r.cluster = chunks.cluster AND r.snapshot = chunks.snapshot
                        AND r.site = chunks.site AND r.from_seq = chunks.from_seq AND r.upload = chunks.upload)
                    OR (snapshot != 0 AND NOT EXISTS (
                        SELECT 1 FROM snapshots s WHERE s.cluster = chunks.cluster AND s.snapshot = chunks.snapshot)))
                """
            )
            let chunks = Int(sqlite3_changes(connection.sqlite.handle))
            try connection.sqlite.exec(
                """
                DELETE FROM ranges WHERE snapshot != 0 AND created < \(milliseconds) AND NOT EXISTS (
                    SELECT 1 FROM snapshots s WHERE s.cluster = ranges.cluster AND s.snapshot = ranges.snapshot)
                """
            )
            return chunks
        }
    }

    /// See ``RelayStorage``.
    public func ping() async throws(ShoalError) {
        try await run { connection throws(ShoalError) in _ = try connection.sqlite.rows("SELECT 1") }
    }

    /// See ``RelayStorage``.
    public func statistics() async throws(ShoalError) -> [RelayClusterStatistics] {
        try await run { connection throws(ShoalError) in
            try connection.sqlite.rows(
                """
                SELECT cluster, count(DISTINCT site), count(*), sum(chunks), sum(bytes) FROM ranges GROUP BY cluster
                ORDER BY cluster
                """
            ).map { row in
                RelayClusterStatistics(
                    cluster: Self.text(row[0]),
                    sites: Int(row[1].integerValue ?? 0),
                    ranges: Int(row[2].integerValue ?? 0),
                    chunks: Int(row[3].integerValue ?? 0),
                    bytes: row[4].integerValue ?? 0
                )
            }
        }
    }
}
