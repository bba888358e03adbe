import Foundation
import NIOCore
import NIOPosix
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport
@testable import ShoalProtocol

/// A node's events, for tests to wait on.
typealias NodeEventLog = EventLog<NodeEvent>

/// A running node on loopback, with its database and its event log.
struct RunningNode {
    let node: SyncNode
    let task: Task<Void, any Error>
    let log: NodeEventLog
    let port: Int
    let path: String

    func stop() async {
        task.cancel()
        _ = try? await task.value
    }
}

func startNode(
    in directory: URL,
    name: String,
    peers: [Int] = [],
    configure: (inout NodeConfiguration) -> Void = { _ in }
) async throws -> RunningNode {
    let path = directory.appendingPathComponent("\(name).db").path
    do {
        var options = StoreOptions()
        options.nodeName = name
        let store = try Store(path: path, options: options)
        if try store.replicatedTables().isEmpty {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v, n INTEGER DEFAULT 0)")
            try store.replicate(table: "kv", counters: ["n"])
        }
    }
    var configuration = NodeConfiguration(databasePath: path)
    configuration.clusterID = "test"
    configuration.insecurePlaintext = true  // the transport's own tests; ShoalSecurityTests run these paths with TLS
    configuration.staticPeers = peers.map { PeerAddress(host: "127.0.0.1", port: $0) }
    configuration.roundIntervalMilliseconds = 60_000  // rounds here come from writes, not the timer
    configure(&configuration)
    let node = try await SyncNode(configuration: configuration)
    let log = NodeEventLog()
    Task { for await event in node.events { await log.append(event) } }
    let task = Task { try await node.run() }
    // A deadline, not a synchronisation: the listening event is what we wait for.
    guard await log.seen(within: 60, { if case .listening = $0 { true } else { false } }),
        let port = await node.listeningPort
    else {
        task.cancel()
        let outcome = await task.result
        throw ShoalError(code: .timeout, message: "node \(name) did not start listening: \(outcome)")
    }
    return RunningNode(node: node, task: task, log: log, port: port, path: path)
}

/// Waits until the two nodes' digests match, re-checking after each finished round; `false` on deadline.
func converge(_ a: RunningNode, _ b: RunningNode, within seconds: Double = 15) async throws -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await a.node.digest() == b.node.digest() { return true }
        _ = await b.log.next(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
    }
    return try await a.node.digest() == b.node.digest()
}

/// Connects to `port` with raw bytes, sends `bytes` (then closes its side if `finish`), and returns every
/// message the node sends back before it closes the connection (or `seconds` pass).
func rawExchange(
    port: Int,
    sending bytes: [UInt8],
    finish: Bool = false,
    within seconds: Double = 30
) async throws
    -> [WireMessage]
{
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
    return try await channel.executeThenClose { inbound, outbound in
        if !bytes.isEmpty { try await outbound.write(ByteBuffer(bytes: bytes)) }
        if finish { outbound.finish() }
        var received = ByteBuffer()
        let deadline = Task {
            try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
            channel.channel.close(promise: nil)
        }
        defer { deadline.cancel() }
        do {
            for try await chunk in inbound { received.writeImmutableBuffer(chunk) }
        } catch {}
        var messages: [WireMessage] = []
        while let message = try? WireMessageDecoder.nextMessage(from: &received, maximumFrameLength: 1 << 24) {
            messages.append(message)
        }
        return messages
    }
}

func frame(_ message: WireMessage) -> [UInt8] {
    var buffer = ByteBuffer()
    try! WireMessageEncoder.write(message, to: &buffer, maximumFrameLength: 1 << 24)
    return Array(buffer.readableBytesView)
}

/// A port free right now on 127.0.0.1.
func freePort() async throws -> Int {
    let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .bind(host: "127.0.0.1", port: 0).get()
    let port = channel.localAddress!.port!
    try await channel.close()
    return port
}

/// Connects, sends `bytes`, and never reads: the returned channel must be closed by the caller.
func stalledClient(port: Int, sending bytes: [UInt8]) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .channelOption(.socketOption(.so_rcvbuf), value: 4096)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
    try await channel.channel.writeAndFlush(ByteBuffer(bytes: bytes))
    return channel
}
