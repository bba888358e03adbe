import NIOCore
import NIOPosix
import ShoalProtocol

/// The node's listening socket: binds, then hands every accepted connection, set up by the node's
/// ``ChannelSetup``, to a handler of its own, each in a child task, until closed.
struct PeerListener: Sendable {
    private let server: NIOAsyncChannel<NIOAsyncChannel<WireMessage, WireMessage>, Never>

    /// Binds `host:port` (port 0 picks a free one).
    static func bind(
        host: String,
        port: Int,
        group: any EventLoopGroup,
        setup: any ChannelSetup
    ) async throws -> PeerListener {
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 256)
            .bind(host: host, port: port) { channel in
                setup.configure(channel, role: .server)
            }
        return PeerListener(server: server)
    }

    /// The port it listens on.
    var port: Int? { server.channel.localAddress?.port }

    /// Accepts connections until ``close()``, running `handle` for each (with the remote `ip:port`); returns once
    /// every handler has returned. Each handler must run its channel through `executeThenClose`.
    func run(
        _ handle: @escaping @Sendable (NIOAsyncChannel<WireMessage, WireMessage>, String) async -> Void
    ) async throws {
        try await server.executeThenClose { inbound in
            try await withThrowingDiscardingTaskGroup { connections in
                for try await child in inbound {
                    let address =
                        child.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "unknown"
                    connections.addTask { await handle(child, address) }
                }
            }
        }
    }

    /// Stops accepting: ``run(_:)`` drains what was already accepted and returns.
    func close() {
        server.channel.close(promise: nil)
    }
}
