import ShoalCore

/// One anti-entropy conversation with one peer, as a pure state machine.
///
/// The session does no I/O and reads no clock: the shell that owns the connection feeds it messages,
/// the current time and the results of store operations, and carries out the ``Action``s it returns.
/// Each side pulls: it sends a ``SyncRequest`` with its version vector, applies the batches that answer
/// it, and acknowledges the last one. A pull from a peer whose version vector shows changes we lack
/// prompts a pull of our own (the shell decides, see ``Action/serve(_:)``), so both directions run in the
/// same round.
public struct SyncSession: Sendable {
    /// Time limits, in milliseconds, and sizes, in bytes.
    public struct Configuration: Sendable, Hashable {
        /// How long the peer may take to say hello.
        public var handshakeTimeout: UInt64 = 5_000
        /// How long the connection may stay silent before a ping is sent.
        public var keepaliveInterval: UInt64 = 5_000
        /// How long the peer may stay silent before the connection is closed.
        public var idleTimeout: UInt64 = 15_000
        /// Whether this side pings a quiet link (the dialling side does; the other hears its pings, and both enforce
        /// the idle timeout): one ping and one pong per quiet interval instead of two of each.
        public var sendsKeepalives = true
        /// The largest value accepted in pieces (its canonical encoding; a few bytes of tag and length over the
        /// documented maximum value size are allowed).
        public var maximumValueBytes = WireProtocol.maximumValueBytes
        /// The largest frame either side sends or accepts: an outgoing batch that would not fit is unsendable.
        public var maximumFrameLength = WireProtocol.defaultMaximumFrameLength
        /// Values whose encoding is longer than this travel in pieces (protocol version 2 on).
        public var inlineValueLimit = WireProtocol.defaultInlineValueLimit
        /// The size of each piece of a value that travels in pieces.
        public var pieceBytes = WireProtocol.defaultPieceBytes
        /// After a failure here, how long the session keeps reading for the peer's own refusal (which says more
        /// than a broken connection) before it gives up.
        public var lingerTimeout: UInt64 = 500
        /// Whether this side says hello at once (`true`: both sides do), or only after the peer's hello was
        /// accepted: the dialling side of an authenticated link waits, so that it sends nothing before the
        /// accepting side, which checks the dialler's key last, has accepted it.
        public var speaksFirst = true
        /// Whether change batches and value pieces are compressed, where that pays, on links of protocol version 6 or
        /// more (``SyncSession/packed(_:)``); off, they travel as they are (a setting for measuring, mostly).
        public var compression = true
        /// The newest protocol version this node offers in its hello: lower it to speak as an older build would (to
        /// test against one, or to roll out a version in stages).
        public var highestVersion = WireProtocol.maximumVersion

        /// The defaults.
        public init() {}
    }

    /// What the shell must do.
    public enum Action: Hashable, Sendable {
        /// Send this message.
        case send(WireMessage)
        /// The handshake succeeded: the peer and the protocol version in use.
        case established(Hello, version: UInt16)
        /// Answer the peer's request: send every change its vector lacks, one batch at a time, each prepared by
        /// ``SyncSession/outgoingBatch(answering:_:isLast:estimatedRemaining:)``; then call
        /// ``SyncSession/served(_:localVersionVector:)``, which says whether to pull back.
        case serve(SyncRequest)
        /// Apply a batch that answers our request, then call ``SyncSession/applied(_:versionVector:digest:now:)``.
        case apply(ChangeBatchMessage)
        /// Start a pull: call ``SyncSession/startRound(versionVector:now:)`` with the local version vector.
        case wantRound
        /// Something committed here: send the peer ``WireMessage/holding(_:)`` with the local version vector, unless
        /// the peer is known to hold all of it already (protocol version 7; an older peer gets a round instead).
        case announce
        /// The peer said it now holds this version vector: pull (``wantRound``) when the local one lacks something of
        /// it; otherwise nothing is to be done.
        case peerHolds(VersionVector)
        /// The peer passed on what members it knows of last held (``WireMessage/members(_:)``): for the node to record.
        case peerReports([MemberGossip])
        /// The peer took a fresh state covering this (``WireMessage/freshState(_:)``): for the node to record.
        case peerTookFreshState(VersionVector)
        /// Our pull finished: we hold everything the peer held when it answered.
        case roundFinished(requestID: UInt64)
        /// The peer applied our changes and now holds this (and, when given, has this digest).
        case peerAcknowledged(Ack)
        /// The peer refused us with this reason (a `close` follows): for the status and the log.
        case peerRefused(Rejection)
        /// Close the connection (after sending whatever came before).
        case close(ShoalError)
        /// The peer opened an inspection (``WireMessage/inspect(_:)``) and its hello was accepted: no round runs;
        /// the shell decides whether to keep it, like ``established(_:version:)``.
        case inspectionStarted(Hello, version: UInt16)
        /// Answer the peer's inspection request with an ``InspectionAnswer`` (read-only).
        case answerInspection(InspectionRequest)
    }

