import Foundation
import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Upload

    /// Uploads what the relay lacks whenever the node's data changes or the relay comes back, as the upload session
    /// (``RelayUploadSession``) decides.
    func pushLoop(_ api: RelayAPIClient) async throws {
        var signals = pushSignals.makeAsyncIterator()
        var session = RelayUploadSession(backoff: backoff())
        var backoff = backoff()
        var random = SystemRandomNumberGenerator()
        var due = true
        while !Task.isCancelled {
            if !due {
                guard await signals.next() != nil else { return }
            }
            due = false
            let stale = state.withLock { state in
                defer { state.headsStale = false }
                return state.headsStale
            }
            do throws(RelayCallError) {
                try await refreshGrantsIfNeeded(api)
                try await rotateIfNeeded(api)
                if session.next(now: configuration.clock.monotonicMilliseconds(), stale: stale) == .readHeads {
                    session.read(try await fetchHeads(api), now: configuration.clock.monotonicMilliseconds())
                }
                guard case .upload(var heads) = session.next(now: configuration.clock.monotonicMilliseconds(), stale: false)
                else { continue }
                let finished = try await pushOnce(api, heads: &heads)
                switch session.uploaded(heads: heads, finished: finished, random: &random) {
                case .done:
                    backoff.reset()
                    if snapshotDue(held: try await local { () throws(ShoalError) in try await node.store.versionVector() }, heads: heads) {
                        // Read again first: another node may have just uploaded one.
                        let fresh = try await fetchHeads(api)
                        session.read(fresh, now: configuration.clock.monotonicMilliseconds())
                        if snapshotDue(held: try await local { () throws(ShoalError) in try await node.store.versionVector() }, heads: fresh) {
                            try await uploadSnapshot(api)
                        }
                    }
                case .again(let wait):
                    due = true
                    if wait > 0 { try? await Task.sleep(for: .milliseconds(wait)) }
                }
            } catch {
                if case .cancelled = error {} else { metrics.pushFailed.increment() }
                // What the relay lacks keeps growing while it does not answer: counted against the last heads known.
                if let heads = session.lastHeads, let held = try? await node.store.versionVector() {
                    await noteLacking(held: held, heads: heads)
                }
                session.failed()
                due = true
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    /// A backoff with the configured bounds.
    func backoff() -> Backoff {
        Backoff(
            initialMilliseconds: configuration.initialBackoffMilliseconds,
            maximumMilliseconds: configuration.maximumBackoffMilliseconds
        )
    }

    /// The relay's heads, with what they say of its sizes noted.
    func fetchHeads(_ api: RelayAPIClient) async throws(RelayCallError) -> VersionVector {
        let (heads, vector) = try await api.heads(cluster: configuration.clusterID)
        state.withLock { state in
            state.uncoveredBytes = heads.uncoveredBytes ?? 0
            state.snapshotBytes = heads.snapshot?.bytes ?? 0
        }
        // Nobody holds more of this node's own site than the node itself: a head beyond it is a forged or corrupt
        // range, which hides this node's next transactions from the relay until its operator removes it.
        let own = node.siteID
        let held = try await local { () throws(ShoalError) in try await node.store.versionVector() }
        if vector[own] > held[own] {
            note(
                "the relay claims transactions \(held[own] + 1)...\(vector[own]) of this node's own site, which it never "
                    + "made: a forged or corrupt range; this node's later writes cannot reach the relay until its "
                    + "operator removes that range"
            )
        }
        return vector
    }

    /// Uploads every transaction the relay's `heads` lack; `false` when the relay's heads moved under it.
    func pushOnce(_ api: RelayAPIClient, heads: inout VersionVector) async throws(RelayCallError) -> Bool {
        let held = try await local { () throws(ShoalError) in try await node.store.servableVector() }
        await noteLacking(held: held, heads: heads)
        guard held.entries.contains(where: { $0.value > heads[$0.key] }) else { return true }
        let started = ContinuousClock.now
        let (finished, _) = try await stream(api, since: heads, into: nil, heads: &heads)
        await noteLacking(held: try await local { () throws(ShoalError) in try await node.store.servableVector() }, heads: heads)
        metrics.pushOK.increment()
        metrics.pushTime.record(duration: ContinuousClock.now - started)
        return finished
    }

    /// Cuts the changes `since` lacks into sealed ranges and sends them, a request of about the configured size at a
    /// time, to the change log or to snapshot `snapshot`; returns whether all went up (`false`: the relay's heads moved
    /// and it refused some) and what the stream covered. `heads` follows the relay's answers.
    func stream(
        _ api: RelayAPIClient,
        since: VersionVector,
        into snapshot: UInt64?,
        heads: inout VersionVector
    ) async throws(RelayCallError) -> (finished: Bool, covered: VersionVector) {
        let (pieceBytes, requestBytes, seal) = state.withLock { ($0.pieceBytes, $0.requestBytes, $0.credentials.seal) }
        let cursor = try await local { () throws(ShoalError) in try await node.store.openCursor(since: since) }
        var chunker = RelayChunker(cluster: configuration.clusterID, seal: seal, heads: since, pieceBytes: pieceBytes)
        var outgoing: [RelayEnvelope] = []
        var outgoingBytes = 0
        do throws(RelayCallError) {
            while let batch = try await local({ () throws(ShoalError) in
                try await node.store.nextBatch(cursor, maxChanges: 20_000, maxBytes: pieceBytes)?.batch
            }) {
                for envelope in try localNow({ () throws(ShoalError) in try chunker.envelopes(for: batch) }) {
                    outgoing.append(envelope)
                    outgoingBytes += envelope.encodedCount
                    guard outgoingBytes >= requestBytes else { continue }
                    outgoingBytes = 0
                    guard try await send(api, &outgoing, heads: &heads, snapshot: snapshot) else {
                        await node.store.closeCursor(cursor)
                        return (false, chunker.covered)
                    }
                }
            }
            await node.store.closeCursor(cursor)
            let finished = outgoing.isEmpty ? true : try await send(api, &outgoing, heads: &heads, snapshot: snapshot)
            return (finished, chunker.covered)
        } catch {
            await node.store.closeCursor(cursor)
            throw error
        }
    }

    /// Sends `envelopes` (and empties it) to the change log, or to snapshot `snapshot`; `false` when some were refused
    /// because the relay's heads moved.
    func send(
        _ api: RelayAPIClient,
        _ envelopes: inout [RelayEnvelope],
        heads: inout VersionVector,
        snapshot: UInt64? = nil
    ) async throws(RelayCallError) -> Bool {
        let count = envelopes.count
        let sending = envelopes
        envelopes = []
        let (result, answered, bytes) = try await api.upload(
            sending, snapshot: snapshot, seal: state.withLock { $0.credentials.seal }
        )
        if snapshot == nil { state.withLock { $0.uncoveredBytes += Int64(bytes) } }
        heads.merge(answered)
        let now = configuration.clock.nowMilliseconds()
        state.withLock { state in
            state.status.lastPushMs = now
            state.status.uploaded += UInt64(result.stored)
        }
        if result.stored > 0 { report(.uploaded(chunks: result.stored)) }
        configuration.logger.debug(
            "uploaded to the relay",
            metadata: ["sent": "\(count)", "stored": "\(result.stored)", "gaps": "\(result.gaps)"]
        )
        return result.gaps == 0
    }

    /// Whether this node should upload a snapshot now: it holds exactly what the relay holds (a node still catching up
    /// would cover less than the snapshot it replaces), the change sets the relay's snapshot leaves uncovered outgrew
    /// both that snapshot and the minimum, and no attempt of its failed in the last minute.
    func snapshotDue(held: VersionVector, heads: VersionVector) -> Bool {
        let now = configuration.clock.nowMilliseconds()
        return state.withLock {
            $0.snapshotDue(held: held, heads: heads, minimumBytes: configuration.snapshotMinimumBytes, now: now)
        }
    }

    /// Uploads a snapshot: the node's whole merged state, as a change stream from the empty vector cut in ranges like
    /// any upload, into a snapshot of a new id; then tells the relay it is whole and what it covers.
    func uploadSnapshot(_ api: RelayAPIClient) async throws(RelayCallError) {
        state.withLock { $0.snapshotTriedMs = configuration.clock.nowMilliseconds() }
        let id = UInt64.random(in: 1...UInt64(Int64.max))
        let seal = state.withLock { $0.credentials.seal }
        var uploaded = VersionVector()
        let (finished, covered) = try await stream(api, since: VersionVector(), into: id, heads: &uploaded)
        guard finished else { throw RelayCallError.refused("the relay refused part of a snapshot") }
        guard !covered.isEmpty else {
            state.withLock { $0.snapshotTriedMs = nil }
            return
        }
        do throws(RelayCallError) {
            try await api.completeSnapshot(id, covered: covered, seal: seal)
        } catch {
            if case .conflict = error {
                // Another node's snapshot completed meanwhile and replaced this one: nothing failed, so the next
                // attempt comes in about 10 s rather than a minute.
                let soon = configuration.clock.nowMilliseconds() &- 50_000
                state.withLock { $0.snapshotTriedMs = soon }
            }
            throw error
        }
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.status.lastSnapshotMs = now }
        state.withLock { state in
            state.uncoveredBytes = 0
            state.snapshotTriedMs = nil
        }
        configuration.logger.info("uploaded a snapshot", metadata: ["snapshot": "\(id)"])
        report(.snapshotted)
    }

    func noteLacking(held: VersionVector, heads: VersionVector) async {
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.lacking(held: held, heads: heads, site: node.siteID, now: now) }
        await node.relayHolds(heads)
    }

    /// Updates the relay's lacking and staleness gauges as often as the node samples its own (neither is known
    /// before the relay's heads were first read).
    func sampleMetrics() async throws {
        let interval = await node.configuration.metricsIntervalMilliseconds
        guard interval > 0 else { return }
        while !Task.isCancelled {
            if let heads = state.withLock({ $0.knownHeads }) {
                metrics.lackingGauge.record(status.lacking ?? 0)
                metrics.stalenessGauge.record(Double(await node.ageOfOldestChangeLacking(in: heads)) / 1000)
            }
            try await Task.sleep(for: .milliseconds(interval))
        }
    }
}
