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
                    events.yield(.ended(ShoalError(code: .malformedMessage, message: "\(error)")))
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
                        reason: .other
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
                    guard await node.connectionEstablished(id, peer: hello, address: address) else {
                        actions = session.fail(
                            ShoalError(code: .rejected, message: "already connected to \(hello.siteID.hex)"),
                            reason: .duplicateConnection
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
                            maxChanges: configuration.maxChangesPerBatch
                        ) {
                            try await write(
                                .changeBatch(
                                    ChangeBatchMessage(
                                        requestID: request.requestID,
                                        sequence: sequence,
                                        isLast: isLast,
                                        estimatedRemaining: remaining,
                                        batch: batch
                                    )
                                ),
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
                    let result = try await worker.apply(message.batch)
                    appliedThisRound += result.applied
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
                    if let peer {
                        await node.connectionRoundFinished(
                            peer: peer,
                            applied: appliedThisRound,
                            milliseconds: Self.now() - roundStarted
                        )
                    }
                case .peerAcknowledged(let ack):
                    if let peer { await node.connectionAcknowledged(peer: peer, ack) }
                case .close(let error):
                    return error
                }
            } catch {
                if let peer, session.phase == .established { await node.connectionRoundFailed(peer: peer) }
                actions = session.fail(error, reason: error.code == .clockTooFarAhead ? .applyFailed : .other)
            }
        }
        return nil
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
