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
    /// Time limits, in milliseconds.
    public struct Configuration: Sendable, Hashable {
        /// How long the peer may take to say hello.
        public var handshakeTimeout: UInt64 = 5_000
        /// How long the connection may stay silent before a ping is sent.
        public var keepaliveInterval: UInt64 = 5_000
        /// How long the peer may stay silent before the connection is closed.
        public var idleTimeout: UInt64 = 15_000
        /// The largest value accepted in pieces (its canonical encoding; a few bytes of tag and length over the
        /// documented maximum value size are allowed).
        public var maximumValueBytes = WireProtocol.maximumValueBytes

        public init() {}
    }

    /// What the shell must do.
    public enum Action: Hashable, Sendable {
        /// Send this message.
        case send(WireMessage)
        /// The handshake succeeded: the peer and the protocol version in use.
        case established(Hello, version: UInt16)
        /// Answer the peer's request: send every change its vector lacks as `changeBatch`es, the last one
        /// flagged (``SyncSession/batches(for:_:)`` builds them). When the request's vector holds something
        /// the local one lacks, pull too (call ``SyncSession/startRound(versionVector:now:)``).
        case serve(SyncRequest)
        /// Apply a batch that answers our request, then call ``SyncSession/applied(_:versionVector:digest:now:)``.
        case apply(ChangeBatchMessage)
        /// Start a pull: call ``SyncSession/startRound(versionVector:now:)`` with the local version vector.
        case wantRound
        /// Our pull finished: we hold everything the peer held when it answered.
        case roundFinished(requestID: UInt64)
        /// The peer applied our changes and now holds this (and, when given, has this digest).
        case peerAcknowledged(Ack)
        /// The peer refused us with this reason (a `close` follows): for the status and the log.
        case peerRefused(Rejection)
        /// Close the connection (after sending whatever came before).
        case close(ShoalError)
    }

    public enum Phase: Hashable, Sendable {
        case handshaking, established, closed
    }

    public let local: Hello
    public let configuration: Configuration
    public private(set) var phase: Phase = .handshaking
    public private(set) var peer: Hello?
    public private(set) var version: UInt16?
    /// The request id of our pull in progress.
    public private(set) var outstandingRequest: UInt64?
    /// The sequence number the next batch of our pull must carry.
    private var expectedBatch: UInt32 = 0
    private var roundRequested = false
    private var nextRequestID: UInt64 = 1
    private var startedAt: UInt64
    private var lastHeard: UInt64
    private var pingNonce: UInt64?
    /// The value arriving in pieces, for the next batch of our pull.
    private var assembling: (change: UInt32, total: UInt64, bytes: [UInt8])?
    /// Values of the next batch that arrived whole in pieces (encoded), by change index.
    private var assembled: [UInt32: [UInt8]] = [:]

    public init(local: Hello, configuration: Configuration = Configuration(), now: UInt64) {
        self.local = local
        self.configuration = configuration
        self.startedAt = now
        self.lastHeard = now
    }

    /// Opens the conversation: both sides send hello at once.
    public mutating func start() -> [Action] {
        [.send(.hello(local))]
    }

    /// Handles one message from the peer.
    public mutating func receive(_ message: WireMessage, now: UInt64) -> [Action] {
        guard phase != .closed else { return [] }
        lastHeard = now
        if case .reject(let rejection) = message {
            phase = .closed
            return [
                .peerRefused(rejection),
                .close(ShoalError(code: .rejected, message: "the peer refused this connection: \(rejection.message)")),
            ]
        }
        switch phase {
        case .closed:
            return []
        case .handshaking:
            guard case .hello(let hello) = message else {
                return refuse(.malformedMessage, "expected hello before anything else", code: .malformedMessage)
            }
            return handshake(hello)
        case .established:
            return converse(message)
        }
    }

    private mutating func handshake(_ hello: Hello) -> [Action] {
        guard let version = WireProtocol.negotiate(local.versions, hello.versions) else {
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
        guard hello.schemaFingerprint == local.schemaFingerprint else {
            return refuse(
                .schemaMismatch,
                "replicated schemas differ: here \"\(local.schemaFingerprint)\", there \"\(hello.schemaFingerprint)\"",
                code: .unsupportedSchema
            )
        }
        phase = .established
        peer = hello
        self.version = version
        return [.established(hello, version: version), .wantRound]
    }

    private mutating func converse(_ message: WireMessage) -> [Action] {
        switch message {
        case .hello:
            return refuse(.malformedMessage, "a second hello", code: .malformedMessage)
        case .syncRequest(let request):
            // The shell serves it, and pulls in the same round when the request shows the peer holds
            // something we lack (pulling back unconditionally would make two idle peers prompt each other
            // forever).
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
        case .ping(let nonce):
            return [.send(.pong(nonce))]
        case .pong(let nonce):
            if nonce == pingNonce { pingNonce = nil }
            return []
        case .reject:
            return []  // handled in receive
        }
    }

    /// Buffers one piece of a value of the next batch of our pull, within the maximum value size.
    private mutating func receivePiece(_ piece: ValuePiece) -> [Action] {
        guard piece.requestID == outstandingRequest, piece.sequence == expectedBatch else {
            return refuse(
                .malformedMessage,
                "a value piece (request \(piece.requestID), batch \(piece.sequence)) for a batch not expected next",
                code: .malformedMessage
            )
        }
        guard piece.totalLength <= UInt64(configuration.maximumValueBytes) + 16 else {
            return refuse(
                .valueTooLarge,
                "a value of \(piece.totalLength) bytes exceeds this node's maximum value size of "
                    + "\(configuration.maximumValueBytes) bytes; the change was not accepted",
                code: .frameTooLarge
            )
        }
        if var current = assembling {
            guard piece.change == current.change, piece.totalLength == current.total,
                piece.offset == UInt64(current.bytes.count)
            else {
                return refuse(
                    .malformedMessage,
                    "a value piece out of order (change \(piece.change) at \(piece.offset)) while change "
                        + "\(current.change) has \(current.bytes.count) of \(current.total) bytes",
                    code: .malformedMessage
                )
            }
            assembling = nil  // keeps the buffer uniquely referenced while it grows
            let needed = current.bytes.count + piece.bytes.count
            if current.bytes.capacity < needed {
                // Doubling, but never past the announced total: a value of 64 MiB takes 64 MiB, not 128.
                current.bytes.reserveCapacity(Int(min(current.total, UInt64(max(needed, current.bytes.count * 2)))))
            }
            current.bytes.append(contentsOf: piece.bytes)
            assembling = current
        } else {
            guard piece.offset == 0, assembled[piece.change] == nil,
                piece.change > (assembled.keys.max() ?? 0) || assembled.isEmpty
            else {
                return refuse(
                    .malformedMessage,
                    "a value piece for change \(piece.change) that does not start a new value",
                    code: .malformedMessage
                )
            }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(Int(min(piece.totalLength, 16 << 20)))
            bytes.append(contentsOf: piece.bytes)
            assembling = (piece.change, piece.totalLength, bytes)
        }
        if let current = assembling, UInt64(current.bytes.count) == current.total {
            assembled[current.change] = current.bytes
            assembling = nil
        }
        return []
    }

    /// Puts the values that came in pieces back into `batch`; the refusal when they do not match it.
    private mutating func reassemble(_ batch: inout ChangeBatchMessage) -> [Action]? {
        defer {
            assembled.removeAll()
            assembling = nil
        }
        guard assembling == nil else {
            return refuse(
                .malformedMessage,
                "change batch \(batch.sequence) arrived before the value of its change \(assembling!.change) was whole",
                code: .malformedMessage
            )
        }
        guard Set(batch.piecedValues) == Set(assembled.keys), batch.piecedValues.count == assembled.count else {
            return refuse(
                .malformedMessage,
                "change batch \(batch.sequence) expects values in pieces for changes \(batch.piecedValues), "
                    + "but those received were for \(assembled.keys.sorted())",
                code: .malformedMessage
            )
        }
        for index in batch.piecedValues {
            guard Int(index) < batch.batch.changes.count,
                case .column(let name, _) = batch.batch.changes[Int(index)].payload
            else {
                return refuse(.malformedMessage, "a value in pieces for change \(index), not a column change", code: .malformedMessage)
            }
            guard let value = Self.decodeWhole(assembled.removeValue(forKey: index)!) else {
                return refuse(.malformedMessage, "the pieces of change \(index) do not form one value", code: .malformedMessage)
            }
            batch.batch.changes[Int(index)].payload = .column(name, value)
        }
        batch.piecedValues = []
        return nil
    }
    /// Starts a pull with the local version vector, unless one is running (then one more follows it).
    public mutating func startRound(versionVector: VersionVector, now: UInt64) -> [Action] {
        guard phase == .established else { return [] }
        guard outstandingRequest == nil else {
            roundRequested = true
            return []
        }
        let requestID = nextRequestID
        nextRequestID += 1
        outstandingRequest = requestID
        expectedBatch = 0
        return [.send(.syncRequest(SyncRequest(requestID: requestID, versionVector: versionVector)))]
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
            if now >= lastHeard + configuration.keepaliveInterval && pingNonce == nil {
                pingNonce = now
                return [.send(.ping(now))]
            }
            return []
        }
    }

    /// Something failed in the shell (a store error, a bad write): refuse and close.
    public mutating func fail(_ error: ShoalError, reason: Rejection.Reason = .other) -> [Action] {
        guard phase != .closed else { return [] }
        phase = .closed
        return [.send(.reject(Rejection(reason, error.message))), .close(error)]
    }

    private mutating func refuse(_ reason: Rejection.Reason, _ message: String, code: ShoalError.Code) -> [Action] {
        phase = .closed
        return [.send(.reject(Rejection(reason, message))), .close(ShoalError(code: code, message: message))]
    }

    /// Decodes one value's reassembled encoding, or `nil` when it is not exactly one value. A blob keeps the
    /// buffer it arrived in (its header is shifted out in place), so a large blob is not copied once more.
    static func decodeWhole(_ encoded: consuming [UInt8]) -> SQLValue? {
        if encoded.first == 4 {
            // The tag, then the length as a varint (at most 10 bytes), then exactly that many bytes.
            var length: UInt64 = 0
            var header = 1
            var shift: UInt64 = 0
            while header < min(encoded.count, 11) {
                let byte = encoded[header]
                header += 1
                length |= UInt64(byte & 0x7f) << shift
                if byte < 0x80 { break }
                shift += 7
            }
            if header >= 2, encoded[header - 1] < 0x80, UInt64(encoded.count - header) == length {
                encoded.removeSubrange(0..<header)
                return .blob(encoded)
            }
        }
        var reader = ByteReader(encoded)
        guard let value = try? SQLValue.decode(from: &reader), reader.isAtEnd else { return nil }
        return value
    }

    /// A batch ready to send: values too large to travel inside it are taken out, to be sent first in pieces
    /// (``pieces(requestID:sequence:change:of:pieceBytes:)``).
    public struct OutgoingBatch: Sendable {
        public var message: ChangeBatchMessage
        /// The encoded values taken out of the batch, by change index, ascending.
        public var pieced: [(change: UInt32, encoded: [UInt8])]
    }

    /// Prepares a batch for a peer speaking `version`: from version 2 on, every value whose encoding exceeds
    /// `inlineLimit` travels in pieces. A value beyond `maximumValueBytes` cannot be sent at all: the error
    /// says which (the caller refuses the round with ``Rejection/Reason/unsendableChange``).
    public static func outgoing(
        _ message: consuming ChangeBatchMessage,
        version: UInt16,
        inlineLimit: Int = WireProtocol.defaultInlineValueLimit,
        maximumValueBytes: Int = WireProtocol.maximumValueBytes
    ) throws(ShoalError) -> OutgoingBatch {
        // Consumed, so that taking a value out of the batch frees it rather than leave a second copy alive.
        var message = message
        var pieced: [(change: UInt32, encoded: [UInt8])] = []
        for index in message.batch.changes.indices {
            guard case .column(let name, let value) = message.batch.changes[index].payload else { continue }
            let size = value.encodedSizeBound
            if size > maximumValueBytes + 16 {
                let change = message.batch.changes[index]
                throw ShoalError(
                    code: .frameTooLarge,
                    message: "the value of \(change.table).\(name) (\(size) bytes) exceeds the maximum value size of "
                        + "\(maximumValueBytes) bytes, so change \(change.stamp.site.hex.prefix(8)):\(change.stamp.seq) "
                        + "cannot be sent; the changes after it are held back until it is rewritten smaller"
                )
            }
            guard version >= WireProtocol.piecesVersion, size > inlineLimit else { continue }
            var encoded: [UInt8] = []
            encoded.reserveCapacity(size)
            value.encode(into: &encoded)
            message.batch.changes[index].payload = .column(name, .null)  // one copy fewer in memory
            pieced.append((UInt32(index), encoded))
            message.piecedValues.append(UInt32(index))
        }
        return OutgoingBatch(message: message, pieced: pieced)
    }

    /// The pieces of one encoded value, at most `pieceBytes` each, made one at a time as they are sent.
    public static func pieces(
        requestID: UInt64,
        sequence: UInt32,
        change: UInt32,
        of encoded: [UInt8],
        pieceBytes: Int = WireProtocol.defaultPieceBytes
    ) -> some Sequence<WireMessage> {
        stride(from: 0, to: encoded.count, by: max(1, pieceBytes)).lazy.map { offset in
            .valuePiece(
                ValuePiece(
                    requestID: requestID,
                    sequence: sequence,
                    change: change,
                    totalLength: UInt64(encoded.count),
                    offset: UInt64(offset),
                    bytes: Array(encoded[offset..<min(encoded.count, offset + pieceBytes)])
                )
            )
        }
    }

    /// Wraps the answer to `request` as messages: one per batch, the last one flagged.
    public static func batches(for request: SyncRequest, _ batches: [ChangeBatch]) -> [WireMessage] {
        batches.enumerated().map { index, batch in
            .changeBatch(
                ChangeBatchMessage(
                    requestID: request.requestID,
                    sequence: UInt32(index),
                    isLast: index == batches.count - 1,
                    batch: batch
                )
            )
        }
    }
}