    /// Where the conversation is.
    public enum Phase: Hashable, Sendable {
        /// Waiting for the peer's hello.
        case handshaking
        /// Both hellos were accepted: rounds run.
        case established
        /// A failure here closed the session: it only waits (``Configuration/lingerTimeout``) for the peer's
        /// refusal, which explains the failure better than the closed connection.
        case lingering
        /// Over: the shell closes the connection.
        case closed
    }

    /// This node's hello.
    public let local: Hello
    /// Time limits and sizes.
    public let configuration: Configuration
    /// Where the conversation is.
    public private(set) var phase: Phase = .handshaking
    /// The peer's hello, once accepted.
    public private(set) var peer: Hello?
    /// The protocol version in use, once negotiated.
    public private(set) var version: UInt16?
    /// The request id of our pull in progress.
    public private(set) var outstandingRequest: UInt64?
    /// Whether the peer opened the connection to inspect only (``WireMessage/inspect(_:)``): it answers inspection
    /// requests and nothing else, and runs no round.
    public private(set) var isInspection = false
    /// The sequence number the next batch of our pull must carry.
    var expectedBatch: UInt32 = 0
    private var roundRequested = false
    private var nextRequestID: UInt64 = 1
    private var startedAt: UInt64
    private var lastHeard: UInt64
    private var pingNonce: UInt64?
    /// Until when a lingering session waits for the peer's refusal.
    private var lingerUntil: UInt64 = 0
    /// The peer's request being answered, and the sequence number its next batch carries.
    var serving: (requestID: UInt64, next: UInt32)?
    /// The value arriving in pieces, for the next batch of our pull.
    var assembling: (change: UInt32, total: UInt64, bytes: [UInt8])?
    /// Values of the next batch that arrived whole in pieces (encoded), by change index.
    var assembled: [UInt32: [UInt8]] = [:]

    /// A session about to say `local` to a new peer; `now` is the monotonic time in milliseconds, from which
    /// the handshake timeout runs. Call ``start()`` next.
    public init(local: Hello, configuration: Configuration = Configuration(), now: UInt64) {
        self.local = local
        self.configuration = configuration
        self.startedAt = now
        self.lastHeard = now
    }

    /// Opens the conversation: both sides send hello at once, unless this one waits for the peer's
    /// (``Configuration/speaksFirst``).
    public mutating func start() -> [Action] {
        configuration.speaksFirst ? [.send(.hello(local))] : []
    }

    /// Handles one message from the peer.
    public mutating func receive(_ message: WireMessage, now: UInt64) -> [Action] {
        guard phase != .closed else { return [] }
        lastHeard = now
        var message = message
        if case .encoded(let encoded) = message {
            // What a stream without framing (in memory) hands over as it was sent: decoded here as the codec would,
            // within the same limits.
            do throws(ShoalError) {
                message = try WireMessage.decode(encoded.payload, maximumInflatedLength: configuration.maximumFrameLength)
            } catch {
                return refuse(Self.reason(forDecodingFailure: error.code), error.message, code: error.code)
            }
        }
        if phase == .lingering {
            // Only the peer's refusal matters now: it says why better than the closed connection does.
            guard case .reject(let rejection) = message else { return [] }
            phase = .closed
            return [.peerRefused(rejection)]
        }
        if case .reject(let rejection) = message {
            phase = .closed
            return [
                .peerRefused(rejection),
                .close(ShoalError(code: .rejected, message: "the peer refused this connection: \(rejection.message)")),
            ]
        }
        switch phase {
        case .closed, .lingering:
            return []
        case .handshaking:
            switch message {
            case .hello(let hello):
                return handshake(hello)
            case .inspect(let hello):
                return handshake(hello, inspection: true)
            default:
                return refuse(.malformedMessage, "expected hello before anything else", code: .malformedMessage)
            }
        case .established:
            return converse(message)
        }
    }

