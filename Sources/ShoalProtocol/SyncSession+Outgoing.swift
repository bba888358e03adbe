import ShoalCore

/// Answering a peer's request: numbering batches, taking large values out to travel in pieces, and refusing
/// what cannot be sent.
extension SyncSession {
    /// A batch ready to send: values too large to travel inside it are taken out, to be sent first in pieces
    /// (``pieces(requestID:sequence:change:of:pieceBytes:)``).
    public struct OutgoingBatch: Sendable {
        /// The batch, numbered, with the pieced values left out (``ChangeBatchMessage/piecedValues`` lists them).
        public var message: ChangeBatchMessage
        /// The encoded values taken out of the batch, by change index, ascending.
        public var pieced: [(change: UInt32, encoded: [UInt8])]
    }

    /// Numbers the next batch of the answer to `request` and prepares it for the peer: values over the inline
    /// limit are taken out to travel in pieces first, and a batch that cannot fit a frame, or holds a value over
    /// the maximum, is refused with an error (``Rejection/Reason/unsendableChange`` on both sides): it and the
    /// changes after it are held back.
    public mutating func outgoingBatch(
        answering request: SyncRequest,
        _ batch: consuming ChangeBatch,
        isLast: Bool,
        estimatedRemaining: UInt64
    ) throws(ShoalError) -> OutgoingBatch {
        let sequence = serving?.requestID == request.requestID ? serving!.next : 0
        serving = (request.requestID, sequence + 1)
        let prepared = try Self.outgoing(
            ChangeBatchMessage(
                requestID: request.requestID,
                sequence: sequence,
                isLast: isLast,
                estimatedRemaining: estimatedRemaining,
                batch: batch
            ),
            version: version ?? WireProtocol.minimumVersion,
            inlineLimit: configuration.inlineValueLimit,
            maximumValueBytes: configuration.maximumValueBytes
        )
        // An exact size only when the cheap upper bound says it might not fit.
        let size = prepared.message.maximumEncodedSize
        let limit = configuration.maximumFrameLength
        guard size <= limit || WireMessage.changeBatch(prepared.message).encoded().count <= limit else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "unsendable change: batch \(sequence) holds a row of \(size) bytes, more than the "
                    + "\(limit)-byte frame maximum (a primary key or many columns too large to travel); it and the "
                    + "changes after it are held back"
            )
        }
        return prepared
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

    /// `message` (a change batch or value piece of an answer) encoded for the peer: compressed where that pays, when
    /// the link speaks ``WireProtocol/compressionVersion`` or more and ``Configuration/compression`` is on; otherwise
    /// its plain encoding, which any peer reads.
    public func packed(_ message: WireMessage) -> EncodedMessage {
        message.packed(
            compressing: configuration.compression && (version ?? 0) >= WireProtocol.compressionVersion
        )
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
}
