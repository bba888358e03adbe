import ShoalCore

/// The embedded storage's tables, versioned: `relay_meta` records the schema version (key `schema`), and the relay
/// brings an older database to this build's at start, in one transaction; a newer one is refused.
enum RelaySQLiteSchema {
    /// The schema version this build creates and reads.
    static let version: Int64 = 2

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
        INSERT INTO ranges
            SELECT cluster, 0, site, from_seq, to_seq, upload, chunks, bytes, created, uploader FROM ranges_1;
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

    /// Brings the schema of the database at `path` to ``version`` in one transaction; refuses a newer one.
    static func migrate(_ sqlite: RelaySQLiteConnection, path: String) throws(ShoalError) {
        try sqlite.exec("CREATE TABLE IF NOT EXISTS relay_meta(key TEXT PRIMARY KEY, value ANY) WITHOUT ROWID")
        try sqlite.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            var stored: Int64 = 0
            switch try sqlite.rows("SELECT value FROM relay_meta WHERE key = 'schema'").first?.first ?? .null {
            case .null:
                break
            case .integer(let value):
                stored = value
            case let other:
                throw ShoalError(code: .corruptMetadata, message: "the relay database \(path) records schema \(other)")
            }
            guard stored <= version else {
                throw ShoalError(
                    code: .versionMismatch,
                    message: "the relay database \(path) has schema \(stored), and this build reads \(version): "
                        + "run a newer relay"
                )
            }
            for migration in migrations[Int(max(0, stored))...] { try sqlite.exec(migration) }
            try sqlite.exec("INSERT OR REPLACE INTO relay_meta VALUES ('schema', \(version))")
            try sqlite.exec("COMMIT")
        } catch {
            try? sqlite.exec("ROLLBACK")
            throw error
        }
    }
}
