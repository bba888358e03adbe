import ShoalCore

/// The node's metrics that are sampled rather than counted, and the handles of each peer's.
///
/// Counted as they happen, by the connections' drivers and the store worker: rounds finished and failed, their
/// durations, changes applied, catch-up progress, conflicts by table. Sampled here every
/// ``NodeConfiguration/metricsIntervalMilliseconds`` from what the node holds in memory (no database access, nothing
/// on a connection's path): the queue depth (``pendingLocalChanges()``, what `shoal status` reports as pending),
/// connected peers, diverged peers, and for each peer that ever connected whether it diverged, its gap (transactions it
/// lacks, by the last version vector
/// it acknowledged) and its staleness (how long this node has held the oldest change it lacks).
extension SyncNode {
    func sampleMetricsPeriodically() async throws {
        while !Task.isCancelled {
            sampleMetrics()
            try await Task.sleep(for: .milliseconds(configuration.metricsIntervalMilliseconds))
        }
    }

    /// Records the vector held now and updates the sampled gauges.
    func sampleMetrics() {
        let held = worker.latestVersionVector.withLock { $0 }
        let now = configuration.clock.monotonicMilliseconds()
        vectorHistory.record(held, at: now)
        nodeMetrics.queue.record(pendingLocalChanges())
        var connected = 0
        for peer in directory.acknowledgedVectors() {
            if peer.connected { connected += 1 }
            let handles = nodeMetrics.peer(peer.site)
            handles.diverged.record(divergenceWatch.diverged[peer.site] == nil ? 0 : 1)
            var gap: UInt64 = 0
            for (site, seq) in held.entries where seq > peer.vector[site] { gap += seq - peer.vector[site] }
            handles.gap.record(Double(gap))
            handles.staleness.record(Double(vectorHistory.ageOfOldestLacking(peer.vector, now: now)) / 1000)
        }
        nodeMetrics.connected.record(connected)
        nodeMetrics.diverged.record(divergenceWatch.diverged.count)
        nodeMetrics.collectionWaiting.record(waitingMembers(held: held).count)
    }

    /// How long (in milliseconds) this node has held the oldest change that a holder of `vector` lacks: 0 when it
    /// lacks nothing. Exact to the sampling interval over recent history, coarser for older changes, and counted
    /// at most from the node's start. The relay link reports the relay's staleness with it.
    public func ageOfOldestChangeLacking(in vector: VersionVector) -> UInt64 {
        vectorHistory.ageOfOldestLacking(vector, now: configuration.clock.monotonicMilliseconds())
    }

    /// What this node sent of its changes to its peers since it started: frames of change batches and value pieces,
    /// their bytes on the links and the bytes they held before compression.
    public nonisolated var changeTraffic: ChangeTraffic { trafficCounter.current }

    /// The metrics of `peer` (made at its first use).
    func metrics(for peer: SiteID) -> PeerMetrics {
        nodeMetrics.peer(peer)
    }
}