    private mutating func handshake(_ hello: Hello, inspection: Bool = false) -> [Action] {
        guard let version = WireProtocol.negotiate(local.versions, hello.versions),
            !inspection || version >= WireProtocol.inspectionVersion
        else {
            return refuse(
                .versionMismatch,
                "this node speaks protocol versions \(local.versions.lowerBound)-\(local.versions.upperBound), "
                    + "the peer \(hello.versions.lowerBound)-\(hello.versions.upperBound)",
                code: .versionMismatch
            )
        }
        guard hello.clusterID == local.clusterID else {
            return refuse(
                .clusterMismatch,
                "this node belongs to cluster \"\(local.clusterID)\", the peer to \"\(hello.clusterID)\"",
                code: .clusterMismatch
            )
        }
        guard hello.siteID != local.siteID else {
            return refuse(
                .selfConnection,
                "the peer has this node's own site id \(local.siteID.hex)",
                code: .selfConnection
            )
        }
        guard hello.schemaFingerprint == local.schemaFingerprint || version >= WireProtocol.schemaChangeVersion else {
            // The side whose Shoal is too old is named, and the advice comes first: a peer shows only the start of a
            // refusal's text, and the two schemas can be long.
            let oldSide =
                hello.versions.upperBound < WireProtocol.schemaChangeVersion
                ? (hello.nodeName.isEmpty ? "the peer" : hello.nodeName)
                : (local.nodeName.isEmpty ? "this node" : local.nodeName)
            return refuse(
                .schemaMismatch,
                "upgrade Shoal on \(oldSide): its Shoal is too old to carry schema changes (protocol \(version); they "
                    + "need \(WireProtocol.schemaChangeVersion)), and the replicated schemas differ (here "
                    + "\"\(local.schemaFingerprint)\", there \"\(hello.schemaFingerprint)\")",
                code: .unsupportedSchema
            )
        }
        phase = .established
        peer = hello
        self.version = version
        let reply: [Action] = configuration.speaksFirst ? [] : [.send(.hello(local))]
        guard !inspection else {
            isInspection = true
            return reply + [.inspectionStarted(hello, version: version)]
        }
        return reply + [.established(hello, version: version), .wantRound]
    }

    private mutating func converse(_ message: WireMessage) -> [Action] {
        if isInspection { return inspect(message) }
        switch message {
        case .hello, .inspect:
            return refuse(.malformedMessage, "a second hello", code: .malformedMessage)
        case .inspectionRequest, .inspectionAnswer:
            return refuse(
                .malformedMessage,
                "an inspection message on a sync connection (an inspection opens with its own hello)",
                code: .malformedMessage
            )
        case .syncRequest(let request):
            // The shell serves it; ``served(_:localVersionVector:)`` then decides whether to pull back.
            serving = (request.requestID, 0)
            return [.serve(request)]
        case .changeBatch(let batch):
            guard batch.requestID == outstandingRequest, batch.sequence == expectedBatch else {
                return refuse(
                    .malformedMessage,
                    "a change batch (request \(batch.requestID), number \(batch.sequence)) that is not the next one expected",
                    code: .malformedMessage
                )
            }
            var batch = batch
            if let failure = reassemble(&batch) { return failure }
            expectedBatch += 1
            return [.apply(batch)]
        case .valuePiece(let piece):
            return receivePiece(piece)
        case .ack(let ack):
            return [.peerAcknowledged(ack)]
        case .holding(let vector):
            return [.peerHolds(vector)]
        case .members(let reports):
            return [.peerReports(reports)]
        case .freshState(let vector):
            return [.peerTookFreshState(vector)]
        case .ping(let nonce):
            return [.send(.pong(nonce))]
        case .pong(let nonce):
            if nonce == pingNonce { pingNonce = nil }
            return []
        case .reject:
            return []  // handled in receive
        case .join:
            return refuse(.malformedMessage, "a join message on a sync connection", code: .malformedMessage)
        case .encoded:
            return []  // decoded in receive
        }
    }

