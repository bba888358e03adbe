import ShoalCore
import ShoalRelayProtocol

extension RelayRules {
    /// The cluster's newest complete snapshot.
    func snapshot(_ connection: Database.Connection, cluster: String) async throws(ShoalError) -> RelaySnapshot? {
        let rows = try await connection.query(
            """
            SELECT snapshot, vector, bytes, created FROM \(table("snapshots")) WHERE cluster = $1
            ORDER BY created DESC LIMIT 1
            """,
            [.text(cluster)]
        )
        return rows.first.map { row in
            RelaySnapshot(
                id: UInt64(bitPattern: row[0].relayInteger),
                vector: RelaySnapshotVector.decode(row[1].relayText),
                bytes: row[2].relayInteger,
                created: row[3].relayInteger
            )
        }
    }

    /// See ``RelayStorage/completeSnapshot(cluster:snapshot:vector:retention:)``.
    func completeSnapshot(
        cluster: String,
        snapshot: UInt64,
        vector: VersionVector,
        retention: RelayRetention
    )
        async throws(ShoalError) -> RelaySnapshotOutcome
    {
        let id = Int64(bitPattern: snapshot)
        return try await database.write(cluster: cluster, "complete a snapshot") { connection throws(ShoalError) in
            let heads = try await heads(connection, cluster: cluster, snapshot: id)
            if let missing = RelaySnapshotVector.mismatch(heads: heads, vector: vector) { return .incomplete(missing) }
            let size = try await connection.query(
                """
                SELECT CAST(coalesce(sum(bytes), 0) AS BIGINT) FROM \(table("ranges"))
                WHERE cluster = $1 AND snapshot = $2
                """,
                [.text(cluster), .integer(id)]
            )
            let now = Self.now()
            try await connection.execute(
                """
                INSERT INTO \(table("snapshots"))(cluster, snapshot, vector, bytes, created) VALUES ($1, $2, $3, $4, $5)
                ON CONFLICT(cluster, snapshot) DO UPDATE SET vector = excluded.vector, bytes = excluded.bytes,
                created = excluded.created
                """,
                [
                    .text(cluster), .integer(id), .text(RelaySnapshotVector.encode(vector)),
                    .integer(size.first?[0].relayInteger ?? 0), .integer(now),
                ]
            )
            // The snapshots before it go: complete ones, and those still under way that started earlier.
            for name in ["chunks", "ranges"] {
                try await connection.execute(
                    """
                    DELETE FROM \(table(name)) WHERE cluster = $1 AND snapshot != 0 AND snapshot != $2
                    AND created <= $3
                    """,
                    [.text(cluster), .integer(id), .integer(now)]
                )
            }
            try await connection.execute(
                "DELETE FROM \(table("snapshots")) WHERE cluster = $1 AND snapshot != $2",
                [.text(cluster), .integer(id)]
            )
            return .completed(dropped: try await retain(connection, cluster: cluster, retention))
        }
    }

    /// Drops the ranges of `cluster`'s change log that its snapshot covers and `retention` lets go (oldest first:
    /// per site a prefix of its chain, so what is kept still runs on from the snapshot); returns how many went.
    func retain(
        _ connection: Database.Connection,
        cluster: String,
        _ retention: RelayRetention
    )
        async throws(ShoalError) -> Int
    {
        guard let snapshot = try await snapshot(connection, cluster: cluster) else { return 0 }
        let rows = try await connection.query(
            """
            SELECT site, from_seq, upload, to_seq, bytes, created FROM \(table("ranges")) WHERE cluster = $1
            AND snapshot = 0 ORDER BY created DESC, site, from_seq DESC
            """,
            [.text(cluster)]
        )
        let ranges = rows.compactMap { row -> RetainedRange? in
            guard let site = SiteID(bytes: row[0].relayBytes) else { return nil }
            return RetainedRange(
                site: site,
                from: row[1].relayInteger,
                upload: row[2].relayInteger,
                to: UInt64(bitPattern: row[3].relayInteger),
                bytes: row[4].relayInteger,
                created: row[5].relayInteger
            )
        }
        let drops = retention.drops(ranges, snapshot: snapshot.vector, now: Self.now())
        for range in drops {
            let key: [SQLValue] = [.text(cluster), .blob(range.site.bytes), .integer(range.from)]
            try await connection.execute(
                "DELETE FROM \(table("ranges")) WHERE cluster = $1 AND snapshot = 0 AND site = $2 AND from_seq = $3",
                key
            )
            try await connection.execute(
                """
                DELETE FROM \(table("chunks")) WHERE cluster = $1 AND snapshot = 0 AND site = $2 AND from_seq = $3
                AND upload = $4
                """,
                key + [.integer(range.upload)]
            )
        }
        return drops.count
    }

    /// See ``RelayStorage/snapshotState(cluster:)``.
    func snapshotState(cluster: String) async throws(ShoalError) -> RelaySnapshotState {
        try await database.read("read the snapshot") { connection throws(ShoalError) in
            let snapshot = try await snapshot(connection, cluster: cluster)
            let rows = try await connection.query(
                "SELECT site, to_seq, bytes FROM \(table("ranges")) WHERE cluster = $1 AND snapshot = 0",
                [.text(cluster)]
            )
            var uncovered: Int64 = 0
            for row in rows {
                guard let site = SiteID(bytes: row[0].relayBytes) else { continue }
                if UInt64(bitPattern: row[1].relayInteger) > snapshot?.vector[site] ?? 0 {
                    uncovered += row[2].relayInteger
                }
            }
            return RelaySnapshotState(snapshot: snapshot, uncoveredBytes: uncovered)
        }
    }

    /// See ``RelayStorage/retain(_:)``.
    func retain(_ retention: RelayRetention) async throws(ShoalError) -> Int {
        let clusters = try await database.read("list clusters") { connection throws(ShoalError) in
            try await connection.query("SELECT DISTINCT cluster FROM \(table("snapshots"))", []).map { $0[0].relayText }
        }
        var dropped = 0
        for cluster in clusters {
            dropped += try await database.write(cluster: cluster, "drop covered change sets") {
                connection throws(ShoalError) in
                try await retain(connection, cluster: cluster, retention)
            }
        }
        return dropped
    }
}

/// A cluster's newest complete snapshot, and the bytes of change sets it does not cover.
struct RelaySnapshotState: Sendable {
    var snapshot: RelaySnapshot?
    var uncoveredBytes: Int64
}
