import ShoalCore
import ShoalStore

/// What another transport (the relay client) needs from a node: read the changes some version vector lacks, apply
/// changes it received, and hear when the node's data may have changed.
extension SyncNode {
    /// Starts reading what `since` lacks; batches then come from ``nextChangeBatch(_:maxChanges:maxBytes:)``.
    public func openChangeCursor(since: VersionVector) async throws(ShoalError) -> Int {
        try await worker.openCursor(since: since)
    }

    /// The next batch of a cursor (`nil` after the last), bounded as ``Store/nextBatch(_:maxChanges:maxBytes:)``.
    public func nextChangeBatch(_ cursor: Int, maxChanges: Int, maxBytes: Int) async throws(ShoalError) -> ChangeBatch? {
        try await worker.nextBatch(cursor, maxChanges: maxChanges, maxBytes: maxBytes)?.batch
    }

    /// Drops a cursor before its end.
    public func closeChangeCursor(_ cursor: Int) async {
        await worker.closeCursor(cursor)
    }

    /// Applies changes received by another way than a peer link (one transaction; the claim is taken as far as
    /// the changes, and those `received` earlier in the same range, prove it), then starts rounds so that connected
    /// peers get them at once. The result's `received` adds this batch's highest seqs to `received`.
    public func applyReceived(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64] = [:]
    ) async throws(ShoalError) -> (applied: Int, versionVector: VersionVector, received: [SiteID: UInt64]) {
        let result = try await worker.apply(batch, received: received)
        if result.applied > 0 { broadcast(.localChange) }
        if let (site, hlc) = result.clockRefusals.first {
            // What else the batch held is applied; the refused site's changes come again once time catches up.
            let now = configuration.clock.nowMilliseconds()
            throw ShoalError(
                code: .clockTooFarAhead,
                message: "changes of site \(site.hex.prefix(8)) carry a clock \(Int64(hlc.milliseconds) - Int64(now)) ms "
                    + "ahead of this node's (more than the \(configuration.storeOptions.maximumClockDriftMilliseconds) "
                    + "ms allowed): they were left out, everything else was applied"
            )
        }
        return (result.applied, result.versionVector, result.received)
    }

    /// What a relay holds (its heads, as the relay link last read them): it acknowledges this node's writes like a
    /// peer, in ``pendingLocalChanges()`` and the queue-depth metric. A relay that lost its storage reports less.
    public func relayHolds(_ heads: VersionVector) {
        relayHeads = heads
    }

    /// A signal each time the node's data may have changed: a local write (through the node or another process),
    /// changes applied from a peer, a periodic round. Ends when the node stops.
    public func changeSignals() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        nextChangeWatcher += 1
        let id = nextChangeWatcher
        changeWatchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.dropChangeWatcher(id) } }
        return stream
    }

    private func dropChangeWatcher(_ id: Int) {
        changeWatchers[id] = nil
    }

    func signalChangeWatchers() {
        for watcher in changeWatchers.values { watcher.yield() }
    }
}