    /// What an inspection connection takes: inspection requests (answered read-only) and keepalives.
    private mutating func inspect(_ message: WireMessage) -> [Action] {
        switch message {
        case .inspectionRequest(let request):
            return [.answerInspection(request)]
        case .ping(let nonce):
            return [.send(.pong(nonce))]
        case .pong(let nonce):
            if nonce == pingNonce { pingNonce = nil }
            return []
        default:
            return refuse(
                .malformedMessage,
                "a message other than an inspection request on an inspection",
                code: .malformedMessage
            )
        }
    }

    /// Starts a pull with the local version vector, unless one is running (then one more follows it). To a peer that
    /// reads them (version 4), the request also carries `wallClock` (the local wall clock's reading), `writingSite`
    /// (the site this node writes as) and `answererHead` (the latest transaction held of the peer's writing site).
    public mutating func startRound(
        versionVector: VersionVector,
        now: UInt64,
        wallClock: UInt64? = nil,
        writingSite: SiteID? = nil,
        answererHead: Stamp? = nil
    ) -> [Action] {
        guard phase == .established, !isInspection else { return [] }
        guard outstandingRequest == nil else {
            roundRequested = true
            return []
        }
        let requestID = nextRequestID
        nextRequestID += 1
        outstandingRequest = requestID
        expectedBatch = 0
        var request = SyncRequest(requestID: requestID, versionVector: versionVector)
        // Version 4's fields travel only to peers that read them (a peer of an older version refuses trailing bytes).
        if version.map({ $0 >= WireProtocol.clockVersion }) == true, let wallClock, let writingSite {
            request.wallClockMilliseconds = wallClock
            request.writingSite = writingSite
            request.answererHead = answererHead
        }
        return [.send(.syncRequest(request))]
    }

    /// The shell applied a batch of our pull. After the last one the pull is acknowledged and finished.
    public mutating func applied(
        _ batch: ChangeBatchMessage,
        versionVector: VersionVector,
        digest: [UInt8]?,
        now: UInt64
    ) -> [Action] {
        guard phase == .established, batch.requestID == outstandingRequest, batch.isLast else { return [] }
        outstandingRequest = nil
        var actions: [Action] = [
            .send(.ack(Ack(requestID: batch.requestID, versionVector: versionVector, digest: digest))),
            .roundFinished(requestID: batch.requestID),
        ]
        if roundRequested {
            roundRequested = false
            actions.append(.wantRound)
        }
        return actions
    }

    /// Time passed: enforces the handshake and idle timeouts and keeps a quiet connection alive.
    public mutating func tick(now: UInt64) -> [Action] {
        switch phase {
        case .closed:
            return []
        case .lingering:
            if now >= lingerUntil { phase = .closed }
            return []
        case .handshaking:
            guard now >= startedAt + configuration.handshakeTimeout else { return [] }
            return refuse(
                .timeout,
                "no hello within \(configuration.handshakeTimeout) ms",
                code: .timeout
            )
        case .established:
            if now >= lastHeard + configuration.idleTimeout {
                return refuse(.timeout, "the peer was silent for \(now - lastHeard) ms", code: .timeout)
            }
            if configuration.sendsKeepalives && now >= lastHeard + configuration.keepaliveInterval && pingNonce == nil {
                pingNonce = now
                return [.send(.ping(now))]
            }
            return []
        }
    }

    /// Something failed here while carrying out an action (a store error, a send that could not finish): tell
    /// the peer why (the reason follows from the error's code) and close, after lingering briefly for the
    /// peer's own refusal, which a send cut short may have crossed.
    public mutating func fail(_ error: ShoalError, now: UInt64) -> [Action] {
        guard phase != .closed && phase != .lingering else { return [] }
        phase = .lingering
        lingerUntil = now + configuration.lingerTimeout
        return [.send(.reject(Rejection(Self.reason(forFailureHere: error.code), error.message))), .close(error)]
    }

