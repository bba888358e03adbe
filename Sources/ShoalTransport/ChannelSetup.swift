import NIOCore
import ShoalProtocol

/// Which end of a connection a channel is: some setups (TLS) differ between the two.
public enum ChannelRole: Sendable, Hashable {
    /// The node accepted the connection.
    case server
    /// The node dialled it.
    case client
}

/// How a new connection's pipeline is built, so that it carries whole ``WireMessage``s.
///
/// A value the node is given (``NodeConfiguration/channelSetup``), used for accepted and dialled connections
/// alike. Plain framing (``FramingChannelSetup``) is the innermost setup; others wrap it, adding their handlers
/// before its own (TLS next), so that a new capability is a new setup rather than a change to the node.
public protocol ChannelSetup: Sendable {
    /// Adds the handlers this setup needs to `channel`'s pipeline, then wraps it as a message channel. Runs on the
    /// channel's event loop.
    func configure(
        _ channel: any Channel,
        role: ChannelRole
    ) -> EventLoopFuture<NIOAsyncChannel<WireMessage, WireMessage>>
}

/// Length-prefixed frames (``WireMessageDecoder``/``WireMessageEncoder``) with an enforced maximum: the
/// innermost setup of every connection.
public struct FramingChannelSetup: ChannelSetup {
    /// The largest frame sent or accepted.
    public var maximumFrameLength: Int

    /// Framing with `maximumFrameLength`.
    public init(maximumFrameLength: Int = WireProtocol.defaultMaximumFrameLength) {
        self.maximumFrameLength = maximumFrameLength
    }

    /// Adds the frame decoder and encoder, and wraps the channel.
    public func configure(
        _ channel: any Channel,
        role: ChannelRole
    ) -> EventLoopFuture<NIOAsyncChannel<WireMessage, WireMessage>> {
        channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(
                ByteToMessageHandler(WireMessageDecoder(maximumFrameLength: maximumFrameLength))
            )
            try channel.pipeline.syncOperations.addHandler(
                MessageToByteHandler(WireMessageEncoder(maximumFrameLength: maximumFrameLength))
            )
            return try NIOAsyncChannel<WireMessage, WireMessage>(wrappingChannelSynchronously: channel)
        }
    }
}
