import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Shoal
import ShoalProcesses
import Synchronization

/// The idle part of `shoal-bench relay`: one relay process on loopback holding `count` idle live node connections,
/// and what they cost it in memory.
///
/// Each connection is a keep-alive HTTP/1.1 connection with a real long-poll `POST /v1/pull` waiting on it (a valid
/// token, an empty vector, `waitMilliseconds` 30,000 on a cluster with nothing stored), posted again whenever the relay
/// answers, as a node does. The load is bounded in count and time: `count` connections, opened in waves, held
/// `seconds` seconds, then closed.
struct RelayIdleConnections {
    let count: Int
    let seconds: Int
    /// Where the relay stores (`--data DIR` or `--postgres URL`); its figures' names start with `prefix`.
    let storage: [String]
    let prefix: String

    /// Connections per loopback source address (127.0.0.2, 127.0.0.3, …): each address has its own ephemeral ports.
    static let perSourceAddress = 2_000

    func run(_ directory: String) async throws -> [(String, Double)] {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var count = self.count
        let limit = raiseOpenFilesLimit()
        if limit < count + 256 {
            let said = "shoal-bench relay: this process may open \(limit) files (its hard limit): holding "
                + "\(limit - 256) idle connections, not \(count)\n"
            FileHandle.standardError.write(Data(said.utf8))
            count = max(1, limit - 256)
        }
        // One token makes every pull; a burst of `count` pulls is over the default rate limit (200 a second, bursts of
        // 400), and the default of 10,000 open connections is the goal itself: both are raised for this part.
        let process = try RelayProcess.start(
            storage: storage,
            log: directory + "/relay.log",
            extra: ["--rate-limit", "1000000", "--max-connections", "\(count + 2_000)"]
        )
        defer { process.stop() }
        let pid = process.process.processIdentifier
        let token = try RelayProcess.token(storage: storage, cluster: "bench")
        try await Task.sleep(for: .seconds(1))  // the relay settles before its baseline is read
        let baseline = ServeProcess.residentMiB(pid: pid) ?? 0

        let load = IdleLoad(port: process.port, token: token)
        defer { load.shutDown() }
        let opening = ContinuousClock.now
        try await load.open(count)
        let opened = ContinuousClock.now - opening
        var peakHeld = 0
        var samples: [Double] = []
        let holding = ContinuousClock.now
        while ContinuousClock.now - holding < .seconds(seconds) {
            try await Task.sleep(for: .seconds(1))  // sampling while the connections are held
            peakHeld = max(peakHeld, load.held.load(ordering: .relaxed))
            if let resident = ServeProcess.residentMiB(pid: pid) { samples.append(resident) }
        }
        let held = load.held.load(ordering: .relaxed)
        let resident = ServeProcess.residentMiB(pid: pid) ?? 0
        let peak = ServeProcess.peakResidentMiB(pid: pid) ?? 0
        load.shutDown()
        return [
            (prefix + "connections_asked", Double(count)),
            (prefix + "connections_held", Double(held)),
            (prefix + "failed", Double(load.failed.load(ordering: .relaxed))),
            (prefix + "answered", Double(load.answered.load(ordering: .relaxed))),
            (prefix + "open_seconds", Double(opened.components.seconds) + Double(opened.components.attoseconds) / 1e18),
            (prefix + "base_rss_mb", baseline),
            (prefix + "rss_mb", resident),
            (prefix + "max_rss_mb", samples.max() ?? resident),
            (prefix + "peak_rss_mb", peak),
            (prefix + "mb_per_1000", held > 0 ? (resident - baseline) / Double(held) * 1000 : .nan),
        ]
    }

    /// Raises this process's soft limit of open files to its hard limit; returns the limit now in force.
    private func raiseOpenFilesLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return limit.rlim_cur > rlim_t(Int.max) ? Int.max : Int(limit.rlim_cur)
    }
}

/// A load generator of idle live nodes on loopback: keep-alive HTTP/1.1 connections to one relay, each with a
/// long-poll pull posted on it and posted again when answered.
final class IdleLoad: Sendable {
    /// Connections open that have seen no error, no refusal and no close by the relay.
    let held = Atomic<Int>(0)
    /// Connections that could not connect, were refused a pull, or were closed by the relay.
    let failed = Atomic<Int>(0)
    /// Long-polls the relay answered (each posted again).
    let answered = Atomic<Int>(0)
    /// Set before the generator closes its connections itself: those closes are no failures.
    let stopping = Atomic<Bool>(false)

    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    private let channels = Mutex<[any Channel]>([])
    private let port: Int
    private let head: HTTPRequestHead
    private let body: ByteBuffer

    init(port: Int, token: String) {
        self.port = port
        let json = Array(#"{"vector":{},"waitMilliseconds":30000}"#.utf8)
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "127.0.0.1:\(port)")
        headers.add(name: "Authorization", value: "Bearer \(token)")
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: "\(json.count)")
        head = HTTPRequestHead(version: .http1_1, method: .POST, uri: RelayAPI.pullPath, headers: headers)
        body = ByteBuffer(bytes: json)
    }

    /// Opens `count` connections in waves of 250 connects at once, each from one of several loopback source addresses.
    func open(_ count: Int) async throws {
        var index = 0
        while index < count {
            let wave = (index..<min(count, index + 250)).map { index in
                let source = try? SocketAddress(
                    ipAddress: "127.0.0.\(2 + index / RelayIdleConnections.perSourceAddress)",
                    port: 0
                )
                return makeBootstrap(source: source).connect(host: "127.0.0.1", port: port)
            }
            for connecting in wave {
                do {
                    let channel = try await connecting.get()
                    channels.withLock { $0.append(channel) }
                } catch {
                    failed.add(1, ordering: .relaxed)
                }
            }
            index += wave.count
        }
    }

    private func makeBootstrap(source: SocketAddress?) -> ClientBootstrap {
        let head = self.head
        let body = self.body
        var bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.seconds(20))
            .channelInitializer { [self] channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(LongPollClient(load: self, head: head, body: body))
                }
            }
        if let source { bootstrap = bootstrap.bind(to: source) }
        return bootstrap
    }

    /// Closes every connection and stops the event loop (once).
    func shutDown() {
        guard !stopping.exchange(true, ordering: .relaxed) else { return }
        let all = channels.withLock { channels in
            defer { channels = [] }
            return channels
        }
        for channel in all { channel.close(promise: nil) }
        try? group.syncShutdownGracefully()
    }
}

/// One idle live node: posts a long-poll pull when connected and again whenever it is answered.
private final class LongPollClient: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    private let load: IdleLoad
    private let head: HTTPRequestHead
    private let body: ByteBuffer
    private var healthy = false

    init(load: IdleLoad, head: HTTPRequestHead, body: ByteBuffer) {
        self.load = load
        self.head = head
        self.body = body
    }

    func channelActive(context: ChannelHandlerContext) {
        healthy = true
        load.held.add(1, ordering: .relaxed)
        post(context)
        context.fireChannelActive()
    }

    private func post(_ context: ChannelHandlerContext) {
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let response):
            if response.status != .ok { fail(context) }
        case .body:
            break
        case .end:
            load.answered.add(1, ordering: .relaxed)
            if healthy && !load.stopping.load(ordering: .relaxed) { post(context) }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !load.stopping.load(ordering: .relaxed) { fail(context) }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context)
        context.close(promise: nil)
    }

    /// Counts this connection as failed, once.
    private func fail(_ context: ChannelHandlerContext) {
        guard healthy else { return }
        healthy = false
        load.held.subtract(1, ordering: .relaxed)
        load.failed.add(1, ordering: .relaxed)
    }
}
