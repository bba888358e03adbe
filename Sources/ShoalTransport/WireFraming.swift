import NIOCore
import ShoalProtocol
import ShoalCore

/// Splits the inbound byte stream into frames and decodes each frame's message.
///
/// A frame is a 4-byte big-endian payload length, then the payload. A length beyond `maximumFrameLength`
/// is refused as soon as the 4 bytes arrive, before any of the payload is buffered; the first frame of a
/// connection (the hello) is held to `maximumFirstFrameLength`, so a stranger cannot make the node buffer a
/// full-size frame. A compressed frame (protocol version 6) is held to the same limit once inflated. The reader index
/// only moves once a whole frame is there.
public struct WireMessageDecoder: ByteToMessageDecoder {
    /// Whole messages go on down the pipeline.
    public typealias InboundOut = WireMessage

    /// The largest frame accepted, in bytes (the 4-byte length not counted).
    public let maximumFrameLength: Int
    /// The largest first frame accepted, in bytes: the peer's hello or its refusal.
    public let maximumFirstFrameLength: Int
    /// Whether the first frame was decoded (later ones may be up to ``maximumFrameLength``).
    private var firstFrameDecoded = false

    /// A decoder refusing frames longer than `maximumFrameLength` bytes (16 MiB by default), and a first frame
    /// longer than `maximumFirstFrameLength` (64 KiB by default).
    public init(
        maximumFrameLength: Int = WireProtocol.defaultMaximumFrameLength,
        maximumFirstFrameLength: Int = WireProtocol.maximumHelloFrameLength
    ) {
        self.maximumFrameLength = maximumFrameLength
        self.maximumFirstFrameLength = min(maximumFirstFrameLength, maximumFrameLength)
    }

    /// Passes on the next whole message, if all of it is there; throws ``ShoalError`` on a frame too large,
    /// empty or malformed.
    public mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let limit = firstFrameDecoded ? maximumFrameLength : maximumFirstFrameLength
        // (Only once a length's 4 bytes are there, as for any frame: then such a length is over every limit anyway.)
        if !firstFrameDecoded, buffer.readableBytes >= 4, Self.looksLikeTLS(buffer) {
            // A TLS record would be read as a huge frame length: this node speaks plaintext, the peer TLS.
            throw ShoalError(
                code: .frameTooLarge,
                message: "the peer speaks TLS and this node does not (it runs with --insecure-plaintext): "
                    + "run both with TLS (the default) or both with --insecure-plaintext"
            )
        }
        guard let message = try Self.nextMessage(from: &buffer, maximumFrameLength: limit) else {
            return .needMoreData
        }
        firstFrameDecoded = true
        context.fireChannelRead(Self.wrapInboundOut(message))
        return .continue
    }

    /// Passes on what whole messages are left; bytes of an unfinished frame at the end of the stream are a
    /// malformed message.
    public mutating func decodeLast(
        context: ChannelHandlerContext,
        buffer: inout ByteBuffer,
        seenEOF: Bool
    ) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        if seenEOF && buffer.readableBytes > 0 {
            throw ShoalError(
                code: .malformedMessage,
                message: "the connection closed in the middle of a frame (\(buffer.readableBytes) bytes left over)"
            )
        }
        return .needMoreData
    }

    /// Whether the bytes start like a TLS record (handshake, alert, change cipher spec or data; version 3.x).
    static func looksLikeTLS(_ buffer: ByteBuffer) -> Bool {
        guard let type = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self),
            let major = buffer.getInteger(at: buffer.readerIndex + 1, as: UInt8.self)
        else { return false }
        return (0x14...0x17).contains(type) && major == 0x03
    }

    /// The next whole message in `buffer`, or `nil` when more bytes are needed (the buffer is then untouched).
    public static func nextMessage(
        from buffer: inout ByteBuffer,
        maximumFrameLength: Int
    ) throws(ShoalError) -> WireMessage? {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else { return nil }
        guard length <= maximumFrameLength else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "a frame of \(length) bytes exceeds the maximum of \(maximumFrameLength)"
            )
        }
        guard length > 0 else {
            throw ShoalError(code: .malformedMessage, message: "malformed message: an empty frame")
        }
        guard buffer.readableBytes >= 4 + Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: 4)
        let payload = buffer.readBytes(length: Int(length))!
        // A compressed frame holds at most a frame's worth: the same limit, whatever the compression.
        let message = try WireMessage.decode(payload, maximumInflatedLength: maximumFrameLength)
        guard case .changeBatch(var batch) = message else { return message }
        batch.frameBytes = 4 + Int(length)
        return .changeBatch(batch)
    }
}

/// Encodes outbound messages as frames.
public struct WireMessageEncoder: MessageToByteEncoder {
    /// The encoder takes whole messages.
    public typealias OutboundIn = WireMessage

    /// The largest frame sent, in bytes (the 4-byte length not counted).
    public let maximumFrameLength: Int

    /// An encoder refusing messages longer than `maximumFrameLength` bytes (16 MiB by default).
    public init(maximumFrameLength: Int = WireProtocol.defaultMaximumFrameLength) {
        self.maximumFrameLength = maximumFrameLength
    }

    /// Writes `data` as one frame; throws ``ShoalError`` (`.frameTooLarge`) rather than send a larger one.
    public func encode(data: WireMessage, out: inout ByteBuffer) throws {
        try Self.write(data, to: &out, maximumFrameLength: maximumFrameLength)
    }

    /// Appends one frame to `buffer`; a message larger than the maximum is refused, not sent.
    public static func write(
        _ message: WireMessage,
        to buffer: inout ByteBuffer,
        maximumFrameLength: Int
    ) throws(ShoalError) {
        let payload = message.encoded()
        guard payload.count <= maximumFrameLength else {
            throw ShoalError(
                code: .frameTooLarge,
                message: "a \(payload.count)-byte message exceeds the maximum frame of \(maximumFrameLength) bytes"
            )
        }
        buffer.writeInteger(UInt32(payload.count))
        buffer.writeBytes(payload)
    }
}
