import Foundation
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
        var session = RelayPullSession(
            site: node.siteID,
            cluster: configuration.clusterID,
            backoff: Backoff(
                initialMilliseconds: configuration.initialBackoffMilliseconds,
                maximumMilliseconds: configuration.maximumBackoffMilliseconds
            ),
            blockMilliseconds: Self.blockedSiteMilliseconds
        )
        var backoff = Backoff(
            initialMilliseconds: configuration.initialBackoffMilliseconds,
            maximumMilliseconds: configuration.maximumBackoffMilliseconds
        )
        // After a failure the relay may come back having lost or rolled back its storage. Its heads are read before the
        // next long-poll (which would hide its return for the whole wait): if it lacks what this node holds, the
        // uploader is woken. Every failure is followed by this read, so the last one reaches the relay that serves the
        // pulls that follow.
        var checkHeads = false
        while !Task.isCancelled {
            do throws(RelayCallError) {
                try await refreshGrantsIfNeeded(api)
                if checkHeads {
                    let heads = try await fetchHeads(api)
                    let held = try await local { () throws(ShoalError) in try await node.store.versionVector() }
                    if held.entries.contains(where: { $0.value > heads[$0.key] }) {
                        state.withLock { $0.headsStale = true }
                        pushWake.yield()
                    }
                    checkHeads = false
                }
                let held = try await local { () throws(ShoalError) in try await node.store.versionVector() }
                session.held(held)
                session.fences(try await local { () throws(ShoalError) in try await node.store.read { store throws(ShoalError) in try store.fences() } })
                let request = session.request(
                    held: held,
                    now: configuration.clock.nowMilliseconds(),
                    wait: configuration.waitMilliseconds,
                    maximumBytes: configuration.pageBytes
                )
                let asked = configuration.clock.monotonicMilliseconds()
                let entries = try await api.pull(request, waitMilliseconds: configuration.waitMilliseconds)
                // An empty page long before the wait was up: the relay answered its waiting pulls as it shut down (it
                // may come back restored from an older copy, with no request of ours failing), or woke for an upload
                // with nothing for this node. Its heads are read before the next long-poll.
                if entries.isEmpty,
                    configuration.clock.monotonicMilliseconds() &- asked < UInt64(configuration.waitMilliseconds / 2)
                {
                    checkHeads = true
                }
                var applied = 0
                for entry in entries {
                    switch entry {
                    case .envelope(let envelope):
                        applied += try await receive(envelope, &session, api)
                    case .undecodable(let site, let error):
                        session.undecodable(site: site, error, now: configuration.clock.nowMilliseconds())
                    }
                }
                if let (claims, proof) = session.readyClaims() {
                    let result = try await local { () throws(ShoalError) in
                        try await apply(claims, received: proof)
                    }
                    session.held(result.versionVector)
                }
                for problem in session.problems { note(problem) }
                let pulled = configuration.clock.nowMilliseconds()
                state.withLock { state in
                    state.status.lastPullMs = pulled
                    state.status.received += UInt64(entries.count)
                    state.status.applied += UInt64(applied)
                }
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
                checkHeads = true
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
            session.held(try await local { () throws(ShoalError) in try await node.store.versionVector() })
            verdict = session.recheck(envelope, now: configuration.clock.nowMilliseconds())
        }
        guard verdict == .open else { return 0 }
        if !state.withLock({ $0.credentials.seal }).holds(envelope.epoch) {
            // Sealed with an epoch this node has not learnt yet: its grant is in the relay's mailbox.
            try await refreshGrants(api)
        }
        let plaintext: Result<[UInt8], ShoalError>
        do {
            plaintext = .success(try state.withLock { $0.credentials.seal }.open(envelope))
        } catch {
            plaintext = .failure(error)
        }
        guard case .apply(let batch, let received) = session.opened(
            envelope, plaintext: plaintext, now: configuration.clock.nowMilliseconds()
        ) else { return 0 }
        let result = try await local { () throws(ShoalError) in
            try await apply(batch, received: received)
        }
        session.applied(envelope, received: result.received, held: result.versionVector)
        return result.applied
    }

    /// Applies changes from the relay through the node's store, in one transaction (the claim is taken as far as the
    /// changes, and those `received` earlier in the same range, prove it); their commit starts rounds with the node's
    /// peers. The result's `received` adds this batch's highest seqs to `received`.
    func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) async throws(ShoalError) -> (applied: Int, versionVector: VersionVector, received: [SiteID: UInt64]) {
        let result = try await node.store.apply(batch, received: received, origin: .relay)
        if !result.conflictsByTable.isEmpty { NodeMetrics.countConflicts(result.conflictsByTable) }
        if let (site, hlc) = result.clockRefusals.first {
            // What else the batch held is applied; the refused site's changes come again once time catches up.
            let now = configuration.clock.nowMilliseconds()
            let allowed = await node.configuration.storeOptions.maximumClockDriftMilliseconds
            throw ShoalError(
                code: .clockTooFarAhead,
                message: "changes of site \(site.hex.prefix(8)) carry a clock \(Int64(hlc.milliseconds) - Int64(now)) ms "
                    + "ahead of this node's (more than the \(allowed) ms allowed): they were left out, everything else "
                    + "was applied"
            )
        }
        return (result.applied, result.versionVector, result.received)
    }
}
