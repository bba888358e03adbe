import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalSecurity
@testable import ShoalStore
@testable import ShoalTransport

/// A node's events, for tests to wait on.
typealias NodeEventLog = EventLog<NodeEvent>

/// A node running in this process with TLS and the roster check, on loopback.
struct SecuredNode {
    let node: SyncNode
    let security: NodeSecurity
    let task: Task<Void, any Error>
    let watcher: Task<Void, Never>
    let log: NodeEventLog
    let port: Int
    let path: String

    var nodeID: NodeID { security.keyFile.identity.nodeID }

    func stop() async {
        watcher.cancel()
        task.cancel()
        _ = try? await task.value
    }
}

/// A database with a replicated `kv` table and a node key (a cluster of one); returns its path.
func makeDatabase(_ name: String, in directory: URL) throws -> String {
    let path = directory.appendingPathComponent("\(name).db").path
    var options = StoreOptions()
    options.nodeName = name
    let store = try Store(path: path, options: options)
    if try !store.replicatedTables().contains("kv") {
        try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "kv")
    }
    try Membership.initialize(databasePath: path, store: store, now: SystemWallClock().nowMilliseconds())
    return path
}

/// Databases made one cluster (the first founds it, the others join with invites through its file).
func makeCluster(_ names: [String], in directory: URL) throws -> [String] {
    let paths = try names.map { try makeDatabase($0, in: directory) }
    try Membership.formLocally(paths, now: SystemWallClock().nowMilliseconds())
    return paths
}

/// Starts a node with TLS on `path`, dialling `peers`.
func startSecured(
    _ path: String,
    peers: [Int] = [],
    configure: (inout NodeConfiguration) -> Void = { _ in }
) async throws -> SecuredNode {
    let security = try NodeSecurity(databasePath: path, store: try Store(path: path))
    var configuration = NodeConfiguration(databasePath: path)
    configuration.staticPeers = peers.map { PeerAddress(host: "127.0.0.1", port: $0) }
    configuration.roundIntervalMilliseconds = 60_000  // rounds here come from writes, not the timer
    configuration.rememberPeers = false
    if ProcessInfo.processInfo.environment["SHOAL_TEST_DEBUG"] != nil {
        configuration.logger.logLevel = .trace
        configuration.logger[metadataKey: "node"] = "\(URL(fileURLWithPath: path).lastPathComponent)"
    }
    configure(&configuration)
    try security.configure(&configuration)
    let node = try await SyncNode(configuration: configuration)
    security.attach(node)
    let log = NodeEventLog()
    Task { for await event in node.events { await log.append(event) } }
    let task = Task { try await node.run() }
    let watcher = Task { await security.watchRoster(intervalMilliseconds: 200) }
    guard await log.seen(within: 60, { if case .listening = $0 { true } else { false } }),
        let port = await node.listeningPort
    else {
        task.cancel()
        watcher.cancel()
        throw ShoalError(code: .timeout, message: "node \(path) did not start listening")
    }
    return SecuredNode(node: node, security: security, task: task, watcher: watcher, log: log, port: port, path: path)
}

/// Whether the row `k` reaches `node` within `seconds` (checked after each finished round).
func holds(_ node: SecuredNode, key: String, within seconds: Double = 15) async throws -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await !node.node.execute("SELECT 1 FROM kv WHERE k = ?", [.text(key)]).rows.isEmpty { return true }
        _ = await node.log.next(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
    }
    return try await !node.node.execute("SELECT 1 FROM kv WHERE k = ?", [.text(key)]).rows.isEmpty
}

/// The text of every connection failure a node reported so far.
func failures(_ node: SecuredNode) async -> [String] {
    await node.log.events.compactMap { event in
        switch event {
        case .connectionFailed(_, let reason), .inboundConnectionFailed(_, let reason): reason
        case .peerDisconnected(_, let reason): reason
        default: nil
        }
    }
}

/// Runs `openssl s_client` against `port` with `arguments`; its exit status and output. Fails loudly when openssl
/// is missing (the test command installs it).
func opensslClient(port: Int, _ arguments: [String]) async throws -> ProcessOutput {
    try await offPool {
        try runProcess(
            URL(fileURLWithPath: "/usr/bin/openssl"),
            ["s_client", "-connect", "127.0.0.1:\(port)", "-brief"] + arguments,
            input: Data(),
            timeout: 30
        )
    }
}

/// What a TLS client that is not a Shoal node saw of a node: how many bytes of application data arrived before the
/// node closed, and the error that closed it.
struct TLSProbeResult {
    var received: Int
    var error: String?
}

/// Connects with TLS 1.3 and ALPN `shoal/1`, presenting `certificate` (or none), and waits (10 s at most) for the
/// node to close the connection.
func tlsProbe(
    port: Int,
    certificate: (NIOSSLCertificate, NIOSSLPrivateKey)?
) async throws -> TLSProbeResult {
    var configuration = TLSConfiguration.makeClientConfiguration()
    configuration.minimumTLSVersion = .tlsv13
    configuration.certificateVerification = .none
    configuration.applicationProtocols = ["shoal/1"]
    if let (certificate, key) = certificate {
        configuration.certificateChain = [.certificate(certificate)]
        configuration.privateKey = .privateKey(key)
    }
    let context = try NIOSSLContext(configuration: configuration)
    let recorder = ProbeRecorder()
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: nil))
                try channel.pipeline.syncOperations.addHandler(recorder)
            }
        }
        .connect(host: "127.0.0.1", port: port).get()
    let deadline = channel.eventLoop.scheduleTask(in: .seconds(10)) { channel.close(promise: nil) }
    try? await channel.closeFuture.get()
    deadline.cancel()
    return try await channel.eventLoop.submit { TLSProbeResult(received: recorder.received, error: recorder.error) }.get()
}

private final class ProbeRecorder: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    var received = 0
    var error: String?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        received += unwrapInboundIn(data).readableBytes
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.error = "\(error)"
        context.close(promise: nil)
    }
}
