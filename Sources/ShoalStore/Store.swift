import CSQLite
import Logging
import ShoalCore

/// Settings of a ``Store``.
public struct StoreOptions: Sendable {
    /// Physical time, injectable for tests.
    public var clock: any WallClock = SystemWallClock()
    /// How far ahead of local time a remote clock may be before its changes are refused.
    public var maximumClockDriftMilliseconds: UInt64 = 5 * 60 * 1000
    /// How many conflicts the conflict log keeps (oldest dropped first).
    public var conflictLogLimit: Int = 10_000
    /// Where the store logs (never row payloads).
    public var logger = Logger(label: "shoal.store")
    /// A human-readable node name, stored on creation.
    public var nodeName: String?
    /// SQLite's page cache for this connection, in KiB. Replication metadata roughly doubles what a
    /// transaction touches, so the default is larger than SQLite's 2 MiB.
    public var cacheSizeKiB = 32 * 1024
    /// How much of the file SQLite may memory-map, in bytes (0, the default, turns it off). Every mapped page a
    /// scan touches stays in the process's resident memory: serving a catch-up of a 110 MB file kept 110 MB
    /// resident, where reading through the page cache above keeps `cacheSizeKiB` (the kernel caches the file
    /// either way), and the catch-up was no slower.
    public var mmapSize = 0
    /// This machine's id, which tells a database copied from another machine (see ``IdentityChange``): by default
    /// `/etc/machine-id` (none when it is missing or empty: then only copies on this machine are told apart).
    public var machineID: String? = Store.systemMachineID()
    /// Set by the membership layer (ShoalSecurity, which checks the roster's signatures): given every roster record
    /// held and arriving, the fences the roster requires (``Store/raiseFences(_:)``). An apply that brings roster
    /// records raises these fences before it merges anything, in the same transaction (``Store/fenceGate``).
    public var fenceGate: (@Sendable ([[UInt8]]) -> [SiteID: UInt64])?
    /// How this node follows its peers' schema changes (see ``SchemaChangeFollowing``).
    public var schemaChanges = SchemaChangeFollowing.apply

    /// The defaults.
    public init() {}
}

/// The result of one SQL statement: column names and rows.
public struct QueryResult: Sendable, Hashable {
    /// The result's column names, in order.
    public var columns: [String]
    /// The rows, each with one value per column.
    public var rows: [[SQLValue]]

    /// A result of `rows` under `columns`.
    public init(columns: [String], rows: [[SQLValue]]) {
        self.columns = columns
        self.rows = rows
    }
}

