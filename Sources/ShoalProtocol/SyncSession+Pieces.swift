import ShoalCore

/// Values too large to travel inside a batch arrive first, in pieces: buffering and reassembling them.
extension SyncSession {
    /// Buffers one piece of a value of the next batch of our pull, within the maximum value size.
    mutating func receivePiece(_ piece: ValuePiece) -> [Action] {
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
    mutating func reassemble(_ batch: inout ChangeBatchMessage) -> [Action]? {
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
}
