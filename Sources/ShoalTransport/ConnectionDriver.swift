import ShoalCore
import ShoalProtocol
import ShoalStore
import Synchronization

/// Carries out one ``SyncSession`` over one ``MessageStream``: the only shell around the pure state machine.
///
/// The node runs it over TCP, tests run it over an in-memory pair: the same code either way. Messages, ticks and
/// the node's signals arrive through one event stream and are handled one at a time, so the session never sees
/// two things at once. Every rule of the exchange is the session's; the driver only moves bytes, calls the store
/// and reports to its ``ConnectionDelegate``.
struct ConnectionDriver {
    /// How a connection ended.
    struct Outcome: Sendable {
        /// Whether the handshake succeeded (and the node kept the connection).
        var established: Bool
        /// What closed the connection, if anything did.
        var error: ShoalError?
        /// How the peer refused us, if it did.
        var refusal: Rejection?
        /// Whether a pull finished and the connection did not end in a failure or refusal: only then does the
        /// dialer start again from its shortest backoff.
        var healthy = false
        /// A round failed here (apply, send, …): the connection ended because of it.
        var failedHere = false
        /// Closed as the loser of two connections with one peer (by either side): not a failure.
        var duplicate = false
    }

    /// What the driver needs besides the session's own configuration.
    struct Settings: Sendable {
        /// The session's time limits and sizes.
        var session = SyncSession.Configuration()
        /// Changes per batch at most, when answering a pull.
        var maxChangesPerBatch = 5_000
        /// Encoded bytes per batch, about, at most.
        var maxBytesPerBatch = WireProtocol.defaultBatchBytes
        /// The node's clock: the session runs on its monotonic time, clock views use its wall time.
        var clock: any WallClock
        /// How often the session is told that time passed.
        var tickMilliseconds: UInt64 = 100
        /// How many of the peer's messages may wait, read but not yet handled (see ``InboundGate``): with
        /// batches of up to 2 MiB encoded, a fast peer costs a few batches of memory, not the whole catch-up.
        var inboundMessageLimit = 2
        /// Set when the node stops: an answer in progress ends at the next batch instead of running to its end.
        var stopping = Flag()
    }

    /// The connection's number in the node's registry.
    let id: Int
    /// Where the peer is, for the delegate and the log.
    let address: String
    let worker: SerializedStore
    let delegate: any ConnectionDelegate
    let settings: Settings
    private var peer: SiteID?
    /// The peer's metrics, once the handshake is accepted.
    private var metrics: PeerMetrics?
    /// Whether the round under way was counted as failed already (a failure closes the connection too).
    private var roundFailureCounted = false
    private var roundStarted: UInt64 = 0
    private var appliedThisRound = 0
    /// Bytes of this round's answer received so far (``CatchUpProgress/bytes``).
    private var bytesThisRound = 0
    /// The highest seq per site applied from this round's answer so far: a later batch may claim what an earlier
    /// one delivered.
    private var receivedThisRound: [SiteID: UInt64] = [:]
    /// Whether a batch of this round's answer had changes left out (fenced, or refused for their clock): the answer
    /// then does not end complete, and its claim is taken only as far as the changes prove it.
    private var withheldThisRound = false
    /// The site the peer writes as, from its requests (protocol version 4).
    private var peerWritingSite: SiteID?
    /// A site's changes left out of this round for a clock too far ahead (the round fails with it at its end).
    private var clockRefusal: ShoalError?
    private var clockRefusalBatch: ChangeBatch?
    private var roundsFinished = 0
    /// Whether the link needs its periodic rounds.
    private var settled = SettledLink()
    /// What the peer is known to hold: the vectors of its requests, acknowledgements and announcements on this
    /// connection. A commit here is announced to it only when it lacks something of the local vector, so a change
    /// applied from this peer is not announced back to it.
    private var peerHolds = VersionVector()
    /// The request of our pull under way on this link, as the node knows of it
    /// (``ConnectionDelegate/pullStarting(_:expecting:)``).
    private var pulling: UInt64?
    /// What the peer announced holding that we lack, while a pull on another link brings it: pulled here only if that
    /// one did not.
    private var putOff: VersionVector?
    /// When the pull was put off: after ``putOffLimitMilliseconds`` it is made whatever the other pull does (a peer
    /// that stopped answering, or a link busy with something else, must not hold this one back).
    private var putOffAt: UInt64 = 0
    /// Whether a tick is on its way for the pull put off.
    private var putOffTimed = false
    /// The longest a link puts its pull off for another link's.
    static let putOffLimitMilliseconds: UInt64 = 250
    /// The generation of the member reports this link last passed on (``MemberDirectory/generation``), and how many
    /// periodic ticks went by since it passed them on whatever their generation (so ages stay fresh).
    private var membersPassedOn: Int?
    private var ticksSinceMembersPassedOn = 0
    /// What this link last told the peer that this node's last fresh state covers.
    private var freshStatePassedOn: VersionVector?
    /// Periodic ticks between two passings-on of unchanged member reports (a minute at the default interval).
    static let membersRefreshTicks = 30