/// A Shoal database: an ordinary SQLite file whose replicated tables are captured, merged and exchanged.
///
/// Read and write with plain SQL through ``execute(_:_:)``, ``prepare(_:)`` or ``transaction(_:)``; every
/// INSERT, UPDATE and DELETE on a replicated table becomes part of one change (one *dot*) per committed
/// transaction. Other SQLite tools may read and write the file at any time: their writes to replicated
/// tables are captured too (see ``captureForeignWrites()``).
///
/// Not `Sendable`: a store owns one SQLite connection and is used from one thread at a time. Several
/// processes may open the same file; SQLite's locking orders their transactions.
public final class Store {
    /// The site this database writes as (a fresh one after its file turned out to be a restored or copied one:
    /// see ``identityChange()``).
    public private(set) var siteID: SiteID
    /// The site peers know this node by (its membership names it): the first site it wrote as, unless its file was
    /// copied from another machine.
    public private(set) var identitySiteID: SiteID
    /// The index of ``siteID`` in `shoal_sites`.
    let ownSiteIndex: Int64
    /// The path it was opened with.
    public let path: String
    let options: StoreOptions
    let connection: SQLiteConnection
    /// How long this store's write transactions hold SQLite's write lock (see ``writeLockHolds``).
    let writeHolds: WriteHoldMeter
    let capture = ChangeCapture()
    var sites = SiteTable()
    /// How many delta cursors are being read (compaction waits for none).
    let openCursors = CursorCount()
    /// Set when a transaction rolled back: sites it allocated (in memory and in `shoal_sites`) are gone from the
    /// file, so the table is read again before its next use.
    var sitesNeedReload = false
    var hybridClock: HybridClock
    /// The stamp of the open transaction's local changes, once it has any.
    var transactionStamp: Stamp?
    /// When the writes of other connections that the open transaction drained from the outbox were made (the
    /// latest), while they are all it has to stamp: ``localStamp()`` stamps them then, not now.
    var foreignWriteTime: UInt64?
    var schemaVersion: Int64 = -1
    /// ``schemaFingerprint()`` as computed at a schema version.
    var fingerprintCache: (version: Int64, text: String)?
    /// Whether the error about this database's clock running ahead of the machine's was logged.
    var warnedClockAhead = false
    /// The wall and monotonic clocks when this store last stamped a write with the wall clock's reading.
    var clockReference: (wall: UInt64, steady: UInt64)?
    /// Whether the error about a wall clock that jumped ahead was logged (once per jump).
    var warnedClockJump = false
    /// Each peer's latest clock reading (see ``notePeerClock(_:from:)``).
    var peerClocks: [SiteID: PeerClockEvidence] = [:]
    /// Whether the error about this machine's clock running ahead of its peers' was logged (once per episode).
    var warnedAheadOfPeers = false
    /// This node's own commits up to this seq are known to be on disk (``makeLocalCommitsDurable(upTo:)``).
    var durableLocalSeq: UInt64 = 0
    /// Replicated tables another tool changed or dropped (see ``pausedTables()``).
    var pausedTableList: [PausedTable] = []
    /// Per member (the site its membership names), the other sites it signed that it writes under (a fresh site,
    /// once restored or copied), from the roster: a notice naming the member covers its writes under them too
    /// (``suspendedWriteRanges(arriving:)``). Set by the sync layer (``SerializedStore/setMemberWritingSites(_:)``).
    public var memberWritingSites: [SiteID: Set<SiteID>] = [:]
    var statements: [String: SQLiteStatement] = [:]
    /// Per replicated table id: its metadata statements, prepared once.
    var clockStatements: [Int64: ClockStatements] = [:]
    /// Data-table INSERTs and UPDATEs used by apply, by table and column set.
    var dataStatements: [DataStatementKey: SQLiteStatement] = [:]
    /// Set while a user statement is prepared, so the authorizer can guard Shoal's tables.
    var preparingUserStatement = false
    /// Set while a user `ALTER TABLE … ADD COLUMN` is prepared: the one change of a replicated table it allows.
    var addingColumn = false
    /// Set by the authorizer while a user statement is prepared: it calls a function or reads a column, so
    /// it could make a value larger than any of its inputs (see ``valueSizesBounded(_:arguments:)``).
    var userStatementComputesValues = false
    var authorizerDenial: String?
    /// Where the next ``compactLog(maxEntries:)`` pass starts (nil: at the beginning of the log).
    var compactionPosition: (site: Int64, seq: Int64, table: Int64, part: Int64)?
    /// The entry a compaction slice stopped inside (its rows from `offset` on not looked at yet), resumed first.
    var compactionResume: (site: Int64, seq: Int64, table: Int64, part: Int64, offset: Int)?
    /// Where the last collection pass stopped inside a log entry (its budget ran out there); the next goes on from it.
    var collectionResume: (site: Int64, seq: Int64, table: Int64, part: Int64, offset: Int)?
    /// How many rows one compaction slice looks at, at most: one short write transaction.
    static let compactionRowsPerSlice = 4_000
    /// The `data_version` at which the outboxes were last found empty or drained (nil: look again).
    var outboxCheckedAt: Int64?
    /// Whether triggers of the main schema run on this connection (see ``updateTriggerSwitch()``).
    var triggersEnabled = true
    /// Set when a user statement creates a trigger: triggers go back on once it has run.
    var userTriggerCreated = false
    /// Given every roster record held and arriving, the fences the roster requires (``StoreOptions/fenceGate``, which
    /// it starts as): an apply that brings roster records raises them before it merges anything.
    public var fenceGate: (([[UInt8]]) -> [SiteID: UInt64])?
    /// Set while ``tablesRead(by:)`` prepares a statement: the authorizer collects the tables it reads.
    var collectingReads = false
    var tablesRead: Set<String> = []
    /// The replicated tables written by what was committed since the last ``takeCommittedTables()``.
    var committedTables: Set<String> = []
    /// Per fenced site: when changes it made beyond its fence were last logged as refused, and how many were refused
    /// since (a removed member that keeps writing is refused at every batch: one warning a minute per site).
    var fencedWarnings: [SiteID: (loggedAt: UInt64, refused: Int)] = [:]
    /// When writes a member made while suspended were last logged as left out (``leaveOutSuspendedWrites(_:)``).
    var suspendedWritesWarnedAt: UInt64?
    /// The transactions (dots) committed since the last ``takeCommittedTables()``, alongside their tables.
    var committedDots: Set<Dot> = []
    /// Columns added to replicated tables that this node has not adopted yet (see ``adoptSchemaChanges()``).
    var schemaAdditions: [SchemaAddition] = []
    /// Whether held changes may have become mergeable (the schema changed since they were last looked at).
    var heldMayReplay = true
    /// Whether the failure to record what was sent (``recordSent(upTo:)``) was logged.
    var warnedSentRecord = false
    /// What the sent file records this database holds (``recordHolds()``), as last written by this connection.
    var recordedHolds = VersionVector()