    /// The node ends the conversation (it is stopping, keeps another connection to this peer, is full): tell the
    /// peer why and close at once.
    public mutating func close(_ error: ShoalError, reason: Rejection.Reason) -> [Action] {
        guard phase != .closed else { return [] }
        if phase == .lingering {
            // Already closed here, with its own reason: stop waiting for the peer's.
            phase = .closed
            return []
        }
        phase = .closed
        return [.send(.reject(Rejection(reason, error.message))), .close(error)]
    }

    /// The inbound stream ended: cleanly (`nil`: the peer closed) or with a decoding error, which the peer is
    /// told about before the connection closes.
    public mutating func streamEnded(_ error: ShoalError?) -> [Action] {
        switch phase {
        case .closed:
            return []
        case .lingering:
            phase = .closed
            return []
        case .handshaking, .established:
            phase = .closed
            guard let error else {
                return [.close(ShoalError(code: .rejected, message: "the peer closed the connection"))]
            }
            return [.send(.reject(Rejection(Self.reason(forDecodingFailure: error.code), error.message))), .close(error)]
        }
    }

    /// A periodic round is due (or, with a peer before version 7, something changed locally): pull, so that the peer
    /// pulls back.
    public func localChange() -> [Action] {
        phase == .established && !isInspection ? [.wantRound] : []
    }

    /// Something committed here: tell the peer what this node now holds (``Action/announce``), or, with a peer before
    /// version 7, start a round.
    public func committed() -> [Action] {
        guard phase == .established, !isInspection else { return [] }
        return (version ?? 0) >= WireProtocol.holdingVersion ? [.announce] : [.wantRound]
    }

    /// The whole answer to `request` was sent. When the request's vector holds something the local one lacks,
    /// pull in the same round (pulling back unconditionally would make two idle peers prompt each other forever).
    public mutating func served(_ request: SyncRequest, localVersionVector: VersionVector) -> [Action] {
        if serving?.requestID == request.requestID { serving = nil }
        guard phase == .established, !localVersionVector.dominatesOrEquals(request.versionVector) else { return [] }
        return [.wantRound]
    }

    /// The peer took a batch of our answer. It says nothing while it is served (it acknowledges the last batch
    /// only), and an answer may take longer than the idle timeout; the shell's writes wait while the peer stops
    /// reading, and fail after the idle timeout, so a write that went through counts as hearing from it.
    public mutating func peerIsReading(now: UInt64) {
        lastHeard = max(lastHeard, now)
    }

    /// Whether nothing is under way: established, no pull waiting for its answer, no answer being sent. Its next
    /// deadline (keepalive, idle timeout) is seconds away.
    public var isQuiet: Bool { phase == .established && outstandingRequest == nil && serving == nil }

    /// This side could not watch the link for `milliseconds` (its loop was busy with the store, or the process got
    /// no time at all): that time is not the peer's silence. What the peer sent meanwhile waits to be read, and the
    /// idle timeout counts only time this side was there to hear it.
    public mutating func couldNotWatch(milliseconds: UInt64, now: UInt64) {
        lastHeard = min(now, lastHeard + milliseconds)
    }

    /// The reason sent to the peer when something fails here.
    public static func reason(forFailureHere code: ShoalError.Code) -> Rejection.Reason {
        switch code {
        case .frameTooLarge: .unsendableChange  // only sending raises it here: decoding errors end the stream
        case .clockTooFarAhead, .sqlite, .siteConflict, .unknownTable, .unknownColumn: .applyFailed
        case .timeout: .timeout
        default: .other
        }
    }

    /// The reason sent to the peer when what it sent could not be decoded.
    public static func reason(forDecodingFailure code: ShoalError.Code) -> Rejection.Reason {
        switch code {
        case .frameTooLarge: .frameTooLarge
        case .unknownMessageType: .unknownMessageType
        case .malformedMessage: .malformedMessage
        case .timeout: .timeout
        default: .other
        }
    }

    mutating func refuse(_ reason: Rejection.Reason, _ message: String, code: ShoalError.Code) -> [Action] {
        phase = .closed
        return [.send(.reject(Rejection(reason, message))), .close(ShoalError(code: code, message: message))]
    }
}
