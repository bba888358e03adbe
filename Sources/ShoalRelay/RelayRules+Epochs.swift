import ShoalCore
import ShoalRelayProtocol

extension RelayRules {
    /// See ``RelayStorage/rotate(cluster:epoch:tokenHash:grants:uploadKey:)``.
    func rotate(
        cluster: String,
        epoch: UInt32,
        tokenHash: String,
        grants: [RelayGrant],
        uploadKey: [UInt8]?
    )
        async throws(ShoalError) -> RelayRotationOutcome
    {
        try await database.write(cluster: cluster, "rotate the key epoch") { connection throws(ShoalError) in
            let current = try await currentEpoch(connection, cluster: cluster)
            guard epoch == current + 1 else { return .taken(current: current) }
            let now = Self.now()
            let epochValue = SQLValue.integer(Int64(epoch))
            try await connection.execute(
                "INSERT INTO \(table("epochs"))(cluster, epoch, created) VALUES ($1, $2, $3)",
                [.text(cluster), epochValue, .integer(now)]
            )
            _ = try await insertGrants(connection, cluster: cluster, grants.filter { $0.epoch == epoch })
            if let uploadKey {
                try await connection.execute(
                    """
                    INSERT INTO \(table("upload_keys"))(cluster, epoch, key) VALUES ($1, $2, $3)
                    ON CONFLICT(cluster, epoch) DO UPDATE SET key = excluded.key
                    """,
                    [.text(cluster), epochValue, .blob(uploadKey)]
                )
            }
            try await connection.execute(
                "UPDATE \(table("tokens")) SET revoked = $1, rotated = $2 WHERE cluster = $3 AND revoked IS NULL",
                [.integer(now), epochValue, .text(cluster)]
            )
            try await connection.execute(
                """
                INSERT INTO \(table("tokens"))(hash, cluster, label, created) VALUES ($1, $2, $3, $4)
                ON CONFLICT(hash) DO UPDATE SET cluster = excluded.cluster, label = excluded.label,
                created = excluded.created, revoked = NULL, rotated = NULL
                """,
                [.text(tokenHash), .text(cluster), .text("key epoch \(epoch)"), .integer(now)]
            )
            try await database.notify(connection, cluster: cluster)
            return .rotated
        }
    }

    /// See ``RelayStorage/uploadKey(cluster:epoch:)``.
    func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> RelayUploadKeyState {
        try await database.read("read an upload key") { connection throws(ShoalError) in
            let key = try await heldKey(connection, cluster: cluster, epoch: epoch)
            return RelayUploadKeyState(key: key, newest: try await currentEpoch(connection, cluster: cluster))
        }
    }

    /// See ``RelayStorage/registerUploadKey(cluster:epoch:key:)``.
    func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool {
        try await database.read("register an upload key") { connection throws(ShoalError) in
            try await connection.execute(
                "INSERT INTO \(table("upload_keys"))(cluster, epoch, key) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                [.text(cluster), .integer(Int64(epoch)), .blob(key)]
            )
            return try await heldKey(connection, cluster: cluster, epoch: epoch) == key
        }
    }

    private func heldKey(
        _ connection: Database.Connection,
        cluster: String,
        epoch: UInt32
    ) async throws(ShoalError)
        -> [UInt8]?
    {
        try await connection.query(
            "SELECT key FROM \(table("upload_keys")) WHERE cluster = $1 AND epoch = $2",
            [.text(cluster), .integer(Int64(epoch))]
        ).first.map { $0[0].relayBytes }
    }

    /// See ``RelayStorage/addGrants(cluster:grants:)``.
    func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int {
        try await database.write(cluster: cluster, "store key grants") { connection throws(ShoalError) in
            let current = try await currentEpoch(connection, cluster: cluster)
            let stored = try await insertGrants(
                connection,
                cluster: cluster,
                grants.filter { $0.epoch >= 1 && $0.epoch <= current }
            )
            if stored > 0 { try await database.notify(connection, cluster: cluster) }
            return stored
        }
    }

    /// See ``RelayStorage/grants(cluster:after:)``.
    func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants {
        try await database.read("read key grants") { connection throws(ShoalError) in
            let rows = try await connection.query(
                """
                SELECT epoch, recipient, body FROM \(table("grants")) WHERE cluster = $1 AND epoch > $2
                ORDER BY epoch, recipient
                """,
                [.text(cluster), .integer(Int64(epoch))]
            )
            let grants = rows.map { row in
                RelayGrant(
                    epoch: UInt32(truncatingIfNeeded: row[0].relayInteger),
                    recipient: row[1].relayText,
                    body: row[2].relayText
                )
            }
            return RelayGrants(grants: grants, epoch: try await currentEpoch(connection, cluster: cluster))
        }
    }

    /// The cluster's newest key epoch: 0 before any rotation.
    func currentEpoch(_ connection: Database.Connection, cluster: String) async throws(ShoalError) -> UInt32 {
        let rows = try await connection.query(
            "SELECT CAST(coalesce(max(epoch), 0) AS BIGINT) FROM \(table("epochs")) WHERE cluster = $1",
            [.text(cluster)]
        )
        return UInt32(truncatingIfNeeded: rows.first?[0].relayInteger ?? 0)
    }

    private func insertGrants(
        _ connection: Database.Connection,
        cluster: String,
        _ grants: [RelayGrant]
    )
        async throws(ShoalError) -> Int
    {
        var stored = 0
        for grant in grants {
            stored += try await connection.query(
                """
                INSERT INTO \(table("grants"))(cluster, epoch, recipient, body) VALUES ($1, $2, $3, $4)
                ON CONFLICT DO NOTHING RETURNING 1
                """,
                [.text(cluster), .integer(Int64(grant.epoch)), .text(grant.recipient), .text(grant.body)]
            ).count
        }
        return stored
    }
}

/// An epoch's upload key, if one was registered, and the cluster's newest epoch.
struct RelayUploadKeyState: Sendable {
    var key: [UInt8]?
    var newest: UInt32
}