    /// The local site's index in `shoal_sites` in a new database.
    static let localSiteIndex: Int64 = 1

    /// Opens (creating if needed) the database at `path`. `":memory:"` gives a private in-memory database.
    public init(path: String, options: StoreOptions = StoreOptions()) throws(ShoalError) {
        self.path = path
        self.options = options
        let connection = try SQLiteConnection(path: path)
        let writeHolds = WriteHoldMeter()
        connection.writeHolds = writeHolds
        (self.connection, self.writeHolds) = (connection, writeHolds)
        self.hybridClock = HybridClock(maximumDriftMilliseconds: options.maximumClockDriftMilliseconds)
        self.fenceGate = options.fenceGate
        if path != ":memory:" && !path.isEmpty {
            // A new file gives pages back as they are freed (collected tombstones, a compacted log): see
            // ``reclaimFreePages(maxPages:)``. (A file an app made first keeps its setting; `shoal compact --vacuum`
            // changes it.)
            if try connection.scalar("PRAGMA page_count").integerValue == 0 {
                try connection.exec("PRAGMA auto_vacuum = INCREMENTAL")
            }
            _ = try connection.rows("PRAGMA journal_mode = WAL")
        }
        // The write-ahead log grows with the largest transaction (a catch-up, a bulk import); once checkpointed and
        // reset, SQLite cuts it back to 16 MiB (journal_size_limit), so it does not stay large after a burst.
        try connection.exec(
            "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -\(options.cacheSizeKiB); "
                + "PRAGMA mmap_size = \(options.mmapSize); PRAGMA journal_size_limit = \(Self.walSizeLimit)"
        )
        let created = try Self.createMetadata(connection, nodeName: options.nodeName)
        let identity = try Self.checkIdentity(
            connection, path: path, site: created, machine: options.machineID, now: options.clock.nowMilliseconds()
        )
        (self.siteID, self.ownSiteIndex, self.identitySiteID) = (identity.site, identity.index, identity.identity)
        if let change = identity.change {
            options.logger.error("\(change.description)", metadata: ["reason": "\(change.reason.rawValue)"])
        }
        try migrateDigestFormat()
        try Self.migrateLogParts(connection)
        try installOwnConnectionMarker()
        installHooks()
        try refreshSchema()
        try installMissingCaptureTriggers()
        // (A read-only file of an older build opens as it is: nothing can be captured into it.)
        do { try upgradeCaptureTriggers() } catch { if error.sqlite?.isReadOnly != true { throw error } }
        // Writes a restored file made under numbers its peers hold, issued again under its fresh site. (A read-only
        // file only delays this.)
        do { try reissueForkedWrites() } catch { if error.sqlite?.isReadOnly != true { throw error } }
        // Made by the first open that may write (a read-only file of an older build opens as it is: see
        // ``fenceGaps()``).
        do { try connection.exec(Self.fenceGapsTable) } catch { if error.sqlite?.isReadOnly != true { throw error } }
        // A copy that holds less than this file once held (restored in place, its own writes all sent): see
        // ``noteLostHistory()``.
        do { try noteLostHistory() } catch { if error.sqlite?.isReadOnly != true { throw error } }
        // A column added but not adopted, or values held for one that is here now (a process killed between the
        // steps): adopted and replayed now. (A read-only file only delays this.)
        _ = try? adoptSchemaChanges()
        _ = try? replayHeldValues()
    }

