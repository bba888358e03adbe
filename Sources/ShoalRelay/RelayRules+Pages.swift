import ShoalCore
import ShoalRelayProtocol

extension RelayRules {
    /// See ``RelayStorage/page(cluster:vector:resume:snapshotSites:maximumBytes:uploader:)``.
    func page(
        cluster: String,
        vector: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        snapshotSites: Set<SiteID>,
        maximumBytes: Int,
        uploader: String?
    ) async throws(ShoalError) -> RelayPage {
        let resume = resume.mapValues { RelayResumePoint(from: $0.from, index: $0.index) }
        return try await database.read("read change sets") { connection throws(ShoalError) in
            var page = RelayPageBuilder(
                rules: self,
                connection: connection,
                cluster: cluster,
                resume: resume,
                maximumBytes: maximumBytes,
                uploader: uploader
            )
            let heads = try await heads(connection, cluster: cluster)
            let snapshot = try await snapshot(connection, cluster: cluster)
            for (site, head) in heads.sorted where head > vector[site] {
                var after = vector[site]
                // The first range of the log that the node still lacks part of: starting after what it holds, the log
                // serves it; starting later (the retention dropped what came before, or a hole), or for a site the
                // node asks from the snapshot, the snapshot's ranges of the site go first, then the log's after what
                // the snapshot covers.
                let floor = try await connection.query(
                    """
                    SELECT min(from_seq) FROM \(table("ranges")) WHERE cluster = $1 AND snapshot = 0 AND site = $2
                    AND to_seq > $3
                    """,
                    [.text(cluster), .blob(site.bytes), .unsigned(min(after, UInt64(Int64.max)))]
                )
                let held = floor.first?[0].relayOptionalInteger.map { UInt64(bitPattern: $0) } ?? head
                if after < held || snapshotSites.contains(site), let snapshot, snapshot.vector[site] > after {
                    guard try await page.add(Int64(bitPattern: snapshot.id), site, after: after) else { break }
                    after = snapshot.vector[site]
                }
                guard try await page.add(0, site, after: after) else { break }
            }
            return page.page
        }
    }
}

/// Where a pull resumes inside a range: its start and the first chunk the node lacks.
struct RelayResumePoint: Sendable {
    var from: UInt64
    var index: UInt32
}

/// A page of a pull as it fills: chunks in the order of their ranges, up to about its byte budget.
struct RelayPageBuilder<Database: RelayDatabase> {
    let rules: RelayRules<Database>
    let connection: Database.Connection
    let cluster: String
    let resume: [SiteID: RelayResumePoint]
    let maximumBytes: Int
    let uploader: String?
    private(set) var page = RelayPage(envelopes: [], more: false)
    private var bytes = 0

    init(
        rules: RelayRules<Database>,
        connection: Database.Connection,
        cluster: String,
        resume: [SiteID: RelayResumePoint],
        maximumBytes: Int,
        uploader: String?
    ) {
        self.rules = rules
        self.connection = connection
        self.cluster = cluster
        self.resume = resume
        self.maximumBytes = maximumBytes
        self.uploader = uploader
    }

    /// Adds the ranges of `site` in `source` (0: the change log, else a snapshot) that end after `after`; false once
    /// the page is full.
    mutating func add(_ source: Int64, _ site: SiteID, after: UInt64) async throws(ShoalError) -> Bool {
        let ranges = try await connection.query(
            """
            SELECT from_seq, upload, uploader, chunks FROM \(rules.table("ranges")) WHERE cluster = $1
            AND snapshot = $2 AND site = $3 AND to_seq > $4 ORDER BY from_seq
            """,
            [.text(cluster), .integer(source), .blob(site.bytes), .unsigned(min(after, UInt64(Int64.max)))]
        )
        for range in ranges {
            // What the asking process uploaded itself it holds: left out (a range of its own follows another of its
            // own, or one the node gets, since it holds what it uploads, from the cursor on).
            if let uploader, range[2].relayOptionalText == uploader { continue }
            let from = range[0].relayInteger
            var first: Int64 = 0
            if let point = resume[site], point.from == UInt64(bitPattern: from) { first = Int64(point.index) }
            let key: [SQLValue] = [.text(cluster), .integer(source), .blob(site.bytes), .integer(from), range[1]]
            // The chunks' sizes first, so that the page reads no chunk it would not send; only the range's own
            // chunks (a chunk of its upload numbered past its last is no part of it).
            let sizes = try await connection.query(
                """
                SELECT idx, CAST(length(envelope) AS BIGINT) FROM \(rules.table("chunks")) WHERE cluster = $1
                AND snapshot = $2 AND site = $3 AND from_seq = $4 AND upload = $5 AND idx >= $6 AND idx < $7
                ORDER BY idx
                """,
                key + [.integer(first), range[3]]
            )
            var last: Int64?
            var full = false
            for size in sizes {
                if bytes > 0 && bytes >= maximumBytes {
                    full = true
                    break
                }
                bytes += Int(size[1].relayInteger)
                last = size[0].relayInteger
            }
            if let last {
                let chunks = try await connection.query(
                    """
                    SELECT envelope FROM \(rules.table("chunks")) WHERE cluster = $1 AND snapshot = $2 AND site = $3
                    AND from_seq = $4 AND upload = $5 AND idx >= $6 AND idx <= $7 ORDER BY idx
                    """,
                    key + [.integer(first), .integer(last)]
                )
                page.envelopes += chunks.map { $0[0].relayBytes }
            }
            if full {
                page.more = true
                return false
            }
        }
        return true
    }
}
