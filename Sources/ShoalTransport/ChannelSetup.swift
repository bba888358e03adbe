import NIOCore
import ShoalCore
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

    /// Who is at the other end of `channel`, once the setup verified it (TLS: once the handshake checked the
    /// peer's certificate); `nil` for a setup that authenticates no one (plain framing). Throws when the
    /// verification failed or did not finish in time: the node then closes the connection without a word.
    func authenticatedPeer(of channel: any Channel) async throws(ShoalError) -> PeerIdentity?
}

extension ChannelSetup {
    /// Authenticates no one.
    public func authenticatedPeer(of channel: any Channel) async throws(ShoalError) -> PeerIdentity? { nil }
}

/// A peer as the channel setup verified it, before any message.
public struct PeerIdentity: Sendable, Hashable {
    /// What the peer came for.
    public enum Purpose: Sendable, Hashable {
        /// A member syncing: it gets a hello, and rounds once the hello matches the roster.
        case sync
        /// A device joining with an invite code: it gets only the join exchange.
        case join
    }

    /// The hash of the peer's public key.
    public var nodeID: NodeID
    /// The peer's public key (DER SubjectPublicKeyInfo).
    public var publicKey: [UInt8]
    /// The name the peer gives itself (its certificate's common name).
    public var name: String
    /// What the peer came for.
    public var purpose: Purpose

    /// A verified peer.
    public init(nodeID: NodeID, publicKey: [UInt8], name: String, purpose: Purpose) {
        self.nodeID = nodeID
        self.publicKey = publicKey
        self.name = name
        self.purpose = purpose
    }
}

/// Decides, after a setup authenticated a peer, what it may do: the security layer's side of the node.
public protocol PeerAuthorizer: Sendable {
    /// Whether the peer that sent `hello` may sync; `nil` accepts, a rejection is sent and the connection closed.
    /// `identity` is what the channel setup verified (nil with a setup that authenticates no one).
    func authorize(_ hello: Hello, identity: PeerIdentity?) -> Rejection?

    /// Runs the join exchange with a device that came to join (``PeerIdentity/Purpose/join``), to its end; must
    /// close `channel` (through `executeThenClose`).
    func join(_ channel: NIOAsyncChannel<WireMessage, WireMessage>, identity: PeerIdentity, address: String) async
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