    deinit {
        sqlite3_preupdate_hook(connection.handle, nil, nil)
        sqlite3_commit_hook(connection.handle, nil, nil)
        sqlite3_rollback_hook(connection.handle, nil, nil)
        sqlite3_set_authorizer(connection.handle, nil, nil)
        statements.removeAll()
        clockStatements.removeAll()
        dataStatements.removeAll()
    }

    /// Gives a change log written before entries had parts (one row per transaction and table, its key list grown
    /// in place) the `part` column: every entry becomes its part 0. Once, in one transaction.
    private static func migrateLogParts(_ connection: SQLiteConnection) throws(ShoalError) {
        let hasParts = "SELECT count(*) FROM pragma_table_info('shoal_log') WHERE name = 'part'"
        guard case .integer(0) = try connection.scalar(hasParts) else { return }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            // Looked at again under the write lock: another process may have migrated it meanwhile.
            if case .integer(0) = try connection.scalar(hasParts) {
                try connection.exec(
                    """
                    CREATE TABLE shoal_log_parts(
                        site INTEGER NOT NULL, seq INTEGER NOT NULL, tbl INTEGER NOT NULL, part INTEGER NOT NULL DEFAULT 0,
                        hlc INTEGER NOT NULL, keys BLOB NOT NULL, PRIMARY KEY(site, seq, tbl, part)) WITHOUT ROWID;
                    INSERT INTO shoal_log_parts(site, seq, tbl, part, hlc, keys)
                        SELECT site, seq, tbl, 0, hlc, keys FROM shoal_log;
                    DROP TABLE shoal_log;
                    ALTER TABLE shoal_log_parts RENAME TO shoal_log;
                    """
                )
            }
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// The metadata tables every Shoal database has from its first open.
    static let metadataTables = [
        "shoal_meta", "shoal_sites", "shoal_tables", "shoal_shapes", "shoal_digest", "shoal_row_hashes",
        "shoal_digest_pending", "shoal_claims", "shoal_fences", "shoal_held", "shoal_log", "shoal_peers",
        "shoal_conflicts",
    ]

    /// The site of a database that already has all its metadata (and the node name asked for, if one was), read
    /// without the write lock; nil when something must be created or recorded.
    private static func existingMetadata(
        _ connection: SQLiteConnection,
        nodeName: String?
    ) throws(ShoalError) -> SiteID? {
        let names = metadataTables.map { "'\($0)'" }.joined(separator: ", ")
        let present = try connection.scalar(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN (\(names))"
        )
        guard present.integerValue == Int64(metadataTables.count),
            case .blob(let bytes) = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'site_id'"),
            let site = SiteID(bytes: bytes)
        else { return nil }
        if let nodeName {
            let stored = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'node_name'")
            guard stored == .text(nodeName) else { return nil }
        }
        return site
    }

    private static func createMetadata(_ connection: SQLiteConnection, nodeName: String?) throws(ShoalError) -> SiteID {
        // Read first: opening a database that has everything (`shoal status` beside a node in a catch-up, say) never
        // waits for the write lock.
        if let site = try existingMetadata(connection, nodeName: nodeName) { return site }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            try connection.exec(
                """
                CREATE TABLE IF NOT EXISTS shoal_meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS shoal_sites(idx INTEGER PRIMARY KEY, site BLOB NOT NULL UNIQUE);
                CREATE TABLE IF NOT EXISTS shoal_tables(
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, counters TEXT NOT NULL DEFAULT '');
                CREATE TABLE IF NOT EXISTS shoal_shapes(tbl INTEGER PRIMARY KEY, shape TEXT NOT NULL);
                CREATE TABLE IF NOT EXISTS shoal_digest(tbl INTEGER PRIMARY KEY, sum BLOB NOT NULL, rows INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS shoal_row_hashes(
                    tbl INTEGER NOT NULL, key BLOB NOT NULL, hash BLOB NOT NULL, PRIMARY KEY(tbl, key)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS shoal_digest_pending(id INTEGER PRIMARY KEY, tbl INTEGER NOT NULL, keys BLOB NOT NULL);
                CREATE TABLE IF NOT EXISTS shoal_claims(site INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS shoal_fences(site BLOB PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS shoal_held(
                    tbl TEXT NOT NULL, col TEXT NOT NULL, pk BLOB NOT NULL, part INTEGER NOT NULL,
                    site INTEGER NOT NULL, seq INTEGER NOT NULL, hlc INTEGER NOT NULL, cl INTEGER NOT NULL,
                    change BLOB NOT NULL, PRIMARY KEY(tbl, col, pk, part)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS shoal_log(
                    site INTEGER NOT NULL, seq INTEGER NOT NULL, tbl INTEGER NOT NULL, part INTEGER NOT NULL DEFAULT 0,
                    hlc INTEGER NOT NULL, keys BLOB NOT NULL, PRIMARY KEY(site, seq, tbl, part)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS shoal_peers(
                    site BLOB PRIMARY KEY, host TEXT NOT NULL, port INTEGER NOT NULL, seen_ms INTEGER NOT NULL);
                CREATE TABLE IF NOT EXISTS shoal_conflicts(
                    id INTEGER PRIMARY KEY, recorded_ms INTEGER NOT NULL, tbl TEXT NOT NULL, pk TEXT NOT NULL,
                    col TEXT NOT NULL, local_value, local_hlc INTEGER NOT NULL, local_site TEXT NOT NULL,
                    remote_value, remote_hlc INTEGER NOT NULL, remote_site TEXT NOT NULL, winner TEXT NOT NULL);
                """
            )
            var site: SiteID
            if case .blob(let bytes) = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'site_id'"),
                let stored = SiteID(bytes: bytes)
            {
                site = stored
            } else {
                site = SiteID.random()
                try connection.rows(
                    "INSERT INTO shoal_meta(key, value) VALUES ('site_id', ?), ('format', 1), ('hlc_high', 0)",
                    [.blob(site.bytes)]
                )
                try connection.rows(
                    "INSERT INTO shoal_sites(idx, site) VALUES (?, ?)",
                    [.integer(localSiteIndex), .blob(site.bytes)]
                )
            }
            if let nodeName {
                try connection.rows(
                    "INSERT INTO shoal_meta(key, value) VALUES ('node_name', ?) "
                        + "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    [.text(nodeName)]
                )
            }
            try connection.exec("COMMIT")
            return site
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// Whether the file at `path` is a Shoal database (it holds a site id), read without writing anything.
    public static func isShoalDatabase(path: String) throws(ShoalError) -> Bool {
        var handle: OpaquePointer?
        defer { sqlite3_close_v2(handle) }
        let opened = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READONLY, nil)
        guard opened == SQLITE_OK, let handle else {
            throw ShoalError(
                code: .sqlite,
                message: "cannot open \(path): \(String(cString: sqlite3_errstr(opened)))",
                sqlite: ShoalError.SQLiteFailure(extendedResultCode: opened)
            )
        }
        sqlite3_busy_timeout(handle, 10_000)
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        let sql = "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'shoal_meta'"
        let code = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard code == SQLITE_OK, sqlite3_step(statement) == SQLITE_ROW else {
            throw ShoalError(
                code: .sqlite,
                message: "cannot read \(path) as an SQLite database: \(String(cString: sqlite3_errmsg(handle)))",
                sqlite: ShoalError.SQLiteFailure(extendedResultCode: sqlite3_extended_errcode(handle), statement: sql)
            )
        }
        return sqlite3_column_int64(statement, 0) > 0
    }

    /// The node name stored in the database, if any.
    public func nodeName() throws(ShoalError) -> String? {
        if case .text(let name) = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'node_name'") {
            return name
        }
        return nil
    }