    init(id: Int, address: String, worker: SerializedStore, delegate: any ConnectionDelegate, settings: Settings) {
        self.id = id
        self.address = address
        self.worker = worker
        self.delegate = delegate
        self.settings = settings
    }

    private var now: UInt64 { settings.clock.monotonicMilliseconds() }
    /// How much of the stretch between two ticks this side could not watch the link, if it was long: the stretch
    /// in real time less the tick, when that is over a second and the node's clock ran with real time meanwhile (a
    /// clock a test moves by hand is not corrected: its jumps are the test's).
    static func unwatched(real: Duration, clock: UInt64, tick: UInt64) -> UInt64? {
        let realMilliseconds = UInt64(max(0, real / .milliseconds(1)))
        guard realMilliseconds > tick + 1_000, clock + 100 >= realMilliseconds, clock <= realMilliseconds + 100 else {
            return nil
        }
        return realMilliseconds - tick
    }

    /// Runs the session from the hellos to the end of the connection. `inbox` is where the node's signals arrive,
    /// and `events` its writing end (the driver adds the peer's messages and ticks to it).
    mutating func run(
        hello: Hello,
        over stream: some MessageStream,
        inbox: AsyncStream<ConnectionEvent>,
        events: AsyncStream<ConnectionEvent>.Continuation
    ) async -> Outcome {
        var session = SyncSession(local: hello, configuration: settings.session, now: now)
        var outcome = Outcome(established: false, error: nil)
        let tick = settings.tickMilliseconds
        // A quiet link ticks slower: its deadlines (keepalive, idle timeout) are seconds away.
        let quietTick = max(tick, min(settings.session.keepaliveInterval / 2, settings.session.idleTimeout / 4))
        let pace = Pace(tick)
        let gate = InboundGate(limit: settings.inboundMessageLimit)
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                do {
                    for try await message in stream.inbound {
                        events.yield(.message(message))
                        await gate.admitted()
                    }
                    events.yield(.ended(nil))
                } catch let error as ShoalError {
                    events.yield(.ended(error))
                } catch {
                    events.yield(.ended(DialFailure.connectionLost(error)))
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(pace.milliseconds))
                    events.yield(.tick)
                }
            }
            var actions = session.start()
            var incoming = inbox.makeAsyncIterator()
            var handlingMessage = false
            // How long the loop went without seeing a tick (it was busy, or the process got no time) is not the
            // peer's silence.
            var lastTick = (real: ContinuousClock.now, clock: now)
            while true {
                await perform(&actions, session: &session, stream: stream, gate: gate, outcome: &outcome)
                if session.outstandingRequest != pulling {
                    pulling = session.outstandingRequest
                    if pulling != nil {
                        await delegate.pullStarting(id, expecting: peerHolds)
                    } else {
                        await delegate.pullEnded(id)
                    }
                }
                pace.milliseconds = session.isQuiet && putOff == nil ? quietTick : tick
                if putOff != nil, !putOffTimed {
                    // A quiet link's next tick may be seconds away: one comes when the limit is up.
                    putOffTimed = true
                    group.addTask {
                        try? await Task.sleep(for: .milliseconds(Self.putOffLimitMilliseconds))
                        events.yield(.tick)
                    }
                }
                if putOff == nil { putOffTimed = false }
                if handlingMessage {
                    gate.handled()
                    handlingMessage = false
                }
                if session.phase == .closed { break }
                guard let event = await incoming.next() else { break }
                switch event {
                case .message(let message):
                    handlingMessage = true
                    switch message {
                    case .changeBatch(let batch): bytesThisRound += batch.frameBytes
                    case .valuePiece(let piece): bytesThisRound += piece.bytes.count
                    default: break
                    }
                    actions = session.receive(message, now: now)
                case .tick:
                    let seen = (real: ContinuousClock.now, clock: now)
                    if let unwatched = Self.unwatched(
                        real: seen.real - lastTick.real,
                        clock: seen.clock &- lastTick.clock,
                        tick: quietTick
                    ) {
                        session.couldNotWatch(milliseconds: unwatched, now: seen.clock)
                    }
                    lastTick = seen
                    actions = session.tick(now: seen.clock)
                    if let vector = putOff, seen.clock &- putOffAt >= Self.putOffLimitMilliseconds {
                        putOff = nil
                        if !worker.latestVersionVector.withLock({ $0 }).dominatesOrEquals(vector) {
                            actions.append(.wantRound)
                        }
                    }
                case .localChange:
                    settled.committed()
                    actions = session.committed()
                case .periodic:
                    actions = settled.periodicRoundIsDue() ? session.localChange() : []
                    if let peer, (session.version ?? 0) >= WireProtocol.holdingVersion, session.phase == .established {
                        ticksSinceMembersPassedOn += 1
                        let refresh = ticksSinceMembersPassedOn >= Self.membersRefreshTicks
                        if let (generation, reports) = await delegate.memberGossip(
                            for: peer, since: membersPassedOn, refresh: refresh
                        ) {
                            membersPassedOn = generation
                            ticksSinceMembersPassedOn = 0
                            if !reports.isEmpty { actions.append(.send(.members(reports))) }
                        }
                    }
                    if (session.version ?? 0) >= WireProtocol.freshStateVersion, session.phase == .established,
                        let covers = await delegate.freshStateCoverage(), covers != freshStatePassedOn
                    {
                        freshStatePassedOn = covers
                        actions.append(.send(.freshState(covers)))
                    }
                case .shutdown:
                    actions = session.close(
                        ShoalError(code: .rejected, message: "the node is shutting down"),
                        reason: .shuttingDown
                    )
                case .evicted:
                    actions = session.close(
                        ShoalError(code: .rejected, message: "closed to make room for other handshakes"),
                        reason: .tooManyConnections
                    )
                case .revoked:
                    actions = session.close(
                        ShoalError(code: .notAMember, message: "the peer was removed from the roster"),
                        reason: .notAMember
                    )
                case .duplicate:
                    actions = session.close(
                        ShoalError(code: .rejected, message: "another connection to this peer is kept"),
                        reason: .duplicateConnection
                    )
                case .ended(let error):
                    actions = session.streamEnded(error)
                case .pullsEnded:
                    actions = []
                    guard let vector = putOff else { break }
                    putOff = nil
                    guard !worker.latestVersionVector.withLock({ $0 }).dominatesOrEquals(vector) else { break }
                    if await delegate.pullUnderWay(covering: vector, except: id) {
                        putOff = vector
                    } else {
                        actions = [.wantRound]
                    }
                }
            }
            gate.close()
            group.cancelAll()
        }
        if pulling != nil { await delegate.pullEnded(id) }
        stream.finish()
        outcome.healthy =
            outcome.established && roundsFinished > 0 && outcome.refusal == nil && !outcome.failedHere
        return outcome
    }

    /// Carries out actions, and the ones they lead to.
    private mutating func perform(
        _ actions: inout [SyncSession.Action],
        session: inout SyncSession,
        stream: some MessageStream,
        gate: InboundGate,
        outcome: inout Outcome
    ) async {
        while !actions.isEmpty {
            let action = actions.removeFirst()
            do throws(ShoalError) {
                switch action {
                case .send(.reject(let rejection)):
                    // Best effort: the connection is closing anyway, and its reason must not be replaced.
                    try? await write(.reject(rejection), to: stream)
                case .send(let message):
                    try await write(message, to: stream)
                case .established(let hello, _):
                    switch await delegate.connectionEstablished(id, peer: hello, address: address) {
                    case .accepted:
                        peer = hello.siteID
                        metrics = await delegate.metrics(for: hello.siteID)
                        outcome.established = true
                    case .duplicate:
                        outcome.duplicate = true
                        actions = session.close(
                            ShoalError(code: .rejected, message: "already connected to \(hello.siteID.hex)"),
                            reason: .duplicateConnection
                        )
                    case .full:
                        actions = session.close(
                            ShoalError(code: .rejected, message: "this node is at its connection limit"),
                            reason: .tooManyConnections
                        )
                    case .refused(let rejection):
                        actions = session.close(
                            ShoalError(code: .notAMember, message: rejection.message),
                            reason: rejection.reason
                        )
                    }
                case .inspectionStarted(let hello, _):
                    switch await delegate.inspectionStarted(id, peer: hello, address: address) {
                    case .accepted:
                        outcome.established = true
                    case .refused(let rejection):
                        actions = session.close(
                            ShoalError(code: .notAMember, message: rejection.message),
                            reason: rejection.reason
                        )
                    case .duplicate, .full:
                        actions = session.close(
                            ShoalError(code: .rejected, message: "this node answers as many inspections as it takes"),
                            reason: .tooManyConnections
                        )
                    }
                case .answerInspection(let request):
                    try await write(.inspectionAnswer(try await worker.inspect(request)), to: stream)
                case .wantRound:
                    // A member suspended for collection is not pulled from until it took a fresh state.
                    if let peer, session.outstandingRequest == nil, !(await delegate.mayPull(from: peer)) { break }
                    if session.outstandingRequest == nil {
                        roundStarted = now
                        appliedThisRound = 0
                        bytesThisRound = 0
                        receivedThisRound = [:]
                        withheldThisRound = false
                        roundFailureCounted = false
                    }
                    // What this node holds of the peer's writing site, for the peer to check: until the peer's first
                    // request names it, the site its hello names (the same, unless the peer once moved).
                    var head: Stamp?
                    if let site = peerWritingSite ?? peer { head = try await worker.loggedHead(of: site) }
                    actions += session.startRound(
                        versionVector: try await worker.versionVector(),
                        now: now,
                        wallClock: await worker.wallClockMilliseconds(),
                        writingSite: await worker.writingSite(),
                        answererHead: head
                    )
                case .announce:
                    let local = try await worker.versionVector()
                    if !peerHolds.dominatesOrEquals(local) { try await write(.holding(local), to: stream) }
                case .peerHolds(let vector):
                    if vector.advances(peerHolds), let peer { await delegate.connectionPeerHolds(peer: peer, vector) }
                    peerHolds.merge(vector)
                    // Settles nothing: only our own pull tells that the peer holds nothing new for us, and only its
                    // acknowledgement carries its digest.
                    let local = try await worker.versionVector()
                    if !local.dominatesOrEquals(vector) {
                        if session.outstandingRequest == nil, await delegate.pullUnderWay(covering: vector, except: id) {
                            if putOff == nil { putOffAt = now }
                            putOff = putOff.map { $0.merging(vector) } ?? vector
                        } else {
                            actions.append(.wantRound)
                        }
                    }
                case .peerReports(let reports):
                    if let peer { await delegate.connectionMemberReports(peer: peer, reports) }
                case .peerTookFreshState(let vector):
                    if let peer { await delegate.connectionPeerTookFreshState(peer: peer, vector) }
                case .serve(let request):
                    if request.versionVector.advances(peerHolds), let peer {
                        await delegate.connectionPeerHolds(peer: peer, request.versionVector)
                    }
                    peerHolds.merge(request.versionVector)
                    if let wall = request.wallClockMilliseconds, let peer {
                        let ahead = await worker.notePeerClock(wall, from: peer)
                        await delegate.connectionClockView(peer: peer, aheadMilliseconds: -ahead)
                    }
                    if let site = request.writingSite { peerWritingSite = site }
                    if let head = request.answererHead { try await worker.checkHead(head) }
                    gate.serving(true)
                    defer { gate.serving(false) }
                    guard let local = try await serve(request, session: &session, stream: stream) else {
                        actions = session.close(
                            ShoalError(code: .rejected, message: "the node is shutting down"),
                            reason: .shuttingDown
                        )
                        break
                    }
                    // The peer's request shows a write this node lacks: pulled now, unless a pull under way on
                    // another link brings it (as for an announcement, ``SyncSession/Action/peerHolds(_:)``).
                    var after = session.served(request, localVersionVector: local)
                    if after.contains(where: { if case .wantRound = $0 { true } else { false } }),
                        session.outstandingRequest == nil,
                        await delegate.pullUnderWay(covering: request.versionVector, except: id)
                    {
                        if putOff == nil { putOffAt = now }
                        putOff = putOff.map { $0.merging(request.versionVector) } ?? request.versionVector
                        after.removeAll { if case .wantRound = $0 { true } else { false } }
                    }
                    actions += after
                case .apply(let message):
                    actions += try await apply(message, session: &session, stream: stream)
                case .roundFinished:
                    roundsFinished += 1
                    settled.pullFinished(applied: appliedThisRound)
                    metrics?.roundFinished(milliseconds: now - roundStarted)
                    if let peer {
                        await delegate.connectionRoundFinished(
                            peer: peer,
                            applied: appliedThisRound,
                            milliseconds: now - roundStarted
                        )
                    }
                case .peerAcknowledged(var ack):
                    // An older peer's digest hashes rows otherwise (tombstones counted, columns in table order): never
                    // compared with ours.
                    if (session.version ?? 0) < WireProtocol.comparableDigestVersion { ack.digest = nil }
                    // Level: the peer holds the same data. When both digests are current, they say (a peer that last
                    // synced through a relay range or a stream file claims only what their changes prove, so its
                    // vector may stay short of ours with the same data: Store.claimed; and a divergence keeps the
                    // link's rounds going, so it is found within a few periodic rounds). Otherwise the vectors say.
                    peerHolds.merge(ack.versionVector)
                    var level = ack.versionVector.dominatesOrEquals(try await worker.versionVector())
                    if let theirs = ack.digest, let ours = await worker.comparableDigest() {
                        level = ours.bytes == theirs
                    }
                    settled.acknowledged(level: level)
                    if let peer { await delegate.connectionAcknowledged(peer: peer, ack) }
                case .peerRefused(let rejection):
                    // The peer refused our round (a clock it will not take, …); it stopping, or keeping another
                    // connection, is no failure.
                    if outcome.established, ![.duplicateConnection, .shuttingDown].contains(rejection.reason) {
                        countRoundFailure()
                    }
                    outcome.refusal = rejection
                    if rejection.reason == .duplicateConnection { outcome.duplicate = true }
                    outcome.failedHere = false
                case .close(let error):
                    if outcome.error == nil { outcome.error = error }
                    // A round cut short (the link broke or timed out before its last batch) failed as well.
                    if outcome.established, session.outstandingRequest != nil, error.code != .rejected {
                        countRoundFailure()
                    }
                }
            } catch {
                outcome.failedHere = true
                if let peer, session.phase == .established {
                    countRoundFailure()
                    await delegate.connectionRoundFailed(peer: peer, reason: error.message)
                }
                actions = session.fail(error, now: now)
            }
        }
    }

    /// Counts the round under way as failed, once.
    private mutating func countRoundFailure() {
        guard !roundFailureCounted else { return }
        roundFailureCounted = true
        metrics?.roundFailed()
    }

    /// Answers the peer's pull, one bounded batch at a time: memory stays flat however much the peer lacks.
    /// Returns the version vector held here once the answer is sent, or `nil` when the node began to stop before the
    /// answer's end (the rest is not sent).
    private func serve(
        _ request: SyncRequest,
        session: inout SyncSession,
        stream: some MessageStream
    ) async throws(ShoalError) -> VersionVector? {
        // Nothing here the peer lacks (a round a peer started because it applied what this node holds too, as every
        // peer of a mesh does after each write): the empty last batch at once, without a cursor.
        let local = try await worker.versionVector()
        if request.versionVector.dominatesOrEquals(local) {
            let prepared = try session.outgoingBatch(
                answering: request,
                ChangeBatch(changes: [], claim: local),
                isLast: true,
                estimatedRemaining: 0
            )
            try await send(.changeBatch(prepared.message), session: session, to: stream)
            session.peerIsReading(now: now)
            return local
        }
        let cursor = try await worker.openCursor(since: request.versionVector)
        do throws(ShoalError) {
            while let (batch, isLast, remaining) = try await worker.nextBatch(
                cursor,
                maxChanges: settings.maxChangesPerBatch,
                maxBytes: settings.maxBytesPerBatch
            ) {
                let prepared = try session.outgoingBatch(
                    answering: request,
                    consume batch,
                    isLast: isLast,
                    estimatedRemaining: remaining
                )
                for (change, encoded) in prepared.pieced {
                    for piece in SyncSession.pieces(
                        requestID: request.requestID,
                        sequence: prepared.message.sequence,
                        change: change,
                        of: encoded,
                        pieceBytes: settings.session.pieceBytes
                    ) {
                        try await send(piece, session: session, to: stream)
                    }
                }
                try await send(.changeBatch(prepared.message), session: session, to: stream)
                // Writes wait while the peer stops reading (and time out): a peer taking batches is alive, though
                // it says nothing until it has applied the last.
                session.peerIsReading(now: now)
                if settings.stopping.isSet && !isLast {
                    await worker.closeCursor(cursor)
                    return nil
                }
            }
        } catch {
            await worker.closeCursor(cursor)
            throw error
        }
        return try await worker.versionVector()
    }

    /// Applies one batch of our pull and tells the session.
    private mutating func apply(
        _ message: ChangeBatchMessage,
        session: inout SyncSession,
        stream: some MessageStream
    ) async throws(ShoalError) -> [SyncSession.Action] {
        let received = receivedThisRound
        // The last batch of an answer that arrived whole, in order, with nothing withheld: its claim is taken whole.
        let completing = message.isLast && !withheldThisRound
        let result = try await keepingAlive(stream) { () async throws(ShoalError) in
            try await worker.apply(message.batch, received: received, completing: completing)
        }
        if !result.conflictsByTable.isEmpty { NodeMetrics.countConflicts(result.conflictsByTable) }
        receivedThisRound = result.received
        withheldThisRound = withheldThisRound || result.withheld
        if let (site, hlc) = result.clockRefusals.max(by: { $0.value < $1.value }) {
            // Only that site's changes were left out; the rest of this batch, and the round's later batches, apply.
            // The round then fails with the reason, and the refused changes come again in a later round.
            clockRefusal = ShoalError(
                code: .clockTooFarAhead,
                message: "changes of site \(site.hex.prefix(8)) carry a clock (\(hlc)) too far ahead of local time: "
                    + "they were left out, everything else was applied"
            )
            clockRefusalBatch = ChangeBatch(
                changes: message.batch.changes.filter { $0.stamp.site == site },
                claim: VersionVector()
            )
        }
        appliedThisRound += result.applied
        metrics?.applied(result.applied)
        if let peer, let newest = message.batch.changes.map(\.stamp.hlc.milliseconds).max() {
            let wall = settings.clock.nowMilliseconds()
            await delegate.connectionClockView(peer: peer, aheadMilliseconds: Int64(newest) - Int64(wall))
        }
        if !message.isLast, let peer {
            metrics?.catchingUp(done: appliedThisRound, remaining: message.estimatedRemaining)
            await delegate.connectionProgress(
                peer: peer,
                changes: appliedThisRound,
                bytes: bytesThisRound,
                remaining: message.estimatedRemaining,
                milliseconds: now - roundStarted
            )
        }
        if message.isLast, !withheldThisRound, let peer {
            await delegate.connectionAnswered(peer: peer, holding: message.batch.claim)
        }
        if message.isLast, let refusal = clockRefusal, let batch = clockRefusalBatch {
            clockRefusal = nil
            clockRefusalBatch = nil
            throw await delegate.describeClockRefusal(refusal, batch: batch, peer: peer)
        }
        return session.applied(
            message,
            versionVector: result.versionVector,
            digest: message.isLast ? try await keepingAlive(stream) { await worker.comparableDigest()?.bytes } : nil,
            now: now
        )
    }

    /// Runs store work that may outlast the peer's patience (a large batch on a slow or busy machine), telling the
    /// peer every keepalive interval meanwhile that this side is alive: an unsolicited pong, which every protocol
    /// version takes as hearing from us and otherwise ignores. The loop sends nothing else while the work runs, and
    /// the heartbeat has ended before this returns, so writes never overlap.
    private func keepingAlive<T: Sendable>(
        _ stream: some MessageStream,
        _ work: () async throws(ShoalError) -> T
    ) async throws(ShoalError) -> T {
        let interval = settings.session.keepaliveInterval
        let heartbeat = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(interval))
                try await stream.write(.pong(0))
            }
        }
        let result: Result<T, ShoalError>
        do throws(ShoalError) {
            result = .success(try await work())
        } catch {
            result = .failure(error)
        }
        heartbeat.cancel()
        _ = await heartbeat.result
        return try result.get()
    }

    /// Sends a change batch or value piece of an answer, compressed where the session says it pays
    /// (``SyncSession/packed(_:)``), and counts its bytes.
    private func send(
        _ message: WireMessage,
        session: SyncSession,
        to stream: some MessageStream
    ) async throws(ShoalError) {
        let frame = session.packed(message)
        metrics?.sent(frame)
        try await write(.encoded(frame), to: stream)
    }

    /// Sends one message; a peer that stops reading makes the write wait, and after the idle timeout the
    /// connection is closed rather than left hanging.
    private func write(_ message: WireMessage, to stream: some MessageStream) async throws(ShoalError) {
        let limit = settings.session.idleTimeout
        let fired = Flag()
        let watchdog = Task {
            try await Task.sleep(for: .milliseconds(limit))
            fired.set()
            stream.close()
        }
        defer { watchdog.cancel() }
        do {
            try await stream.write(message)
        } catch {
            if fired.isSet {
                throw ShoalError(code: .timeout, message: "the peer stopped reading: a write waited \(limit) ms")
            }
            throw ShoalError(code: .network, message: "could not send to the peer: \(error)")
        }
    }
}

/// How long a connection's ticker sleeps between ticks, set by its loop.
final class Pace: Sendable {
    private let value: Mutex<UInt64>

    init(_ milliseconds: UInt64) { value = Mutex(milliseconds) }

    /// The interval, in milliseconds.
    var milliseconds: UInt64 {
        get { value.withLock { $0 } }
        set { value.withLock { $0 = newValue } }
    }
}

/// A flag set once, from any thread.
final class Flag: Sendable {
    private let value = Mutex(false)

    /// Sets the flag.
    func set() { value.withLock { $0 = true } }
    /// Whether it was set.
    var isSet: Bool { value.withLock { $0 } }
}
