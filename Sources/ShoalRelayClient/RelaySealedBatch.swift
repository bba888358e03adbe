import ShoalCore
import ShoalProtocol

/// What a node seals into the relay's change sets: one change batch (a part of one site's range and, at its end, the
/// range's claim), in a format of the relay's own, versioned apart from the LAN wire protocol. Sealed, so the relay
/// never reads it; every member reads what every other member sealed, of this build and of older ones.
///
/// Layout: the format's version (`u8`, counted from 128: below it, the first byte is a wire message type, as members
/// sealed change sets before this format), flags (`u8`; bit 0: compressed; the others must be clear), then the change
/// batch's body (``ChangeBatch/encodedBody()``): as it is, or, compressed, its length (`varint`) and a zlib stream of
/// it to the end.
///
/// Older members sealed a whole LAN message instead: a change batch (type 3, with a request id of 0) or a compressed
/// frame holding one (type 13). Those still open: relays keep what older members uploaded, and snapshots made by them.
public enum RelaySealedBatch {
    /// The version this build writes.
    public static let version: UInt8 = 0x81

    /// The flags of a version-1 batch.
    struct Flags: OptionSet {
        let rawValue: UInt8
        /// The body is a zlib stream, after its length.
        static let compressed = Flags(rawValue: 1)
    }

    /// `batch` encoded for sealing: compressed when `compressing` and that pays (the same rule as the LAN's frames,
    /// ``WireMessage/compressed(_:prefix:)``). `uncompressedCount` is the body's length before compression.
    public static func encoded(_ batch: ChangeBatch, compressing: Bool) -> EncodedMessage {
        let body = batch.encodedBody()
        if compressing {
            var header: [UInt8] = [version, Flags.compressed.rawValue]
            header.appendVarint(UInt64(body.count))
            if let packed = WireMessage.compressed(body, prefix: header) {
                return EncodedMessage(payload: packed, uncompressedCount: body.count)
            }
        }
        return EncodedMessage(payload: [version, 0] + body, uncompressedCount: body.count)
    }

    /// The change batch a sealed change set's `plaintext` holds, inflating at most `maximumInflatedLength` bytes; in
    /// this format or as older members sealed them (a wire message). Throws ``ShoalError`` (`.malformedMessage`,
    /// `.frameTooLarge`, `.unknownMessageType`) for anything else, never reading past `plaintext`.
    public static func decode(_ plaintext: [UInt8], maximumInflatedLength: Int) throws(ShoalError) -> ChangeBatch {
        guard let first = plaintext.first else { throw malformed("an empty sealed change set") }
        guard first >= 0x80 else {
            // As members sealed change sets before this format: a wire message, a change batch in it.
            let message = try WireMessage.decode(plaintext, maximumInflatedLength: maximumInflatedLength)
            guard case .changeBatch(let batch) = message else {
                throw malformed("a sealed message that is no change batch")
            }
            guard batch.piecedValues.isEmpty else {
                throw malformed("a sealed change batch whose values come in pieces")
            }
            return batch.batch
        }
        guard first == version else {
            throw ShoalError(
                code: .unknownMessageType,
                message: "a sealed change set of format version \(Int(first) - 0x80), which this build does not read "
                    + "(sealed by a newer member: update this node)"
            )
        }
        guard plaintext.count >= 2 else { throw malformed("a sealed change set cut inside its header") }
        let flags = Flags(rawValue: plaintext[1])
        guard flags.subtracting(.compressed).isEmpty else {
            throw malformed("a sealed change set with unknown flags \(plaintext[1])")
        }
        guard flags.contains(.compressed) else { return try ChangeBatch(decodingBody: Array(plaintext[2...])) }
        var reader = ByteReader(plaintext)
        let length: UInt64
        do throws(ShoalError) {
            _ = try reader.readBytes(2)
            length = try reader.readVarint()
        } catch {
            throw malformed("a sealed change set cut inside its header")
        }
        guard length <= UInt64(maximumInflatedLength) else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "a sealed change set holds \(length) bytes, more than the maximum of \(maximumInflatedLength)"
            )
        }
        return try ChangeBatch(decodingBody: try Deflate.decompress(plaintext[reader.offset...], length: Int(length)))
    }

    private static func malformed(_ detail: String) -> ShoalError {
        ShoalError(code: .malformedMessage, message: "malformed message: \(detail)")
    }
}
