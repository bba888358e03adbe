import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

/// A fresh state through the relay alone (see `SyncNode+FreshState.swift`): the relay's whole state is read from the
/// empty vector, as a node never online before would pull it (the snapshot's ranges, then the change log after them),
/// and only the key of every row a change names is kept. A row the node holds that no change there names was deleted
/// and collected before the snapshot was taken (a snapshot holds every other row, alive or as a tombstone).
extension RelayLink {
    /// Reads the relay's whole state for a fresh state: its heads when the read began, and the keys of every row its
    /// changes name. Fails unless the read reached those heads (a site it could not open, say). Reads nothing unless
    /// the relay's snapshot covers `snapshotCovering` (the answer then says what it covers, and names no row).
    func readStateForFreshState(
        _ api: RelayAPIClient,
        snapshotCovering: VersionVector
    ) async throws(RelayCallError) -> RelayStateKeys {
        let heads = try await fetchHeads(api)
        let snapshot = state.withLock { $0.snapshotVector }
        guard snapshot.dominatesOrEquals(snapshotCovering) else {
            return RelayStateKeys(heads: heads, keys: [:], snapshot: snapshot)
        }
        configuration.logger.notice(
            "reading what the relay holds, from the start, to take a fresh state through it",
            metadata: ["heads": "\(heads)"]
        )
        var session = configuration.pullSession(site: node.siteID)
        var endpoint = StateReadingEndpoint(link: Endpoint(link: self, api: api))
        // Its own writes made while suspended name rows they may have written after those were collected.
        endpoint.ownSuspendedWrites = try await local { () throws(ShoalError) in
            try await node.store.read { store throws(ShoalError) in
                try store.ownSuspendedWritesAfter().map { (store.siteID, $0) }
            }
        }
        var stalled = 0
        while !endpoint.covers(heads), stalled < Self.stateReadStalledPages {
            let before = endpoint.covered
            var request = session.request(
                held: before, now: configuration.clock.nowMilliseconds(), wait: 0,
                maximumBytes: configuration.pageBytes
            )
            // Every site from the snapshot first: the change log's first ranges may still be kept, and they name rows
            // collected since, whose deletes may never have reached the relay.
            var sites = Set(request.snapshotSites ?? [])
            for site in snapshot.entries.keys.sorted() where sites.count < RelayPullRequest.maximumSnapshotSites {
                sites.insert(RelayAPI.key(site))
            }
            request.snapshotSites = sites.isEmpty ? nil : sites.sorted()
            let entries = try await api.pull(request, waitMilliseconds: 0)
            _ = try await RelayPullDriver.deliver(entries, &session, &endpoint)
            if entries.isEmpty { break }
            stalled = endpoint.covered == before ? stalled + 1 : 0
        }
        for problem in session.problems { note(problem) }
        guard endpoint.covers(heads) else {
            throw .refused(
                "the relay's state could not be read whole (read \(endpoint.read), served \(endpoint.served), heads \(heads))"
            )
        }
        return RelayStateKeys(heads: heads, keys: endpoint.keys, snapshot: snapshot)
    }

    /// Pages in a row that moved the read no further end a read of the relay's state.
    static let stateReadStalledPages = 5
}

/// Carries out a pull session's decisions without applying anything: each batch's rows are noted by key, and what
/// the read holds is what the batches' claims prove (as the store takes them, ``Store/apply(_:received:origin:)``).
struct StateReadingEndpoint: RelayPullEndpoint {
    var link: RelayLink.Endpoint
    /// What the read covers so far.
    var read = VersionVector()
    /// Per table, the encoded keys of the rows the changes read name.
    var keys: [String: Set<[UInt8]>] = [:]
    /// The ends of the ranges the relay served whole (``RelayPullSession/takeServed()``). A site whose newest
    /// transactions were all overwritten (a notice rewritten by another node, say) is never proven further by the
    /// changes read: every change of those ranges was read all the same.
    var served = VersionVector()
    /// This node's site, and the seq after which its writes were made while it was suspended: its updates since prove
    /// no row lives (``Store/ownSuspendedWritesAfter()``).
    var ownSuspendedWrites: (site: SiteID, after: UInt64)?

    /// What the read covers: what the changes proved, and the ranges served whole. (A range's claim counts in a
    /// node's store only once the ranges of the other sites it names are applied; read from the empty vector, many
    /// ranges wait so on each other, and the read, asking from what it proved, was served its first page again and
    /// again.)
    var covered: VersionVector { read.merging(served) }

    /// Whether the read covers `heads`.
    func covers(_ heads: VersionVector) -> Bool { covered.dominatesOrEquals(heads) }

    func nowMilliseconds() -> UInt64 { link.nowMilliseconds() }

    func held() async throws(RelayCallError) -> VersionVector { covered }

    mutating func seal(opening epoch: UInt32) async throws(RelayCallError) -> RelaySeal {
        try await link.seal(opening: epoch)
    }

    mutating func relayServed(_ served: VersionVector) { self.served.merge(served) }

    mutating func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) async throws(RelayCallError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>) {
        var highest = received
        for change in batch.changes {
            highest[change.stamp.site] = max(highest[change.stamp.site] ?? 0, change.stamp.seq)
            // Its own updates made while suspended prove nothing: a collector may have left them out.
            if let own = ownSuspendedWrites, change.stamp.site == own.site, change.stamp.seq > own.after {
                switch change.payload {
                case .counter: continue
                case .column where change.previous != nil: continue
                default: break
                }
            }
            keys[change.table, default: []].insert(SQLValue.encodeKey(change.primaryKey))
        }
        // A claim is taken only as far as the changes received prove it.
        for (site, claimed) in batch.claim.entries {
            read.advance(site, to: min(claimed, max(read[site], highest[site] ?? 0)))
        }
        return (batch.changes.count, covered, highest, [])
    }
}
