import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Pull

    /// Pulls pages and hands each to the pull driver (``RelayPullDriver``), which carries out what the pull session
    /// decides (``RelayPullSession``).
    func pullLoop(_ api: RelayAPIClient) async throws {
        let clock = configuration.clock
        var session = configuration.pullSession(site: node.siteID)
        var backoff = configuration.backoff
        var endpoint = Endpoint(link: self, api: api)
        while !Task.isCancelled {
            do throws(RelayCallError) {
                try await epochs(.grantsIfNeeded, api)
                if session.headsDue {
                    let heads = try await fetchHeads(api)
                    if session.headsRead(heads, held: try await held()) {
                        state.withLock { $0.headsStale = true }
                        pushWake.yield()
                    }
                }
                let held = try await held()
                session.held(held)
                let fences = try await local { () throws(ShoalError) in
                    try await node.store.read { store throws(ShoalError) in try store.fences() }
                }
                session.fences(fences)
                // Until pulled up, a page is asked for without waiting: an empty one says there is nothing more.
                let wait = pulledUp.withLock { $0 } ? configuration.waitMilliseconds : 0
                let request = session.request(
                    held: held, now: clock.nowMilliseconds(), wait: wait, maximumBytes: configuration.pageBytes
                )
                let asked = clock.monotonicMilliseconds()
                let entries = try await api.pull(request, waitMilliseconds: wait)
                session.answered(chunks: entries.count, after: clock.monotonicMilliseconds() &- asked)
                let applied = try await RelayPullDriver.deliver(entries, &session, &endpoint)
                await node.relayBrought(session.counted)
                for problem in session.problems { note(problem) }
                let now = clock.nowMilliseconds()
                state.withLock { $0.pulled(chunks: entries.count, applied: applied, now: now) }
                if applied > 0 { report(.applied(changes: applied)) }
                if entries.isEmpty { await setPulledUp(true) }
                metrics.pulled(ok: true)
                metrics.applied.increment(by: applied)
                backoff.reset()
                if let wait = session.pageEnded() {
                    do {
                        try await Task.sleep(for: .milliseconds(wait))
                    } catch {
                        throw RelayCallError.cancelled
                    }
                }
            } catch {
                if case .cancelled = error {} else {
                    metrics.pulled(ok: false)
                    await setPulledUp(false)
                }
                for problem in session.problems { note(problem) }
                session.failed()
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    /// Applies changes from the relay through the node's store, in one transaction (the claim is taken as far as the
    /// changes, and those `received` earlier in the same range, prove it); their commit starts rounds with the node's
    /// peers. The result's `received` adds this batch's highest seqs to `received`.
    func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) async throws(ShoalError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>) {
        let result = try await node.store.apply(batch, received: received, origin: .relay)
        if !result.conflictsByTable.isEmpty { NodeMetrics.countConflicts(result.conflictsByTable) }
        if let (site, hlc) = result.clockRefusals.first {
            // What else the batch held is applied; the refused site's changes come again once time catches up.
            let ahead = Int64(hlc.milliseconds) - Int64(configuration.clock.nowMilliseconds())
            let allowed = await node.configuration.storeOptions.maximumClockDriftMilliseconds
            throw ShoalError(
                code: .clockTooFarAhead,
                message: "changes of site \(site.hex.prefix(8)) carry a clock \(ahead) ms ahead of this node's (more "
                    + "than the \(allowed) ms allowed): they were left out, everything else was applied"
            )
        }
        return (result.applied, result.versionVector, result.received, result.fenced)
    }
}
