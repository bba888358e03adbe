import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Synchronization

/// The dashboard's HTTP/1.1 server: `GET /` the page (one self-contained file), `GET /events` the live states as
/// Server-Sent Events (`text/event-stream`, resumed with `Last-Event-ID`), `GET /state` the latest state as JSON, and
/// `POST /control` the demo's controls (a JSON ``DashboardControl``).
///
/// SwiftNIO only, as the metrics endpoint: a `NIOAsyncChannel` per connection in a discarding task group, each
/// connection's errors caught in its own task. It listens on loopback unless given a token or a secure channel (say
/// TLS that admits only the cluster's members, which the caller adds through `secureChannel`: this module knows no
/// TLS); with a token, every request must carry it (`?token=` in the URL, which the page passes on, or
/// `Authorization: Bearer`). A control must
/// be sent as `application/json` from the page's own origin, so another site open in the same browser cannot post one.
/// At most 64 connections are open at once; one whose request is not complete 10 s after it connected or after its
/// last response (a stalled TLS handshake, a client that sends nothing, or a head or body a byte at a time) is closed,
/// and so is one idle for 60 s (no request, no event), so clients that hang cannot hold the connections for long.
/// Without a token or TLS, only requests addressed to a loopback name (`Host`) are answered (DNS rebinding).
public struct DashboardServer: Service {
    /// The address to listen on.
    public let host: String
    /// The port (0: any free one, reported to `onListening`).
    public let port: Int
    /// Where the states come from.
    public let hub: DashboardHub
    /// What every request must carry, if set (required to listen beyond loopback).
    public let token: String?
    /// Adds the handlers that secure each new connection (TLS first in its pipeline), if set: the server then speaks
    /// HTTPS and may listen beyond loopback without a token.
    public let secureChannel: (@Sendable (any Channel) throws -> Void)?
    private let controls: (@Sendable (DashboardControl) async throws -> String)?
    private let onListening: @Sendable (Int) async -> Void
    private let logger: Logger
    /// How long a connection has to complete a request, from when it was set up (TLS handshake included) or its last
    /// response ended.
    public let requestDeadline: TimeAmount

    /// Open connections at most.
    static let maximumConnections = 64
    /// Bytes of a control's body at most.
    static let maximumBodyBytes = 16 * 1024

    /// A server on `host`:`port` showing `hub`'s states; `controls` carries out the page's controls (none when nil);
    /// `secureChannel` secures each connection (see ``secureChannel``); `requestDeadline` is how long a connection has
    /// to complete a request; `onListening` gets the bound port.
    public init(
        host: String,
        port: Int,
        hub: DashboardHub,
        token: String? = nil,
        secureChannel: (@Sendable (any Channel) throws -> Void)? = nil,
        logger: Logger,
        requestDeadline: TimeAmount = .seconds(10),
        controls: (@Sendable (DashboardControl) async throws -> String)? = nil,
        onListening: @escaping @Sendable (Int) async -> Void = { _ in }
    ) {
        self.requestDeadline = requestDeadline
        self.host = host
        self.port = port
        self.hub = hub
        self.token = token.flatMap { $0.isEmpty ? nil : $0 }
        self.secureChannel = secureChannel
        self.logger = logger
        self.controls = controls
        self.onListening = onListening
    }

    /// The page's address for a person: `http://HOST:PORT/` (`https` when `secure`), with `?token=…` when there is
    /// one.
    public static func url(host: String, port: Int, token: String?, secure: Bool = false) -> String {
        var unreserved = CharacterSet.alphanumerics
        unreserved.insert(charactersIn: "-._~")
        let query = token.map { "?token=\($0.addingPercentEncoding(withAllowedCharacters: unreserved) ?? $0)" } ?? ""
        let shown = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        return "\(secure ? "https" : "http")://\(shown):\(port)/\(query)"
    }