    // MARK: - Hooks

    /// Reports every row change on this connection to the capture.
    func installPreupdateHook() {
        sqlite3_preupdate_hook(
            connection.handle,
            { context, db, operation, _, tableName, oldKey, newKey in
                guard let context, let db, let tableName else { return }
                let store = Unmanaged<Store>.fromOpaque(context).takeUnretainedValue()
                store.capture.record(db: db, operation: operation, tableName: tableName, oldKey: oldKey, newKey: newKey)
            },
            Unmanaged.passUnretained(self).toOpaque()
        )
    }

    private func installHooks() {
        installPreupdateHook()
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_commit_hook(
            connection.handle,
            { context in
                guard let context else { return 0 }
                let store = Unmanaged<Store>.fromOpaque(context).takeUnretainedValue()
                // A commit the store did not see coming would lose captured changes: refuse it.
                return store.capture.hasUncommittedWork ? 1 : 0
            },
            context
        )
        sqlite3_rollback_hook(
            connection.handle,
            { context in
                guard let context else { return }
                let store = Unmanaged<Store>.fromOpaque(context).takeUnretainedValue()
                store.capture.discardPending()
                store.transactionStamp = nil
                store.forgetUndoneWork()
            },
            context
        )
        sqlite3_set_authorizer(
            connection.handle,
            { context, action, first, second, _, trigger in
                guard let context else { return SQLITE_OK }
                let store = Unmanaged<Store>.fromOpaque(context).takeUnretainedValue()
                return store.authorize(
                    action: action,
                    first: first.map { String(cString: $0) },
                    second: second.map { String(cString: $0) },
                    trigger: trigger.map { String(cString: $0) }
                )
            },
            context
        )
    }

