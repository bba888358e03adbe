import Foundation
import ShoalCore
import ShoalRelayProtocol

/// The relay's storage rules, written once for both storages: tokens, ranges chained per site and their heads,
/// pages of a pull, snapshots and the retention, key epochs, upload keys and grants. ``SQLiteRelayStorage`` and
/// ``PostgresRelayStorage`` each give it a ``RelayDatabase`` and differ only in how their statements run.
///
/// Every statement is written in the SQL both databases read: `$N` parameters, `ON CONFLICT` for upserts,
/// `RETURNING` to count what a statement changed, `CAST(… AS BIGINT)` around aggregates PostgreSQL would widen.
struct RelayRules<Database: RelayDatabase>: Sendable {
    /// Where the tables are.
    let database: Database

    /// The table `name`, with the database's prefix.
    func table(_ name: String) -> String { database.tablePrefix + name }

    /// Now, in Unix milliseconds.
    static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }

    // MARK: Tokens

    /// See ``RelayStorage/createToken(cluster:label:)``.
    func createToken(cluster: String, label: String) async throws(ShoalError) -> String {
        let token = RelayTokens.make()
        let sql = "INSERT INTO \(table("tokens"))(hash, cluster, label, created) VALUES ($1, $2, $3, $4)"
        try await database.read("store a token") { connection throws(ShoalError) in
            try await connection.execute(
                sql,
                [.text(RelayTokens.hash(token)), .text(cluster), .text(label), .integer(Self.now())]
            )
        }
        return token
    }

    /// See ``RelayStorage/revokeTokens(matching:wholeCluster:)``.
    func revokeTokens(matching token: String, wholeCluster: Bool) async throws(ShoalError) -> Int {
        let now = Self.now()
        let sql =
            wholeCluster
            ? "UPDATE \(table("tokens")) SET revoked = $1 WHERE cluster = $2 AND revoked IS NULL RETURNING 1"
            : """
            UPDATE \(table("tokens")) SET revoked = $1 WHERE (hash = $2 OR hash = $3) AND revoked IS NULL
            RETURNING 1
            """
        let arguments: [SQLValue] =
            wholeCluster
            ? [.integer(now), .text(token)] : [.integer(now), .text(RelayTokens.hash(token)), .text(token)]
        return try await database.read("revoke tokens") { connection throws(ShoalError) in
            try await connection.query(sql, arguments).count
        }
    }

    /// See ``RelayStorage/tokens()``.
    func tokens() async throws(ShoalError) -> [RelayToken] {
        let sql = "SELECT hash, cluster, label, created, revoked, rotated FROM \(table("tokens")) ORDER BY created"
        return try await database.read("list tokens") { connection throws(ShoalError) in
            try await connection.query(sql, []).map(Self.token(row:))
        }
    }

    /// See ``RelayStorage/token(hash:)``.
    func token(hash: String) async throws(ShoalError) -> RelayToken? {
        let sql = "SELECT hash, cluster, label, created, revoked, rotated FROM \(table("tokens")) WHERE hash = $1"
        return try await database.read("look a token up") { connection throws(ShoalError) in
            try await connection.query(sql, [.text(hash)]).first.map(Self.token(row:))
        }
    }

    private static func token(row: [SQLValue]) -> RelayToken {
        RelayToken(
            hash: row[0].relayText,
            cluster: row[1].relayText,
            label: row[2].relayText,
            created: row[3].relayInteger,
            revoked: row[4].relayOptionalInteger,
            rotatedAtEpoch: row[5].relayOptionalInteger.map { UInt32(truncatingIfNeeded: $0) }
        )
    }

    // MARK: Heads

    /// See ``RelayStorage/heads(cluster:)``.
    func heads(cluster: String) async throws(ShoalError) -> VersionVector {
        try await database.read("read heads") { connection throws(ShoalError) in
            try await heads(connection, cluster: cluster)
        }
    }

    /// The head per site of the cluster's change log: where each site's chain of ranges ends.
    func heads(_ connection: Database.Connection, cluster: String) async throws(ShoalError) -> VersionVector {
        Self.vector(
            try await connection.query("SELECT site, head FROM \(table("heads")) WHERE cluster = $1", [.text(cluster)])
        )
    }

    /// The head per site of the change log (`snapshot` 0) or of a snapshot: where its chain of ranges ends.
    func heads(
        _ connection: Database.Connection,
        cluster: String,
        snapshot: Int64
    ) async throws(ShoalError)
        -> VersionVector
    {
        guard snapshot != 0 else { return try await heads(connection, cluster: cluster) }
        let sql = "SELECT site, max(to_seq) FROM \(table("ranges")) WHERE cluster = $1 AND snapshot = $2 GROUP BY site"
        return Self.vector(try await connection.query(sql, [.text(cluster), .integer(snapshot)]))
    }

    /// The vector of rows of (site, sequence number).
    static func vector(_ rows: [[SQLValue]]) -> VersionVector {
        var vector = VersionVector()
        for row in rows {
            if let site = SiteID(bytes: row[0].relayBytes) {
                vector.advance(site, to: UInt64(bitPattern: row[1].relayInteger))
            }
        }
        return vector
    }

    // MARK: Uploads

    /// See ``RelayStorage/store(cluster:snapshot:envelopes:uploader:)``.
    func store(
        cluster: String,
        snapshot: UInt64,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult {
        let snapshot = Int64(bitPattern: snapshot)
        let items = envelopes.map { RelayStoredChunk(envelope: $0.envelope, encoded: $0.encoded) }
        return try await database.write(cluster: cluster, "store change sets") { connection throws(ShoalError) in
            var heads = try await heads(connection, cluster: cluster, snapshot: snapshot)
            var result = RelayUploadResult(stored: 0, alreadyHeld: 0, gaps: 0, heads: [:])
            let now = Self.now()
            for item in items {
                let envelope = item.envelope
                let head = heads[envelope.site]
                if envelope.from < head {
                    result.alreadyHeld += 1
                    continue
                }
                if envelope.from > head {
                    result.gaps += 1
                    continue
                }
                let key: [SQLValue] = [
                    .text(cluster), .integer(snapshot), .blob(envelope.site.bytes), .unsigned(envelope.from),
                ]
                let upload = SQLValue.unsigned(envelope.upload)
                let index = Int64(envelope.index)
                let inserted = try await connection.query(
                    """
                    INSERT INTO \(table("chunks"))(cluster, snapshot, site, from_seq, upload, idx, envelope, created)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1
                    """,
                    key + [upload, .integer(index), .blob(item.encoded), .integer(now)]
                )
                if inserted.count == 1 { result.stored += 1 } else { result.alreadyHeld += 1 }
                guard envelope.endsRange else { continue }
                let count = try await connection.query(
                    """
                    SELECT count(*), CAST(coalesce(sum(length(envelope)), 0) AS BIGINT) FROM \(table("chunks"))
                    WHERE cluster = $1 AND snapshot = $2 AND site = $3 AND from_seq = $4 AND upload = $5 AND idx <= $6
                    """,
                    key + [upload, .integer(index)]
                )
                guard count.first?[0].relayInteger == index + 1 else {
                    // An earlier chunk of this upload never arrived: the uploader sends the range again.
                    result.gaps += 1
                    continue
                }
                try await connection.execute(
                    """
                    INSERT INTO \(table("ranges"))(cluster, snapshot, site, from_seq, to_seq, upload, chunks, bytes,
                    created, uploader) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                    """,
                    key + [
                        .unsigned(envelope.to), upload, .integer(index + 1), .integer(count[0][1].relayInteger),
                        .integer(now), uploader.map { .text($0) } ?? .null,
                    ]
                )
                // Chunks of other uploads of the same range (an uploader that gave up, or lost a race) go.
                try await connection.execute(
                    """
                    DELETE FROM \(table("chunks")) WHERE cluster = $1 AND snapshot = $2 AND site = $3 AND from_seq = $4
                    AND upload != $5
                    """,
                    key + [upload]
                )
                if snapshot == 0 {
                    try await connection.execute(
                        """
                        INSERT INTO \(table("heads"))(cluster, site, head) VALUES ($1, $2, $3)
                        ON CONFLICT(cluster, site) DO UPDATE SET head = excluded.head
                        """,
                        [.text(cluster), .blob(envelope.site.bytes), .unsigned(envelope.to)]
                    )
                }
                heads.advance(envelope.site, to: envelope.to)
            }
            if result.stored > 0 && snapshot == 0 { try await database.notify(connection, cluster: cluster) }
            result.heads = RelayAPI.json(heads)
            return result
        }
    }

    // MARK: Operators

    /// See ``RelayStorage/ping()``.
    func ping() async throws(ShoalError) {
        try await database.read("answer") { connection throws(ShoalError) in
            try await connection.execute("SELECT 1", [])
        }
    }

    /// See ``RelayStorage/statistics()``.
    func statistics() async throws(ShoalError) -> [RelayClusterStatistics] {
        let sql = """
            SELECT cluster, count(DISTINCT site), count(*), CAST(sum(chunks) AS BIGINT), CAST(sum(bytes) AS BIGINT)
            FROM \(table("ranges")) GROUP BY cluster ORDER BY cluster
            """
        return try await database.read("count what the relay holds") { connection throws(ShoalError) in
            try await connection.query(sql, []).map { row in
                RelayClusterStatistics(
                    cluster: row[0].relayText,
                    sites: Int(row[1].relayInteger),
                    ranges: Int(row[2].relayInteger),
                    chunks: Int(row[3].relayInteger),
                    bytes: row[4].relayInteger
                )
            }
        }
    }

    /// See ``RelayStorage/sweep(before:)``.
    func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int {
        let chunks = table("chunks")
        let ranges = table("ranges")
        let snapshots = table("snapshots")
        return try await database.read("sweep incomplete uploads") { connection throws(ShoalError) in
            // Chunks of ranges never completed, and the ranges of snapshots never completed.
            let swept = try await connection.query(
                """
                DELETE FROM \(chunks) WHERE created < $1 AND (NOT EXISTS (
                    SELECT 1 FROM \(ranges) r WHERE r.cluster = chunks.cluster AND r.snapshot = chunks.snapshot
                        AND r.site = chunks.site AND r.from_seq = chunks.from_seq AND r.upload = chunks.upload)
                    OR (snapshot != 0 AND NOT EXISTS (
                        SELECT 1 FROM \(snapshots) s
                        WHERE s.cluster = chunks.cluster AND s.snapshot = chunks.snapshot)))
                RETURNING 1
                """,
                [.integer(milliseconds)]
            ).count
            try await connection.execute(
                """
                DELETE FROM \(ranges) WHERE snapshot != 0 AND created < $1 AND NOT EXISTS (
                    SELECT 1 FROM \(snapshots) s WHERE s.cluster = ranges.cluster AND s.snapshot = ranges.snapshot)
                """,
                [.integer(milliseconds)]
            )
            return swept
        }
    }
}

/// One chunk of an upload as the rules store it: the envelope's header fields, and its bytes exactly as uploaded
/// (what a pull hands back; the seal covers them).
struct RelayStoredChunk: Sendable {
    var envelope: RelayEnvelope
    var encoded: [UInt8]
}
