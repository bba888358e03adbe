import ShoalCore

/// Compressed frames (protocol version 6): a change batch or a value piece, deflated when that makes it meaningfully
/// smaller. The same frame, sealed, is the body of the relay's change sets.
///
/// Layout: type 13, the method (`u8`, 1: a zlib stream), the length of the message it holds (`varint`), then the
/// zlib stream of that message's encoding, to the end of the frame.
extension WireMessage {
    /// The compression method byte of a zlib stream.
    static let zlibMethod: UInt8 = 1
    /// Encodings shorter than this are sent as they are: too small to gain.
    public static let compressionMinimumBytes = 512
    /// A compressed frame is kept only when it takes at most this share of the encoding (in percent): below that it
    /// costs the receiver an inflate for little, and already-compressed data (random-looking bytes) never gets there.
    public static let compressionKeptPercent = 90
    /// Encodings of at least four times this size are sampled first: two slices of this many bytes each are deflated,
    /// and when neither pays the whole is sent as it is, after a small fraction of the work.
    public static let compressionSampleBytes = 16 * 1024

    /// The message encoded for the wire: as a compressed frame when `compressing`, the message is a change batch or a
    /// value piece (the only messages a compressed frame may hold) and that pays; otherwise its plain encoding, the
    /// same bytes a peer of any version reads.
    public func packed(compressing: Bool) -> EncodedMessage {
        let payload = encoded()
        let compressible: Bool
        switch self {
        case .changeBatch, .valuePiece: compressible = compressing
        default: compressible = false
        }
        guard compressible, let frame = Self.compressedFrame(holding: payload) else {
            return EncodedMessage(payload: payload, uncompressedCount: payload.count)
        }
        return EncodedMessage(payload: frame, uncompressedCount: payload.count)
    }

    /// The compressed frame holding `payload` (an encoded change batch or value piece), or `nil` when compressing
    /// does not pay (``compressionKeptPercent``).
    static func compressedFrame(holding payload: [UInt8]) -> [UInt8]? {
        var header: [UInt8] = [Kind.compressed.rawValue, zlibMethod]
        header.appendVarint(UInt64(payload.count))
        return compressed(payload, prefix: header)
    }

    /// `prefix` followed by `payload` as a zlib stream, or `nil` when compressing does not pay: the payload is shorter
    /// than ``compressionMinimumBytes``, samples of a large one do not shrink, or the whole would keep more than
    /// ``compressionKeptPercent`` of its size. The one rule of when compression pays, for frames and for the change
    /// sets a node seals for the relay.
    public static func compressed(_ payload: [UInt8], prefix: [UInt8]) -> [UInt8]? {
        guard payload.count >= compressionMinimumBytes else { return nil }
        let sample = compressionSampleBytes
        if payload.count >= 4 * sample {
            let slices = [payload.count / 4, payload.count * 3 / 4].map { payload[$0..<$0 + sample] }
            let pays = slices.contains { Deflate.compress($0, budget: sample * compressionKeptPercent / 100) != nil }
            guard pays else { return nil }
        }
        return Deflate.compress(payload[...], prefix: prefix, budget: payload.count * compressionKeptPercent / 100)
    }

    /// Decodes a compressed frame as the message it holds, inflating at most `maximumInflatedLength` bytes.
    static func decode(compressed payload: [UInt8], maximumInflatedLength: Int) throws(ShoalError) -> WireMessage {
        var reader = ByteReader(payload)
        let length: UInt64
        do throws(ShoalError) {
            _ = try reader.readByte()
            let method = try reader.readByte()
            guard method == zlibMethod else { throw malformed("unknown compression method \(method)") }
            length = try reader.readVarint()
        } catch {
            guard error.code == .corruptMetadata else { throw error }
            throw malformed("a compressed frame cut inside its header")
        }
        guard length <= UInt64(maximumInflatedLength) else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "a compressed frame holds \(length) bytes, more than the maximum of \(maximumInflatedLength)"
            )
        }
        let inner = try Deflate.decompress(payload[reader.offset...], length: Int(length))
        guard inner.first == Kind.changeBatch.rawValue || inner.first == Kind.valuePiece.rawValue else {
            throw malformed("a compressed frame may hold only a change batch or a value piece")
        }
        return try decodePlain(inner)
    }
}