    private func authorize(action: Int32, first: String?, second: String?, trigger: String?) -> Int32 {
        if collectingReads, action == SQLITE_READ, let first { tablesRead.insert(first) }
        guard preparingUserStatement else { return SQLITE_OK }
        if action == SQLITE_FUNCTION || action == SQLITE_READ { userStatementComputesValues = true }
        // Shoal's capture triggers write the outbox (they are skipped on this connection, but still compiled).
        if let trigger, trigger.hasPrefix("shoal_capture_") { return SQLITE_OK }
        switch action {
        case SQLITE_CREATE_TRIGGER, SQLITE_CREATE_TEMP_TRIGGER, SQLITE_DROP_TRIGGER, SQLITE_DROP_TEMP_TRIGGER:
            guard let first, first.lowercased().hasPrefix("shoal_") else {
                if action == SQLITE_CREATE_TRIGGER { userTriggerCreated = true }
                return SQLITE_OK
            }
            authorizerDenial = "trigger \(first) belongs to Shoal's change capture and cannot be changed with SQL"
            return SQLITE_DENY
        case SQLITE_INSERT, SQLITE_UPDATE, SQLITE_DELETE, SQLITE_DROP_TABLE, SQLITE_ALTER_TABLE:
            let table = action == SQLITE_ALTER_TABLE ? second : first
            guard let table else { return SQLITE_OK }
            if Self.isShoalTable(table) {
                authorizerDenial = "table \(table) holds Shoal's replication metadata and cannot be changed with SQL"
                return SQLITE_DENY
            }
            if let paused = pausedTableList.first(where: { $0.name.lowercased() == table.lowercased() }),
                action == SQLITE_INSERT || action == SQLITE_UPDATE || action == SQLITE_DELETE
            {
                authorizerDenial = "\(paused.message). Writes to it are refused meanwhile, so none is lost"
                return SQLITE_DENY
            }
            if action == SQLITE_ALTER_TABLE, capture.tableNumbers[table] != nil, addingColumn {
                // ADD COLUMN: a schema change replicated like any change (see ``adoptSchemaChanges()``).
                return SQLITE_OK
            }
            if action != SQLITE_INSERT && action != SQLITE_UPDATE && action != SQLITE_DELETE,
                capture.tableNumbers[table] != nil
            {
                authorizerDenial =
                    action == SQLITE_ALTER_TABLE
                    ? "table \(table) is replicated: renaming it or a column, dropping a column or changing a type "
                        + "would leave the other nodes unable to apply its changes. Change it in steps every node "
                        + "can follow (expand, then contract): add a new column (ALTER TABLE \(table) ADD COLUMN …, "
                        + "which replicates), write to the new column from the app, copy the old values over "
                        + "(UPDATE), and stop using the old column; it can stay"
                    : "table \(table) is replicated; dropping it would break replication. Stop replicating it first "
                        + "(shoal unreplicate \(table)) on every node"
                return SQLITE_DENY
            }
            return SQLITE_OK
        default:
            return SQLITE_OK
        }
    }