    /// Whether `host` names a loopback address, where the dashboard may listen without a token: `localhost`, or an
    /// address in 127.0.0.0/8 or `::1` written as one (a name that merely starts with "127." is not one: it may
    /// resolve anywhere).
    public static func isLoopback(_ host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if bare == "localhost" { return true }
        switch try? SocketAddress(ipAddress: bare, port: 0) {
        case .v4(let address): return UInt32(bigEndian: address.address.sin_addr.s_addr) >> 24 == 127
        case .v6(let address):
            // ::1: fifteen zero bytes, then 1.
            return withUnsafeBytes(of: address.address.sin6_addr) { $0.elementsEqual([UInt8](repeating: 0, count: 15) + [1]) }
        default: return false
        }
    }

    /// The host part of a `Host` header (`name`, `name:port`, `[v6]`, `[v6]:port`).
    static func hostName(ofHeader value: String) -> String {
        let value = value.trimmingCharacters(in: .whitespaces)
        if value.hasPrefix("["), let end = value.firstIndex(of: "]") {
            return String(value[value.startIndex...end])
        }
        return value.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
    }

    /// Listens until a graceful shutdown or cancellation, then closes every connection.
    public func run() async throws {
        guard token != nil || secureChannel != nil || Self.isLoopback(host) else {
            throw DashboardServerError(
                host: host,
                port: port,
                reason: "the dashboard listens beyond loopback only with a token (--dashboard-token) or TLS (--dashboard-tls)"
            )
        }
        let secureChannel = self.secureChannel
        let requestDeadline = self.requestDeadline
        typealias Connection = NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>
        let server: NIOAsyncChannel<Connection, Never>
        do {
            server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .serverChannelOption(.backlog, value: 64)
                .bind(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let pipeline = channel.pipeline.syncOperations
                        try secureChannel?(channel)
                        try pipeline.configureHTTPServerPipeline(withErrorHandling: true)
                        try pipeline.addHandler(RequestDeadline(deadline: requestDeadline))
                        try pipeline.addHandler(IdleStateHandler(allTimeout: .seconds(60)))
                        try pipeline.addHandler(CloseWhenIdle())
                        return try Connection(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            throw DashboardServerError(host: host, port: port, reason: "\(error)")
        }
        let bound = server.channel.localAddress?.port ?? port
        logger.debug("dashboard listening", metadata: ["address": "\(host):\(bound)"])
        await onListening(bound)
        let open = OpenConnections()
        try? await cancelWhenGracefulShutdown {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await connection in inbound {
                        guard open.open() <= Self.maximumConnections else {
                            open.close()
                            try? await connection.channel.close()
                            continue
                        }
                        group.addTask {
                            defer { open.close() }
                            await self.serve(connection)
                        }
                    }
                }
            }
        }
    }

    /// Answers one connection's requests until it closes; its errors end it alone.
    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async {
        do {
            try await connection.executeThenClose { inbound, outbound in
                var head: HTTPRequestHead?
                var body = ByteBuffer()
                for try await part in inbound {
                    switch part {
                    case .head(let received):
                        head = received
                        body.clear()
                    case .body(var chunk):
                        guard body.readableBytes + chunk.readableBytes <= Self.maximumBodyBytes else {
                            try await respond(
                                outbound,
                                version: head?.version,
                                status: .payloadTooLarge,
                                "too large\n",
                                keepAlive: false
                            )
                            return
                        }
                        body.writeBuffer(&chunk)
                    case .end:
                        guard let request = head else { return }
                        head = nil
                        let keepAlive = try await answer(request, body: body, outbound)
                        if !keepAlive { return }
                    }
                }
            }
        } catch {
            logger.debug("dashboard connection ended", metadata: ["error": "\(error)"])
        }
    }

