import NIOCore
import ShoalCore
import ShoalProtocol

/// A two-way stream of wire messages between this node and one peer: what a ``ConnectionDriver`` runs a
/// session over, whatever carries it (a NIO channel with framing, TLS around it, an in-memory pair in tests).
protocol MessageStream: Sendable {
    /// The messages the peer sends, in order; it ends when the peer closes, and throws when what arrives cannot be
    /// decoded.
    associatedtype Inbound: AsyncSequence<WireMessage, any Error> & Sendable

    /// The messages the peer sends.
    var inbound: Inbound { get }

    /// Sends one message; returns once the stream accepted it (a peer that stops reading makes it wait).
    func write(_ message: WireMessage) async throws

    /// Closes the sending side once what was written is sent.
    func finish()

    /// Closes the connection at once, in both directions (a write waiting on a stalled peer then fails).
    func close()
}

/// A NIO channel carrying frames, inside `NIOAsyncChannel.executeThenClose`.
struct ChannelMessageStream: MessageStream {
    let inbound: NIOAsyncChannelInboundStream<WireMessage>
    let outbound: NIOAsyncChannelOutboundWriter<WireMessage>
    let channel: any Channel

    func write(_ message: WireMessage) async throws {
        try await outbound.write(message)
    }

    func finish() {
        outbound.finish()
    }

    func close() {
        channel.close(promise: nil)
    }
}

/// One end of a pair of message streams joined in memory: what one end writes, the other reads.
///
/// For running two ``ConnectionDriver``s against each other without sockets (the same driver the node runs over
/// TCP). Buffers are unbounded: no backpressure, which tests of the protocol logic do not need.
struct InMemoryMessageStream: MessageStream {
    let inbound: AsyncThrowingStream<WireMessage, any Error>
    private let peer: AsyncThrowingStream<WireMessage, any Error>.Continuation
    private let own: AsyncThrowingStream<WireMessage, any Error>.Continuation

    /// Two streams joined end to end.
    static func pair() -> (InMemoryMessageStream, InMemoryMessageStream) {
        let (a, toA) = AsyncThrowingStream.makeStream(of: WireMessage.self)
        let (b, toB) = AsyncThrowingStream.makeStream(of: WireMessage.self)
        return (
            InMemoryMessageStream(inbound: a, peer: toB, own: toA),
            InMemoryMessageStream(inbound: b, peer: toA, own: toB)
        )
    }

    func write(_ message: WireMessage) async throws {
        if case .terminated = peer.yield(message) {
            throw ShoalError(code: .network, message: "the in-memory peer closed the connection")
        }
    }

    func finish() {
        peer.finish()
    }

    func close() {
        peer.finish()
        own.finish()
    }

    /// Ends what this side reads with `error`, as a stream that could not be decoded would.
    func failInbound(_ error: ShoalError) {
        own.finish(throwing: error)
    }
}