    // MARK: - Statements

    /// A cached internal statement.
    /// The size the write-ahead log is cut back to once checkpointed (bytes).
    static let walSizeLimit = 16 << 20

    func statement(_ sql: String) throws(ShoalError) -> SQLiteStatement {
        if let cached = statements[sql] { return cached }
        let statement = try connection.prepare(sql)
        statements[sql] = statement
        return statement
    }

    /// Prepares one user statement, with the authorizer guarding Shoal's tables.
    func prepareUser(_ sql: String) throws(ShoalError) -> SQLiteStatement {
        preparingUserStatement = true
        userStatementComputesValues = false
        authorizerDenial = nil
        defer { preparingUserStatement = false }
        do {
            return try connection.prepare(sql)
        } catch {
            if let denial = authorizerDenial { throw ShoalError(code: .unsupportedSchema, message: denial) }
            throw error
        }
    }

    /// Opens a write transaction and reads the schema inside it: holding the write lock, no other process can change
    /// the schema, so what the transaction reads and writes (row metadata with a cell per column) follows the tables'
    /// current shape, even if another process added a column since this connection last looked.
    func beginWriting() throws(ShoalError) {
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            try refreshSchema()
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// Undoes the write transaction open on this connection after a failure: what capture gathered is dropped, and the
    /// schema is read again at the next use (the transaction may have changed it before it was undone).
    func abandonWrite() {
        capture.discardPending()
        try? connection.exec("ROLLBACK")
        transactionStamp = nil
        foreignWriteTime = nil
        schemaVersion = -1
    }

    /// Reloads the replicated tables if the schema changed (another process may have replicated a table).
    ///
    /// Every write transaction and read snapshot begins here, so the check is one prepared statement reading the
    /// database header's cookie (no parse, no table read).
    ///
    /// Outside a transaction each of the reads that load the tables sees the file as it is then, and another process
    /// may commit between them (a node replicating one of Shoal's own tables beside the app's connection). So the
    /// tables are recorded as of the cookie read before they were loaded, never one read after: a schema change that
    /// commits meanwhile leaves the recorded cookie behind, and the next call loads again. (With the cookie read after
    /// the load, such a connection kept a table set without the new table for as long as the schema stayed put: its
    /// digest left that table out, and adopting a column tried to replicate the table again.)
    func refreshSchema() throws(ShoalError) {
        let cookie = try statement("PRAGMA schema_version")
        defer { cookie.reset() }
        guard try cookie.step(), case .integer(let version) = cookie.column(0) else {
            throw ShoalError.corruptMetadata("PRAGMA schema_version returned no number")
        }
        guard version != schemaVersion else { return }
        cookie.reset()
        statements.removeAll()
        clockStatements.removeAll()
        dataStatements.removeAll()
        let (tables, paused) = try loadReplicatedTables()
        for table in paused where !pausedTableList.contains(table) {
            options.logger.info("\(table.message)", metadata: ["table": "\(table.name)"])
        }
        pausedTableList = paused
        capture.setTables(tables)
        heldMayReplay = true
        schemaVersion = version
        try updateTriggerSwitch()
    }

    /// Loads the site table again if another process added sites, or if a rolled-back transaction allocated
    /// some. Compared by content (the count and the newest entry), not by count alone: after a rollback, another
    /// process may have given the index this connection had allocated to a different site.
    func refreshSites() throws(ShoalError) {
        if !sitesNeedReload {
            // One read on the hot path: how many sites are stored, and the newest of them (another process adds
            // sites at the end; a rolled-back allocation is caught by `sitesNeedReload`).
            let newest = try statement(
                "SELECT count(*), max(idx), (SELECT site FROM shoal_sites ORDER BY idx DESC LIMIT 1) FROM shoal_sites"
            )
            try newest.step()
            let stored = Int(newest.columnInt64(0))
            let highest = newest.columnInt64(1)
            let same = stored == sites.count && (try? sites.site(at: UInt64(highest)))?.bytes == newest.columnBytes(2)
            newest.reset()
            if same { return }
        }
        var table = SiteTable()
        for row in try connection.rows("SELECT idx, site FROM shoal_sites ORDER BY idx") {
            guard case .integer(let index) = row[0], case .blob(let bytes) = row[1], let site = SiteID(bytes: bytes)
            else { throw ShoalError.corruptMetadata("bad shoal_sites row") }
            table.load(site, index: UInt64(index))
        }
        sites = table
        sitesNeedReload = false
    }

    /// Writes sites allocated in memory since the last call.
    func persistNewSites() throws(ShoalError) {
        guard sites.hasNew else { return }
        let insert = try statement("INSERT INTO shoal_sites(idx, site) VALUES (?, ?)")
        for (index, site) in sites.takeNew() {
            try insert.bind([.integer(Int64(index)), .blob(site.bytes)])
            try insert.run()
        }
    }
}

/// Site ids ↔ the small integers written in metadata.
struct SiteTable: SiteIndexing {
    private var byIndex: [SiteID?] = [nil]
    private var indexes: [SiteID: UInt64] = [:]
    private var fresh: [(UInt64, SiteID)] = []
    /// Whether a site was allocated since the table was loaded (persisted or not).
    private(set) var allocatedSinceLoad = false

    var count: Int { indexes.count }
    var hasNew: Bool { !fresh.isEmpty }

    mutating func load(_ site: SiteID, index: UInt64) {
        while byIndex.count <= Int(index) { byIndex.append(nil) }
        byIndex[Int(index)] = site
        indexes[site] = index
    }

    func existingIndex(of site: SiteID) -> UInt64? { indexes[site] }

    mutating func index(of site: SiteID) -> UInt64 {
        if let index = indexes[site] { return index }
        let index = UInt64(byIndex.count)
        load(site, index: index)
        fresh.append((index, site))
        allocatedSinceLoad = true
        return index
    }

    func site(at index: UInt64) throws(ShoalError) -> SiteID {
        guard index < byIndex.count, let site = byIndex[Int(index)] else {
            throw ShoalError.corruptMetadata("unknown site index \(index)")
        }
        return site
    }

    var all: [(index: UInt64, site: SiteID)] {
        indexes.map { (index: $0.value, site: $0.key) }
    }

    mutating func takeNew() -> [(UInt64, SiteID)] {
        defer { fresh.removeAll() }
        return fresh
    }
}
