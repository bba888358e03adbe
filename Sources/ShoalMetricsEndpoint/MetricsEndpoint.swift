import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Prometheus
import ServiceLifecycle
import Synchronization

/// A small HTTP/1.1 server that answers `GET /metrics` with a registry's text (Prometheus exposition format), and
/// nothing else: 404 for other paths, 405 for other methods. It has no authentication: bind it to loopback, or to an
/// address only the scraper reaches (the metrics name peers by site id and tables by name).
///
/// SwiftNIO only (the node does not link Hummingbird): a plain channel handler per connection, which answers each
/// request from the registry as it arrives (no request body is read). A connection idle for 30 s is closed, and at
/// most 64 are open at once (the ones beyond are closed at once), so a client holding sockets cannot pile them up.
public struct MetricsEndpoint: Service {
    /// The address to listen on.
    public let host: String
    /// The port (0: any free one, reported to `onListening`).
    public let port: Int
    /// What `GET /metrics` serves.
    public let registry: PrometheusCollectorRegistry
    private let onListening: @Sendable (Int) async -> Void
    private let logger: Logger

    /// Open connections at most.
    static let maximumConnections = 64

    /// An endpoint on `host`:`port` serving `registry`; `onListening` gets the bound port.
    public init(
        host: String,
        port: Int,
        registry: PrometheusCollectorRegistry,
        logger: Logger,
        onListening: @escaping @Sendable (Int) async -> Void = { _ in }
    ) {
        self.host = host
        self.port = port
        self.registry = registry
        self.logger = logger
        self.onListening = onListening
    }

    /// Listens until a graceful shutdown or cancellation, then closes the listening socket.
    public func run() async throws {
        let registry = self.registry
        let connections = ConnectionCount()
        let server: any Channel
        do {
            server = try await bind(registry: registry, connections: connections)
        } catch {
            throw MetricsEndpointError(host: host, port: port, underlying: error)
        }
        let bound = server.localAddress?.port ?? port
        logger.info("metrics endpoint listening", metadata: ["address": "\(host):\(bound)"])
        await onListening(bound)
        // Returns at a graceful shutdown; throws when cancelled: either way the socket closes.
        try? await gracefulShutdown()
        try? await server.close()
    }

    private func bind(registry: PrometheusCollectorRegistry, connections: ConnectionCount) async throws -> any Channel {
        try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 64)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.configureHTTPServerPipeline(withErrorHandling: true)
                    try pipeline.addHandler(IdleStateHandler(readTimeout: .seconds(30)))
                    try pipeline.addHandler(MetricsRequestHandler(registry: registry, connections: connections))
                }
            }
            .bind(host: host, port: port)
            .get()
    }
}

/// The endpoint could not listen where it was told to.
public struct MetricsEndpointError: Error, CustomStringConvertible {
    /// The address it was given.
    public var host: String
    /// The port it was given.
    public var port: Int
    /// What the bind said.
    public var underlying: any Error

    /// What failed, for a person.
    public var description: String { "could not listen on \(host):\(port) for metrics: \(underlying)" }
}

/// How many connections the endpoint holds open.
final class ConnectionCount: Sendable {
    private let value = Atomic<Int>(0)

    /// Counts one more; returns the new count.
    func open() -> Int { value.add(1, ordering: .relaxed).newValue }

    /// Counts one fewer.
    func close() { value.subtract(1, ordering: .relaxed) }
}

/// Answers the requests of one connection.
final class MetricsRequestHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let registry: PrometheusCollectorRegistry
    private let connections: ConnectionCount
    private var request: HTTPRequestHead?
    private var counted = false

    init(registry: PrometheusCollectorRegistry, connections: ConnectionCount) {
        self.registry = registry
        self.connections = connections
    }

    func channelActive(context: ChannelHandlerContext) {
        counted = true
        if connections.open() > MetricsEndpoint.maximumConnections {
            context.close(promise: nil)
            return
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        if counted {
            counted = false
            connections.close()
        }
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            request = head
        case .body:
            break  // A GET has none; whatever comes is dropped as it arrives.
        case .end:
            guard let head = request else { return }
            request = nil
            respond(to: head, context: context)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        var headers = HTTPHeaders()
        let status: HTTPResponseStatus
        var body: ByteBuffer
        if path != "/metrics" {
            status = .notFound
            body = ByteBuffer(string: "not found: this endpoint serves GET /metrics only\n")
            headers.add(name: "content-type", value: "text/plain; charset=utf-8")
        } else if head.method != .GET && head.method != .HEAD {
            status = .methodNotAllowed
            body = ByteBuffer(string: "method not allowed: GET /metrics\n")
            headers.add(name: "allow", value: "GET, HEAD")
            headers.add(name: "content-type", value: "text/plain; charset=utf-8")
        } else {
            status = .ok
            body = ByteBuffer(bytes: registry.emitToBuffer())
            headers.add(name: "content-type", value: PrometheusMetrics.contentType)
        }
        let keepAlive = head.isKeepAlive
        headers.add(name: "content-length", value: "\(body.readableBytes)")
        headers.add(name: "connection", value: keepAlive ? "keep-alive" : "close")
        if head.method == .HEAD { body.clear() }
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))),
            promise: nil
        )
        if body.readableBytes > 0 { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        let written = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !keepAlive {
            let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
            written.whenComplete { _ in loopBound.value.close(promise: nil) }
        }
    }
}
