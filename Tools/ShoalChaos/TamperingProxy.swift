import NIOCore
import NIOHTTP1
import NIOPosix
import Shoal

/// An HTTP/1.1 proxy between the nodes and one relay instance (plain http on 127.0.0.1): every request and answer
/// streams through as it comes (long-polls included), except the pull answers ``Tampering`` picks, which it holds
/// whole, alters, and sends on with their new length. Each connection from a node gets one connection to the relay.
struct TamperingProxy {
    /// The relay instance's port.
    let upstreamPort: Int
    let tampering: Tampering

    /// Binds on 127.0.0.1 (at `port`, 0 for any) and serves until cancelled; `ready` receives the port.
    func run(port: Int = 0, ready: @escaping @Sendable (Int) -> Void) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    return try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                        wrappingChannelSynchronously: channel
                    )
                }
            }
        ready(server.channel.localAddress!.port!)
        try await withThrowingDiscardingTaskGroup { group in
            try await server.executeThenClose { inbound in
                for try await client in inbound {
                    group.addTask { await forward(client) }
                }
            }
        }
    }

    private func forward(_ client: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async {
        let (port, tampering) = (upstreamPort, self.tampering)
        do {
            let upstream = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(2))
                .connect(host: "127.0.0.1", port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                            wrappingChannelSynchronously: channel
                        )
                    }
                }
            // The path of each request sent on, in order: answers come back in the same order.
            let (paths, pathsIn) = AsyncStream.makeStream(of: String.self)
            try await client.executeThenClose { clientIn, clientOut in
                try await upstream.executeThenClose { upstreamIn, upstreamOut in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask {
                            defer { pathsIn.finish() }
                            try await Self.requests(clientIn, to: upstreamOut, paths: pathsIn, tampering: tampering)
                        }
                        group.addTask {
                            try await Self.answers(upstreamIn, to: clientOut, paths: paths, tampering: tampering)
                        }
                        try await group.next()
                        group.cancelAll()
                    }
                }
            }
        } catch {
            try? await client.channel.close()
        }
    }

    /// Sends each request on as it comes; the bodies of uploads are also handed to ``Tampering`` (for chunks of
    /// another cluster).
    private static func requests(
        _ inbound: NIOAsyncChannelInboundStream<HTTPServerRequestPart>,
        to outbound: NIOAsyncChannelOutboundWriter<HTTPClientRequestPart>,
        paths: AsyncStream<String>.Continuation,
        tampering: Tampering
    ) async throws {
        var upload: [UInt8]?
        for try await part in inbound {
            switch part {
            case .head(let head):
                paths.yield(head.uri)
                upload = head.method == .POST && head.uri == RelayAPI.changeSetsPath ? [] : nil
                try await outbound.write(.head(head))
            case .body(let buffer):
                if upload != nil, upload!.count < 16 << 20 { upload! += buffer.readableBytesView }
                try await outbound.write(.body(.byteBuffer(buffer)))
            case .end(let trailers):
                try await outbound.write(.end(trailers))
                if let body = upload { await tampering.captureUpload(body) }
                upload = nil
            }
        }
    }

    /// Sends each answer on as it comes, but a pull answer picked for tampering, which is held whole and altered.
    private static func answers(
        _ inbound: NIOAsyncChannelInboundStream<HTTPClientResponsePart>,
        to outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>,
        paths: AsyncStream<String>,
        tampering: Tampering
    ) async throws {
        var pending = paths.makeAsyncIterator()
        var held: HTTPResponseHead?
        var copy: [UInt8]?
        for try await part in inbound {
            switch part {
            case .head(let head):
                // An informational answer (1xx) leaves its request waiting for the real one.
                if head.status.code < 200 {
                    try await outbound.write(.head(head))
                    continue
                }
                let path = await pending.next() ?? ""
                let isPull = path == RelayAPI.pullPath && head.status == .ok
                copy = isPull ? [] : nil
                if isPull, await tampering.shouldAlter() {
                    held = head
                } else {
                    try await outbound.write(.head(head))
                }
            case .body(let buffer):
                if copy != nil { copy! += buffer.readableBytesView }
                if held == nil { try await outbound.write(.body(.byteBuffer(buffer))) }
            case .end(let trailers):
                if var head = held, let body = copy {
                    let altered = await tampering.alter(body)
                    head.headers.remove(name: "transfer-encoding")
                    head.headers.replaceOrAdd(name: "content-length", value: "\(altered.count)")
                    try await outbound.write(.head(head))
                    try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: altered))))
                    try await outbound.write(.end(nil))
                } else {
                    try await outbound.write(.end(trailers))
                    if let body = copy { await tampering.capturePull(body) }
                }
                held = nil
                copy = nil
            }
        }
    }
}