    /// Answers one request; returns whether the connection stays open for another.
    private func answer(
        _ head: HTTPRequestHead,
        body: ByteBuffer,
        _ outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>
    ) async throws -> Bool {
        let parts = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(parts.first ?? "")
        let query = parts.count > 1 ? String(parts[1]) : ""
        let keepAlive = head.isKeepAlive
        // Without a token or TLS, only a request addressed to a loopback name is answered: a page of another site
        // whose name was made to resolve to 127.0.0.1 (DNS rebinding) is same-origin to the browser, but it names
        // its own host.
        if token == nil, secureChannel == nil,
            !Self.isLoopback(Self.hostName(ofHeader: head.headers.first(name: "host") ?? ""))
        {
            try await respond(
                outbound,
                version: head.version,
                status: .misdirectedRequest,
                "this dashboard answers requests to a loopback address (127.0.0.1, localhost, [::1]) only\n",
                keepAlive: false
            )
            return false
        }
        guard authorized(head, query: query) else {
            try await respond(
                outbound,
                version: head.version,
                status: .unauthorized,
                "this dashboard needs its token: open the URL with ?token=…\n",
                keepAlive: keepAlive
            )
            return keepAlive
        }
        switch (head.method, path) {
        case (.GET, "/"), (.GET, "/index.html"):
            try await respond(
                outbound,
                version: head.version,
                status: .ok,
                DashboardPage.html,
                contentType: "text/html; charset=utf-8",
                keepAlive: keepAlive,
                extra: [
                    (
                        "content-security-policy",
                        "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:"
                    )
                ]
            )
        case (.GET, "/events"):
            try await stream(head, outbound)
            return false
        case (.GET, "/state"):
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            let data = (try? hub.latest.map { try encoder.encode($0) }) ?? nil
            try await respond(
                outbound,
                version: head.version,
                status: data == nil ? .serviceUnavailable : .ok,
                data.map { String(decoding: $0, as: UTF8.self) } ?? "no state yet\n",
                contentType: data == nil ? "text/plain; charset=utf-8" : "application/json",
                keepAlive: keepAlive
            )
        case (.POST, "/control"):
            let (status, text) = await control(head, body: body)
            try await respond(
                outbound,
                version: head.version,
                status: status,
                text,
                contentType: "application/json",
                keepAlive: keepAlive
            )
        case (.GET, "/favicon.ico"):
            try await respond(outbound, version: head.version, status: .noContent, "", keepAlive: keepAlive)
        case (_, "/"), (_, "/events"), (_, "/state"), (_, "/control"):
            try await respond(
                outbound,
                version: head.version,
                status: .methodNotAllowed,
                "method not allowed\n",
                keepAlive: keepAlive
            )
        default:
            try await respond(outbound, version: head.version, status: .notFound, "not found\n", keepAlive: keepAlive)
        }
        return keepAlive
    }

    private func authorized(_ head: HTTPRequestHead, query: String) -> Bool {
        guard let token else { return true }
        let given =
            head.headers.first(name: "authorization").flatMap { value in
                value.hasPrefix("Bearer ") ? String(value.dropFirst(7)) : nil
            }
            ?? query.split(separator: "&").lazy.compactMap { pair -> String? in
                let field = pair.split(separator: "=", maxSplits: 1)
                guard field.count == 2, field[0] == "token" else { return nil }
                return String(field[1]).removingPercentEncoding
            }.first
        guard let given else { return false }
        // Compared in time independent of where they differ.
        let a = Array(given.utf8)
        let b = Array(token.utf8)
        guard a.count == b.count else { return false }
        return zip(a, b).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }

    /// Carries out a control; the status and a JSON body for the page.
    private func control(_ head: HTTPRequestHead, body: ByteBuffer) async -> (HTTPResponseStatus, String) {
        func reply(_ ok: Bool, _ message: String) -> String {
            let object: [String: Any] = ["ok": ok, "message": message]
            let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
            return String(decoding: data, as: UTF8.self)
        }
        guard let controls else { return (.notFound, reply(false, "this dashboard has no controls")) }
        guard head.headers.first(name: "content-type")?.hasPrefix("application/json") == true else {
            return (.unsupportedMediaType, reply(false, "a control is a JSON body (content-type: application/json)"))
        }
        if let origin = head.headers.first(name: "origin"), let host = head.headers.first(name: "host"),
            origin != "\(secureChannel == nil ? "http" : "https")://\(host)"
        {
            return (.forbidden, reply(false, "controls are taken from the dashboard's own page only"))
        }
        guard let control = try? JSONDecoder().decode(DashboardControl.self, from: Data(body.readableBytesView)) else {
            return (.badRequest, reply(false, "not a control: {\"action\": …, \"node\": N, \"peer\": M}"))
        }
        do {
            return (.ok, reply(true, try await controls(control)))
        } catch let error as DashboardControlError {
            return (.conflict, reply(false, error.message))
        } catch {
            return (.internalServerError, reply(false, "\(error)"))
        }
    }

