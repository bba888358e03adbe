import Synchronization

/// What a node sent of its changes to its peers since it started: the frames of change batches and value pieces,
/// the bytes they took on the links (after compression, inside TLS) and the bytes of the messages they held.
public struct ChangeTraffic: Sendable, Hashable {
    /// Frames of change batches and value pieces sent.
    public var frames: Int
    /// Of those, the frames sent compressed.
    public var compressedFrames: Int
    /// The bytes those frames took (their payloads, as sent: compressed or not).
    public var bytesSent: Int
    /// The bytes of the messages they held, before compression.
    public var uncompressedBytes: Int

    /// The share of the uncompressed bytes that went on the links (1 when nothing was compressed, 0 before anything
    /// was sent).
    public var ratio: Double { uncompressedBytes > 0 ? Double(bytesSent) / Double(uncompressedBytes) : 0 }
}

/// The node's running ``ChangeTraffic``, added to by every connection's driver: atomics, so that counting a frame
/// costs no hop to the node.
final class ChangeTrafficCounter: Sendable {
    private let frames = Atomic<Int>(0)
    private let compressedFrames = Atomic<Int>(0)
    private let bytesSent = Atomic<Int>(0)
    private let uncompressedBytes = Atomic<Int>(0)

    /// Counts one frame of `sent` bytes that held `uncompressed` bytes.
    func add(sent: Int, uncompressed: Int) {
        frames.add(1, ordering: .relaxed)
        if sent != uncompressed { compressedFrames.add(1, ordering: .relaxed) }
        bytesSent.add(sent, ordering: .relaxed)
        uncompressedBytes.add(uncompressed, ordering: .relaxed)
    }

    /// The counts so far.
    var current: ChangeTraffic {
        ChangeTraffic(
            frames: frames.load(ordering: .relaxed),
            compressedFrames: compressedFrames.load(ordering: .relaxed),
            bytesSent: bytesSent.load(ordering: .relaxed),
            uncompressedBytes: uncompressedBytes.load(ordering: .relaxed)
        )
    }
}
