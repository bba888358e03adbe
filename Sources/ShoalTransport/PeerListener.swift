import NIOCore
import NIOPosix
import ShoalProtocol

/// The node's listening socket: binds, then hands every accepted connection, set up by the node's
/// ``ChannelSetup``, to a handler of its own, each in a child task, until closed.
///
/// Accepted channels reach the handlers through a stream of the listener's own rather than NIO's async server
/// channel: a child NIO sets up while the server channel closes would otherwise be dropped without being closed,
/// and NIO traps on a message channel that is never closed ("Deinited NIOAsyncWriter without calling finish()").
/// Here a child that becomes active after ``close()`` is closed at once, and one already queued is still handed
/// out.
struct PeerListener: Sendable {
    private let server: any Channel
    private let accepted: AsyncStream<NIOAsyncChannel<WireMessage, WireMessage>>
    private let intake: AsyncStream<NIOAsyncChannel<WireMessage, WireMessage>>.Continuation

    /// Binds `host:port` (port 0 picks a free one).
    static func bind(
        host: String,
        port: Int,
        group: any EventLoopGroup,
        setup: any ChannelSetup
    ) async throws -> PeerListener {
        let (accepted, intake) = AsyncStream.makeStream(of: NIOAsyncChannel<WireMessage, WireMessage>.self)
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 256)
            .childChannelInitializer { channel in
                setup.configure(channel, role: .server).flatMapThrowing { child in
                    // Handed out once active, as NIO's own async server does: a write before that is lost.
                    try channel.pipeline.syncOperations.addHandler(HandOver(child, to: intake), position: .first)
                }
            }
            .bind(host: host, port: port)
            .get()
        // Once the socket is closed, no handler will take what comes after: those children are closed at once.
        server.closeFuture.whenComplete { _ in intake.finish() }
        return PeerListener(server: server, accepted: accepted, intake: intake)
    }

    /// The port it listens on.
    var port: Int? { server.localAddress?.port }

    /// Accepts connections until ``close()``, running `handle` for each (with the remote `ip:port`); returns once
    /// every handler has returned. Each handler must run its channel through `executeThenClose`.
    func run(_ handle: @escaping @Sendable (NIOAsyncChannel<WireMessage, WireMessage>, String) async -> Void) async {
        await withDiscardingTaskGroup { connections in
            for await child in accepted {
                let address =
                    child.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "unknown"
                connections.addTask { await handle(child, address) }
            }
        }
    }

    /// Stops accepting: ``run(_:)`` hands out what was already accepted, waits for its handlers, and returns.
    func close() {
        server.close(promise: nil)
        intake.finish()
    }

    /// Closes a channel no handler will take (NIO requires every message channel to be closed this way).
    fileprivate static func discard(_ child: NIOAsyncChannel<WireMessage, WireMessage>) {
        Task { try? await child.executeThenClose { _, _ in } }
    }
}

/// Hands an accepted connection to the listener's stream when it becomes active. A connection that closes before
/// that is never handed out: NIO finishes its writer itself then.
private final class HandOver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer

    private var child: NIOAsyncChannel<WireMessage, WireMessage>?
    private let intake: AsyncStream<NIOAsyncChannel<WireMessage, WireMessage>>.Continuation

    init(
        _ child: NIOAsyncChannel<WireMessage, WireMessage>,
        to intake: AsyncStream<NIOAsyncChannel<WireMessage, WireMessage>>.Continuation
    ) {
        self.child = child
        self.intake = intake
    }

    func channelActive(context: ChannelHandlerContext) {
        // The handlers after this one (the message channel's own) see the connection active first.
        context.fireChannelActive()
        guard let child else { return }
        self.child = nil
        if case .terminated = intake.yield(child) { PeerListener.discard(child) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        child = nil
    }
}