    /// Streams the hub's states as Server-Sent Events until the browser goes away or the server stops; a comment
    /// every 15 s keeps proxies from closing a quiet stream and notices a browser that left.
    private func stream(
        _ head: HTTPRequestHead,
        _ outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>
    ) async throws {
        let lastEventID = head.headers.first(name: "last-event-id").flatMap {
            UInt64($0.trimmingCharacters(in: .whitespaces))
        }
        var headers = HTTPHeaders()
        headers.add(name: "content-type", value: "text/event-stream; charset=utf-8")
        headers.add(name: "cache-control", value: "no-cache")
        headers.add(name: "connection", value: "close")
        try await outbound.write(.head(HTTPResponseHead(version: head.version, status: .ok, headers: headers)))
        try await outbound.write(.body(.byteBuffer(ByteBuffer(string: "retry: 1000\n\n"))))
        let events = hub.subscribe(after: lastEventID)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in events {
                    try await outbound.write(.body(.byteBuffer(ByteBuffer(string: event.wire))))
                }
            }
            group.addTask {
                while true {
                    try await Task.sleep(for: .seconds(15))  // a real deadline: the keep-alive comment's period
                    try await outbound.write(.body(.byteBuffer(ByteBuffer(string: ": keep-alive\n\n"))))
                }
            }
            // The first to end (the browser left, the server stops) ends both.
            try await group.next()
            group.cancelAll()
        }
    }

    private func respond(
        _ outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>,
        version: HTTPVersion?,
        status: HTTPResponseStatus,
        _ text: String,
        contentType: String = "text/plain; charset=utf-8",
        keepAlive: Bool,
        extra: [(String, String)] = []
    ) async throws {
        var headers = HTTPHeaders()
        let body = ByteBuffer(string: text)
        headers.add(name: "content-type", value: contentType)
        headers.add(name: "content-length", value: "\(body.readableBytes)")
        headers.add(name: "cache-control", value: "no-store")
        headers.add(name: "x-content-type-options", value: "nosniff")
        headers.add(name: "connection", value: keepAlive ? "keep-alive" : "close")
        for (name, value) in extra { headers.add(name: name, value: value) }
        try await outbound.write(
            .head(HTTPResponseHead(version: version ?? .http1_1, status: status, headers: headers))
        )
        if body.readableBytes > 0 { try await outbound.write(.body(.byteBuffer(body))) }
        try await outbound.write(.end(nil))
    }
}

/// The dashboard could not listen where it was told to.
public struct DashboardServerError: Error, CustomStringConvertible {
    /// The address it was given.
    public var host: String
    /// The port it was given.
    public var port: Int
    /// Why not.
    public var reason: String

    /// What failed, for a person.
    public var description: String { "could not serve the dashboard on \(host):\(port): \(reason)" }
}

/// How many connections the server holds open.
final class OpenConnections: Sendable {
    private let value = Atomic<Int>(0)

    /// Counts one more; returns the new count.
    func open() -> Int { value.add(1, ordering: .relaxed).newValue }

    /// Counts one fewer.
    func close() { value.subtract(1, ordering: .relaxed) }
}

/// Closes a connection that was idle (no request read, no event written) for the `IdleStateHandler`'s time.
final class CloseWhenIdle: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}

/// Closes a connection whose request is not complete by its deadline: from when the connection was set up, or the
/// last response ended (a connection kept alive), to the end of the next request, head and body. A TLS handshake that
/// stalls, a client that sends nothing, or a head or body a byte at a time, holds one of the server's few
/// connections only that long. A response that goes on (the event stream) sets no deadline: the idle timeout and
/// its comments watch it.
final class RequestDeadline: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let deadline: TimeAmount
    private var timer: Scheduled<Void>?

    init(deadline: TimeAmount) {
        self.deadline = deadline
    }

    private func arm(_ context: ChannelHandlerContext) {
        timer?.cancel()
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: deadline) { bound.value.close(promise: nil) }
    }

    func handlerAdded(context: ChannelHandlerContext) {
        arm(context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .end = unwrapInboundIn(data) {
            timer?.cancel()
            timer = nil
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { arm(context) }
        context.write(data, promise: promise)
    }
}
