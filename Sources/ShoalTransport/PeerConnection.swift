import NIOCore
import ShoalCore
import ShoalWire
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Carries out one ``SyncSession`` over one connection: the shell around the pure state machine.
///
/// Messages, ticks and local-change triggers all arrive through one event stream and are handled one at
/// a time, so the session never sees two things at once.
struct PeerConnection {
    struct Outcome: Sendable {
        var established: Bool
        var error: ShoalError?
        /// How the peer refused us, if it did.
        var refusal: Rejection?
        /// Whether a pull finished and the connection did not end in a failure or refusal: only then does the
        /// dialer start again from its shortest backoff.
        var healthy = false
        /// A round failed here (apply, send, …): the connection ended because of it.
        var failedHere = false
    }

    let id: Int
    /// The underlying channel, closed when a write cannot finish in time.
    let channel: Channel
    let node: SyncNode
    let worker: StoreWorker
    let configuration: NodeConfiguration
    let address: String
    private var peer: SiteID?
    private var roundStarted: UInt64 = 0
    private var appliedThisRound = 0
    private var roundsFinished = 0

    init(
        id: Int,
        channel: Channel,
        node: SyncNode,
        worker: StoreWorker,
        configuration: NodeConfiguration,
        address: String
    ) {
        self.id = id
        self.channel = channel
        self.node = node
        self.worker = worker
        self.configuration = configuration
        self.address = address
    }

