import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Pull

    /// The longest a site whose ranges keep failing is left aside before it is tried again.
    static let blockedSiteMilliseconds: UInt64 = 60_000

    /// Pulls pages and carries out what the pull session decides (``RelayPullSession``): the session checks each chunk,
    /// the link opens it with the seal and applies what the session hands back.
    func pullLoop(_ api: RelayAPIClient) async throws {
        let clock = configuration.clock
        var session = RelayPullSession(
            site: node.siteID,
            cluster: configuration.clusterID,
            backoff: configuration.backoff,
            blockMilliseconds: Self.blockedSiteMilliseconds
        )
        var backoff = configuration.backoff
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
                let wait = configuration.waitMilliseconds
                let request = session.request(
                    held: held, now: clock.nowMilliseconds(), wait: wait, maximumBytes: configuration.pageBytes
                )
                let asked = clock.monotonicMilliseconds()
                let entries = try await api.pull(request, waitMilliseconds: wait)
                session.answered(chunks: entries.count, after: clock.monotonicMilliseconds() &- asked)
                var applied = 0
                for entry in entries {
                    switch entry {
                    case .envelope(let envelope):
                        applied += try await receive(envelope, &session, api)
                    case .undecodable(let site, let error):
                        session.undecodable(site: site, error, now: clock.nowMilliseconds())
                    }
                }
                if let (claims, proof) = session.readyClaims() {
                    let result = try await local { () throws(ShoalError) in try await apply(claims, received: proof) }
                    session.held(result.held)
                }
                for problem in session.problems { note(problem) }
                let now = clock.nowMilliseconds()
                state.withLock { $0.pulled(chunks: entries.count, applied: applied, now: now) }
                if applied > 0 { report(.applied(changes: applied)) }
                metrics.pullOK.increment()
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
                if case .cancelled = error {} else { metrics.pullFailed.increment() }
                for problem in session.problems { note(problem) }
                session.failed()
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    /// Carries out what the session decides for one chunk; returns the changes applied.
    func receive(
        _ envelope: RelayEnvelope,
        _ session: inout RelayPullSession,
        _ api: RelayAPIClient
    ) async throws(RelayCallError) -> Int {
        var verdict = session.check(envelope, now: configuration.clock.nowMilliseconds())
        if verdict == .readHeld {
            // The ranges this process uploaded are not sent back: the node holds them, so its own version vector,
            // read now, covers what the page skipped.
            session.held(try await held())
            verdict = session.recheck(envelope, now: configuration.clock.nowMilliseconds())
        }
        guard verdict == .open else { return 0 }
        if !state.withLock({ $0.credentials.seal }).holds(envelope.epoch) {
            // Sealed with an epoch this node has not learnt yet: its grant is in the relay's mailbox.
            try await epochs(.newerGrants, api)
        }
        let seal = state.withLock { $0.credentials.seal }
        let plaintext = Result { () throws(ShoalError) in try seal.open(envelope) }
        let now = configuration.clock.nowMilliseconds()
        guard case .apply(let batch, let received) = session.opened(envelope, plaintext: plaintext, now: now) else {
            return 0
        }
        let result = try await local { () throws(ShoalError) in try await apply(batch, received: received) }
        session.applied(envelope, received: result.received, held: result.held)
        return result.applied
    }

    /// Applies changes from the relay through the node's store, in one transaction (the claim is taken as far as the
    /// changes, and those `received` earlier in the same range, prove it); their commit starts rounds with the node's
    /// peers. The result's `received` adds this batch's highest seqs to `received`.
    func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) async throws(ShoalError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64]) {
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
        return (result.applied, result.versionVector, result.received)
    }
}
