import ShoalCore
import ShoalProtocol
import ShoalStore

extension SerializedStore {
    /// Answers an inspection request from the store, read-only (the digest is brought up to date first, as any read
    /// of it does).
    func inspect(_ request: InspectionRequest) throws(ShoalError) -> InspectionAnswer {
        switch request.query {
        case .tables:
            let (vector, digest, tables) = try read { store throws(ShoalError) in try store.tableDigests() }
            return InspectionAnswer(
                requestID: request.requestID,
                content: .tables(
                    versionVector: vector,
                    digest: digest.bytes,
                    tables: tables.map { table in
                        TableSummary(
                            name: table.name,
                            keyColumns: table.keyColumns,
                            digest: table.digest.bytes,
                            rows: table.digest.rowCount
                        )
                    }
                )
            )
        case .rows(let table, let after, let limit):
            let page = min(Int(limit), Int(WireProtocol.maximumInspectionPage))
            let (rows, isLast) = try read { store throws(ShoalError) in
                let found = try store.rowHashes(of: table, after: after, limit: page)
                return (found.rows.map { RowHash(key: $0.key, hash: $0.hash) }, found.isLast)
            }
            return InspectionAnswer(
                requestID: request.requestID,
                content: .rows(table: table, rows: rows, isLast: isLast)
            )
        }
    }
}

extension SerializedStore {
    /// The hello this node sends its peers.
    func hello(clusterID: String, nodeName: String?, listenPort: UInt16) throws(ShoalError) -> Hello {
        try read { store throws(ShoalError) in
            let stored = try store.nodeName()
            return Hello(
                clusterID: clusterID,
                siteID: store.identitySiteID,
                nodeName: nodeName ?? stored ?? "shoal",
                schemaFingerprint: try store.schemaFingerprint(),
                listenPort: listenPort
            )
        }
    }

    /// The version vector and, if the cached digest is current, the digest, read together: what a peer's
    /// acknowledgement (its vector and digest) is compared with.
    func comparableState() throws(ShoalError) -> (versionVector: VersionVector, digest: StateDigest?) {
        guard let digest = comparableDigest() else { return (latestVersionVector.withLock { $0 }, nil) }
        return (try versionVector(), digest)
    }
}
