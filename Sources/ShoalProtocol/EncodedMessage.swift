/// A message encoded for the wire ahead of sending, compressed when that paid (``WireMessage/packed(compressing:)``):
/// what its frame carries, and how many bytes the message's own encoding takes.
public struct EncodedMessage: Hashable, Sendable {
    /// The frame payload as it goes out: the message's encoding, or a compressed frame (type 13) holding it.
    public let payload: [UInt8]
    /// The length of the message's own encoding: `payload.count` when it was not compressed.
    public let uncompressedCount: Int

    /// A payload and the length of the encoding it stands for.
    public init(payload: [UInt8], uncompressedCount: Int) {
        self.payload = payload
        self.uncompressedCount = uncompressedCount
    }

    /// Whether the payload is a compressed frame.
    public var isCompressed: Bool { payload.first == WireMessage.Kind.compressed.rawValue }
}
