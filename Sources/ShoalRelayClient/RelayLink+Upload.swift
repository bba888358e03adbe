import Logging
import Metrics
import ShoalCore
import ShoalRelayProtocol
import ShoalTransport

extension RelayLink {
    // MARK: Upload

    /// Uploads what the relay lacks whenever the node's data changes or the relay comes back, as the upload session
    /// (``RelayUploadSession``) decides.
    func pushLoop(_ api: RelayAPIClient) async throws {
        let clock = configuration.clock
        var signals = pushSignals.makeAsyncIterator()
        var session = RelayUploadSession(
            backoff: configuration.backoff,
            spacingMilliseconds: configuration.minimumRequestSpacingMilliseconds
        )
        var backoff = configuration.backoff
        var random = SystemRandomNumberGenerator()
        var due = true
        while !Task.isCancelled {
            if !due {
                guard await signals.next() != nil else { return }
            }
            due = false
            let pause = session.pause(now: clock.monotonicMilliseconds())
            if pause > 0 {
                // The signals that come meanwhile are one (the stream keeps the newest): this pass takes them all.
                do { try await Task.sleep(for: .milliseconds(pause)) } catch { return }
            }
            // After a start or a failure, what the relay holds for this node comes first (see ``pulledUp``).
            await awaitPulledUp(limit: Self.pullFirstMilliseconds)
            let stale = state.withLock { $0.takeHeadsStale() }
            do throws(RelayCallError) {
                try await epochs(.grantsIfNeeded, api)
                try await epochs(.epochs, api)
                var step = session.start(now: clock.monotonicMilliseconds(), stale: stale)
                pass: while true {
                    switch step {
                    case .readHeads:
                        step = session.read(try await fetchHeads(api), now: clock.monotonicMilliseconds())
                    case .upload(var heads):
                        let finished = try await pushOnce(api, heads: &heads)
                        step = session.uploaded(heads: heads, finished: finished, random: &random)
                    case .checkSnapshot(let heads):
                        step = session.snapshotChecked(due: try await snapshotDue(heads))
                    case .uploadSnapshot:
                        try await uploadSnapshot(api)
                        step = session.snapshotUploaded()
                    case .done:
                        backoff.reset()
                        break pass
                    case .again(let wait):
                        due = true
                        if wait > 0 { try? await Task.sleep(for: .milliseconds(wait)) }
                        break pass
                    }
                }
            } catch {
                if case .cancelled = error {} else { metrics.pushed(ok: false) }
                // What the relay lacks keeps growing while it does not answer: counted against the last heads known.
                if let heads = session.lastHeads, let held = try? await held() {
                    await noteLacking(held: held, heads: heads)
                }
                session.failed()
                due = true
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    /// The relay's heads, with what they say of its sizes noted, and a head beyond what this node made of its own site
    /// said.
    func fetchHeads(_ api: RelayAPIClient) async throws(RelayCallError) -> VersionVector {
        let (heads, vector) = try await api.heads(cluster: configuration.clusterID)
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.read(heads, now: now) }
        if let forged = RelayLinkState.forgedRange(heads: vector, held: try await held(), site: node.siteID) {
            note(forged)
        }
        return vector
    }

    /// Uploads every transaction the relay's `heads` lack; `false` when the relay's heads moved under it.
    func pushOnce(_ api: RelayAPIClient, heads: inout VersionVector) async throws(RelayCallError) -> Bool {
        let held = try await local { () throws(ShoalError) in try await node.store.servableVector() }
        // What the relay served this node since its heads were read, it holds: not sent back. Read after what the node
        // holds: a range is told served before its apply commits, so whatever `held` has of it is here too.
        heads.merge(state.withLock { $0.served })
        await noteLacking(held: held, heads: heads)
        guard held.advances(heads) else { return true }
        let started = ContinuousClock.now
        let (finished, _) = try await stream(api, since: heads, into: nil, heads: &heads)
        let after = try await local { () throws(ShoalError) in try await node.store.servableVector() }
        await noteLacking(held: after, heads: heads)
        metrics.pushed(ok: true)
        metrics.pushTime.record(duration: ContinuousClock.now - started)
        return finished
    }

    /// Cuts the changes `since` lacks into sealed ranges and sends them, a request of about the configured size at a
    /// time (``RelayUploadBuffer``), to the change log or to snapshot `snapshot`; returns whether all went up (`false`:
    /// the relay's heads moved and it refused some) and what the stream covered. `heads` follows the relay's answers.
    func stream(
        _ api: RelayAPIClient,
        since: VersionVector,
        into snapshot: UInt64?,
        heads: inout VersionVector
    ) async throws(RelayCallError) -> (finished: Bool, covered: VersionVector) {
        let (pieceBytes, requestBytes, seal) = state.withLock { ($0.pieceBytes, $0.requestBytes, $0.credentials.seal) }
        let cursor = try await local { () throws(ShoalError) in try await node.store.openCursor(since: since) }
        var chunker = RelayChunker(
            cluster: configuration.clusterID,
            seal: seal,
            heads: since,
            pieceBytes: pieceBytes,
            compressing: configuration.compression
        )
        defer {
            let (plaintext, sealed) = (chunker.plaintextBytes, chunker.sealedBytes)
            state.withLock { $0.cut(plaintextBytes: plaintext, sealedBytes: sealed) }
        }
        var requests = RelayUploadBuffer(requestBytes: requestBytes)
        var finished = true
        do throws(RelayCallError) {
            while finished, let batch = try await local({ () throws(ShoalError) in
                try await node.store.nextBatch(cursor, maxChanges: 20_000, maxBytes: pieceBytes)?.batch
            }) {
                let envelopes = try await local { () throws(ShoalError) in try chunker.envelopes(for: batch) }
                for envelope in envelopes where finished {
                    guard let request = requests.add(envelope) else { continue }
                    finished = try await send(api, request, heads: &heads, snapshot: snapshot)
                }
            }
        } catch {
            await node.store.closeCursor(cursor)
            throw error
        }
        await node.store.closeCursor(cursor)
        if finished, let rest = requests.flush() {
            finished = try await send(api, rest, heads: &heads, snapshot: snapshot)
        }
        return (finished, chunker.covered)
    }

    /// Sends `envelopes` to the change log, or to snapshot `snapshot`; `false` when some were refused because the
    /// relay's heads moved.
    func send(
        _ api: RelayAPIClient,
        _ envelopes: [RelayEnvelope],
        heads: inout VersionVector,
        snapshot: UInt64?
    ) async throws(RelayCallError) -> Bool {
        let seal = state.withLock { $0.credentials.seal }
        let (result, answered, bytes) = try await api.upload(envelopes, snapshot: snapshot, seal: seal)
        heads.merge(answered)
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.uploaded(stored: result.stored, bytes: bytes, toSnapshot: snapshot != nil, now: now) }
        if result.stored > 0 { report(.uploaded(chunks: result.stored)) }
        configuration.logger.debug(
            "uploaded to the relay",
            metadata: ["sent": "\(envelopes.count)", "stored": "\(result.stored)", "gaps": "\(result.gaps)"]
        )
        return result.gaps == 0
    }

    /// Whether this node should upload a snapshot now, the relay at `heads`
    /// (``RelayLinkState/snapshotDue(held:heads:fences:minimumBytes:now:)``): what it can send, as a snapshot would.
    func snapshotDue(_ heads: VersionVector) async throws(RelayCallError) -> Bool {
        let (held, fences) = try await local { () throws(ShoalError) in
            try await node.store.read { store throws(ShoalError) in (try store.servableVector(), try store.fences()) }
        }
        let now = configuration.clock.nowMilliseconds()
        let minimum = configuration.snapshotMinimumBytes
        guard let owed = await node.relaySnapshotOwed(covering: state.withLock({ $0.snapshotVector })) else {
            return false
        }
        return state.withLock {
            $0.snapshotDue(held: held, heads: heads, fences: fences, minimumBytes: minimum, owed: owed, now: now)
        }
    }

    /// Uploads a snapshot: the node's whole merged state, as a change stream from the empty vector cut in ranges like
    /// any upload, into a snapshot of a new id; then tells the relay it is whole and what it covers.
    func uploadSnapshot(_ api: RelayAPIClient) async throws(RelayCallError) {
        let clock = configuration.clock
        state.withLock { $0.snapshotStarted(now: clock.nowMilliseconds()) }
        let id = UInt64.random(in: 1...UInt64(Int64.max))
        let seal = state.withLock { $0.credentials.seal }
        var uploaded = VersionVector()
        let (finished, covered) = try await stream(api, since: VersionVector(), into: id, heads: &uploaded)
        guard finished else { throw RelayCallError.refused("the relay refused part of a snapshot") }
        guard !covered.isEmpty else {
            return state.withLock { $0.snapshotEnded(.empty, now: clock.nowMilliseconds()) }
        }
        do throws(RelayCallError) {
            try await api.completeSnapshot(id, covered: covered, seal: seal)
        } catch {
            if case .conflict = error { state.withLock { $0.snapshotEnded(.replaced, now: clock.nowMilliseconds()) } }
            throw error
        }
        state.withLock { $0.snapshotEnded(.completed, now: clock.nowMilliseconds()) }
        configuration.logger.info("uploaded a snapshot", metadata: ["snapshot": "\(id)"])
        report(.snapshotted)
    }

    /// Notes what the relay at `heads` lacks of what this node `held`, and tells the node what the relay holds.
    func noteLacking(held: VersionVector, heads: VersionVector) async {
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.lacking(held: held, heads: heads, site: node.siteID, now: now) }
        await node.relayHolds(heads)
    }
}