    static func now() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }

    mutating func run(
        hello: Hello,
        inbound: NIOAsyncChannelInboundStream<WireMessage>,
        outbound: NIOAsyncChannelOutboundWriter<WireMessage>,
        inbox: AsyncStream<ConnectionEvent>,
        events: AsyncStream<ConnectionEvent>.Continuation
    ) async throws -> Outcome {
        var session = SyncSession(local: hello, configuration: configuration.session, now: Self.now())
        var outcome = Outcome(established: false, error: nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                do {
                    for try await message in inbound { events.yield(.message(message)) }
                    events.yield(.ended(nil))
                } catch let error as ShoalError {
                    events.yield(.ended(error))
                } catch {
                    events.yield(.ended(DialFailure.connectionLost(error)))
                }
            }
            group.addTask {
                while !Task.isCancelled {
                    try await Task.sleep(for: .milliseconds(100))
                    events.yield(.tick)
                }
            }
            var actions = session.start()
            var incoming = inbox.makeAsyncIterator()
            loop: while true {
                if let error = try await perform(&actions, session: &session, outbound: outbound, outcome: &outcome) {
                    outcome.error = error
                    // A send cut short may be the peer closing after a refusal still queued here: read it, so
                    // the failure is reported as the peer's refusal, not as a broken connection.
                    if outcome.refusal == nil && outcome.failedHere {
                        var ticks = 0
                        draining: while let event = await incoming.next() {
                            switch event {
                            case .message(.reject(let rejection)):
                                outcome.refusal = rejection
                                outcome.failedHere = false
                                break draining
                            case .ended:
                                break draining
                            case .tick:
                                ticks += 1
                                if ticks >= 5 { break draining }
                            default:
                                continue
                            }
                        }
                    }
                    break loop
                }
                guard let event = await incoming.next() else { break loop }
                switch event {
                case .message(let message):
                    actions = session.receive(message, now: Self.now())
                case .tick:
                    actions = session.tick(now: Self.now())
                case .localChange:
                    actions = session.phase == .established ? [.wantRound] : []
                case .shutdown:
                    actions = session.fail(
                        ShoalError(code: .rejected, message: "the node is shutting down"),
                        reason: .shuttingDown
                    )
                case .duplicate:
                    actions = session.fail(
                        ShoalError(code: .rejected, message: "another connection to this peer is kept"),
                        reason: .duplicateConnection
                    )
                case .ended(let error):
                    if let error, session.phase != .closed {
                        // A decoding failure: tell the peer why before closing.
                        let reason = Self.reason(for: error.code)
                        try? await outbound.write(.reject(Rejection(reason, error.message)))
                    }
                    outcome.error = error ?? ShoalError(code: .rejected, message: "the peer closed the connection")
                    break loop
                }
            }
            group.cancelAll()
        }
        outbound.finish()
        outcome.healthy =
            outcome.established && roundsFinished > 0 && outcome.refusal == nil && !outcome.failedHere
        return outcome
    }

    /// Carries out actions (and the ones they lead to); returns the error that closes the connection, if any.
    private mutating func perform(
        _ actions: inout [SyncSession.Action],
        session: inout SyncSession,
        outbound: NIOAsyncChannelOutboundWriter<WireMessage>,
        outcome: inout Outcome
    ) async throws -> ShoalError? {
        while !actions.isEmpty {
            let action = actions.removeFirst()
            do throws(ShoalError) {
                switch action {
                case .send(.reject(let rejection)):
                    // Best effort: the connection is closing anyway, and its reason must not be replaced.
                    try? await write(.reject(rejection), to: outbound)
                case .send(let message):
                    try await write(message, to: outbound)
                case .established(let hello, _):
                    switch await node.connectionEstablished(id, peer: hello, address: address) {
                    case .accepted:
                        break
                    case .duplicate:
                        actions = session.fail(
                            ShoalError(code: .rejected, message: "already connected to \(hello.siteID.hex)"),
                            reason: .duplicateConnection
                        )
                        continue
                    case .full:
                        actions = session.fail(
                            ShoalError(code: .rejected, message: "this node is at its connection limit"),
                            reason: .tooManyConnections
                        )
                        continue
                    }
                    peer = hello.siteID
                    outcome.established = true
                case .wantRound:
                    if session.outstandingRequest == nil {
                        roundStarted = Self.now()
                        appliedThisRound = 0
                    }
                    actions += session.startRound(versionVector: try await worker.versionVector(), now: Self.now())
                case .serve(let request):
                    // One bounded batch at a time: memory stays flat however much the peer lacks.
                    let cursor = try await worker.openCursor(since: request.versionVector)
                    var sequence: UInt32 = 0
                    do {
                        while let (batch, isLast, remaining) = try await worker.nextBatch(
                            cursor,
                            maxChanges: configuration.maxChangesPerBatch,
                            maxBytes: configuration.maxBytesPerBatch
                        ) {
                            try await send(
                                ChangeBatchMessage(
                                    requestID: request.requestID,
                                    sequence: sequence,
                                    isLast: isLast,
                                    estimatedRemaining: remaining,
                                    batch: consume batch
                                ),
                                version: session.version ?? WireProtocol.minimumVersion,
                                to: outbound
                            )
                            sequence += 1
                        }
                    } catch {
                        await worker.closeCursor(cursor)
                        throw error
                    }
                    // The peer holds something we lack: pull in the same round.
                    let local = try await worker.versionVector()
                    if !local.dominatesOrEquals(request.versionVector) { actions.append(.wantRound) }
                case .apply(let message):
                    let result: (applied: Int, versionVector: VersionVector)
                    do {
                        result = try await worker.apply(message.batch)
                    } catch where error.code == .clockTooFarAhead {
                        throw await node.describeClockRefusal(error, batch: message.batch, peer: peer)
                    }
                    appliedThisRound += result.applied
                    if let peer, let newest = message.batch.changes.map(\.stamp.hlc.milliseconds).max() {
                        let now = configuration.storeOptions.clock.nowMilliseconds()
                        await node.connectionClockView(peer: peer, aheadMilliseconds: Int64(newest) - Int64(now))
                    }
                    if !message.isLast, let peer {
                        await node.connectionProgress(
                            peer: peer,
                            changes: appliedThisRound,
                            remaining: message.estimatedRemaining,
                            milliseconds: Self.now() - roundStarted
                        )
                    }
                    actions += session.applied(
                        message,
                        versionVector: result.versionVector,
                        digest: message.isLast ? await worker.currentDigest()?.bytes : nil,
                        now: Self.now()
                    )
                case .roundFinished:
                    roundsFinished += 1
                    if let peer {
                        await node.connectionRoundFinished(
                            peer: peer,
                            applied: appliedThisRound,
                            milliseconds: Self.now() - roundStarted
                        )
                    }
                case .peerAcknowledged(let ack):
                    if let peer { await node.connectionAcknowledged(peer: peer, ack) }
                case .peerRefused(let rejection):
                    outcome.refusal = rejection
                case .close(let error):
                    return error
                }
            } catch {
                outcome.failedHere = true
                if let peer, session.phase == .established {
                    await node.connectionRoundFailed(peer: peer, reason: error.message)
                }
                actions = session.fail(error, reason: Self.reason(whenFailing: error.code))
            }
        }
        return nil
    }

    /// Sends one batch: first the values too large to travel inside it, in pieces, then the batch itself. A
    /// change that cannot be sent at all (a value over the maximum, a row larger than a frame) is an error
    /// with ``Rejection/Reason/unsendableChange``, reported on both sides.
    private func send(
        _ message: consuming ChangeBatchMessage,
        version: UInt16,
        to outbound: NIOAsyncChannelOutboundWriter<WireMessage>
    ) async throws(ShoalError) {
        let requestID = message.requestID
        let sequence = message.sequence
        let prepared = try SyncSession.outgoing(
            message,
            version: version,
            inlineLimit: configuration.inlineValueLimit,
            maximumValueBytes: configuration.session.maximumValueBytes
        )
        for (change, encoded) in prepared.pieced {
            for piece in SyncSession.pieces(
                requestID: requestID,
                sequence: sequence,
                change: change,
                of: encoded,
                pieceBytes: configuration.pieceBytes
            ) {
                try await write(piece, to: outbound)
            }
        }
        // An exact size only when the cheap upper bound says it might not fit.
        let size = prepared.message.maximumEncodedSize
        guard size <= configuration.maximumFrameLength
            || WireMessage.changeBatch(prepared.message).encoded().count <= configuration.maximumFrameLength
        else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "unsendable change: batch \(sequence) holds a row of \(size) bytes, more than the "
                    + "\(configuration.maximumFrameLength)-byte frame maximum (a primary key or many columns too large "
                    + "to travel); it and the changes after it are held back"
            )
        }
        try await write(.changeBatch(prepared.message), to: outbound)
    }

    /// Sends one message; a peer that stops reading makes the write wait, and after the idle timeout the
    /// connection is closed rather than left hanging.
    private func write(
        _ message: WireMessage,
        to outbound: NIOAsyncChannelOutboundWriter<WireMessage>
    ) async throws(ShoalError) {
        let limit = configuration.session.idleTimeout
        let channel = self.channel
        let fired = Flag()
        let watchdog = Task {
            try await Task.sleep(for: .milliseconds(limit))
            fired.set()
            channel.close(promise: nil)
        }
        defer { watchdog.cancel() }
        do {
            try await outbound.write(message)
        } catch {
            if fired.isSet {
                throw ShoalError(code: .timeout, message: "the peer stopped reading: a write waited \(limit) ms")
            }
            throw ShoalError(code: .timeout, message: "could not send to the peer: \(error)")
        }
    }

    /// The reason sent to the peer when a round fails here.
    static func reason(whenFailing code: ShoalError.Code) -> Rejection.Reason {
        switch code {
        case .frameTooLarge: .unsendableChange  // only sending raises it here: decoding errors end the stream
        case .clockTooFarAhead, .sqlite, .siteConflict, .unknownTable, .unknownColumn: .applyFailed
        case .timeout: .timeout
        default: .other
        }
    }

    static func reason(for code: ShoalError.Code) -> Rejection.Reason {
        switch code {
        case .frameTooLarge: .frameTooLarge
        case .unknownMessageType: .unknownMessageType
        case .malformedMessage: .malformedMessage
        case .timeout: .timeout
        default: .other
        }
    }
}

/// A flag set once, from any thread.
final class Flag: Sendable {
    private let value = Mutex(false)

    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}
