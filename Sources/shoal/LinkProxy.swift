import NIOCore
import NIOPosix
import Synchronization

/// A TCP link between two demo nodes that the dashboard can cut: one node dials the proxy instead of the other node,
/// and the proxy forwards the bytes both ways (TLS and all, untouched) to wherever the other node listens now. Cut, it
/// closes the connections it carries and closes each new one at once, as a network partition would; mended, it
/// forwards again and the nodes reconnect by themselves.
final class LinkProxy: Sendable {
    /// The port the dialling node is given (`--peer 127.0.0.1:PORT`).
    let port: Int
    private let server: any Channel
    private let shared: Shared

    private init(port: Int, server: any Channel, shared: Shared) {
        self.port = port
        self.server = server
        self.shared = shared
    }

    /// A proxy on a free loopback port forwarding to `127.0.0.1:target`.
    static func start(target: Int) async throws -> LinkProxy {
        let shared = Shared(target: target)
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { inbound in
                guard let target = shared.admit() else {
                    return inbound.eventLoop.makeFailedFuture(LinkCut())
                }
                // What the dialling node sends before the other node answers the connect is held, then passed on.
                let forward = Forward(shared: shared)
                do {
                    try inbound.pipeline.syncOperations.addHandler(forward)
                } catch {
                    return inbound.eventLoop.makeFailedFuture(error)
                }
                let bound = NIOLoopBound(forward, eventLoop: inbound.eventLoop)
                ClientBootstrap(group: inbound.eventLoop)
                    .channelInitializer { outbound in
                        outbound.eventLoop.makeCompletedFuture {
                            let back = Forward(shared: shared)
                            try outbound.pipeline.syncOperations.addHandler(back)
                            back.attach(inbound)
                        }
                    }
                    .connect(host: "127.0.0.1", port: target)
                    .whenComplete { result in
                        switch result {
                        case .success(let outbound):
                            guard shared.track(inbound), shared.track(outbound) else {
                                outbound.close(promise: nil)
                                inbound.close(promise: nil)
                                return
                            }
                            bound.value.attach(outbound)
                        case .failure:
                            inbound.close(promise: nil)
                        }
                    }
                return inbound.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        return LinkProxy(port: server.localAddress?.port ?? 0, server: server, shared: shared)
    }

    /// Where it forwards to (a node started again listens on another port).
    func retarget(_ target: Int) { shared.retarget(target) }

    /// Whether it is cut.
    var isCut: Bool { shared.isCut }

    /// Bytes forwarded so far, both ways.
    var bytes: UInt64 { shared.bytes.load(ordering: .relaxed) }

    /// Cuts the link: closes what it carries, and each new connection at once.
    func cut() { shared.cut(true) }

    /// Mends the link.
    func mend() { shared.cut(false) }

    /// Stops listening and closes everything.
    func close() {
        shared.cut(true)
        server.close(promise: nil)
    }

    /// What the proxy's connections share, behind a lock.
    final class Shared: Sendable {
        private struct State {
            var target: Int
            var cut = false
            var open: [ObjectIdentifier: any Channel] = [:]
        }

        private let state: Mutex<State>
        let bytes = Atomic<UInt64>(0)

        init(target: Int) { state = Mutex(State(target: target)) }

        var isCut: Bool { state.withLock { $0.cut } }

        /// The target to dial, unless the link is cut.
        func admit() -> Int? { state.withLock { $0.cut ? nil : $0.target } }

        func retarget(_ target: Int) { state.withLock { $0.target = target } }

        /// Tracks an open connection until it closes; false when the link was cut meanwhile.
        func track(_ channel: any Channel) -> Bool {
            let key = ObjectIdentifier(channel)
            let admitted = state.withLock { state in
                guard !state.cut else { return false }
                state.open[key] = channel
                return true
            }
            guard admitted else { return false }
            channel.closeFuture.whenComplete { _ in _ = self.state.withLock { $0.open.removeValue(forKey: key) } }
            return true
        }

        func cut(_ cut: Bool) {
            let closing = state.withLock { state in
                state.cut = cut
                return cut ? Array(state.open.values) : []
            }
            for channel in closing { channel.close(promise: nil) }
        }
    }
}

/// The link was cut.
struct LinkCut: Error {}

/// Forwards what one side of a proxied connection reads to the other side (holding it until that side is connected),
/// and closes both when either closes.
final class Forward: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private var partner: (any Channel)?
    private var held: [ByteBuffer] = []
    private var closed = false
    private let shared: LinkProxy.Shared

    init(shared: LinkProxy.Shared) {
        self.shared = shared
    }

    /// The other side is connected: what was held goes to it, then everything read.
    func attach(_ partner: any Channel) {
        guard !closed else {
            partner.close(promise: nil)
            return
        }
        self.partner = partner
        for buffer in held { partner.write(buffer, promise: nil) }
        if !held.isEmpty { partner.flush() }
        held.removeAll()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        shared.bytes.add(UInt64(buffer.readableBytes), ordering: .relaxed)
        if let partner {
            partner.writeAndFlush(buffer, promise: nil)
        } else {
            held.append(buffer)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        closed = true
        partner?.close(promise: nil)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
