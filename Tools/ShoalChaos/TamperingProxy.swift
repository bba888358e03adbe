import NIOCore
import NIOHTTP1
import NIOPosix
import Shoal

/// A relay operator who alters what the relay answers: while it is on, some pull answers reach the nodes changed
/// (a byte flipped in a chunk, two chunks swapped, a chunk of another cluster injected, an earlier authentic chunk
/// replayed as a later range). Every chunk is sealed with its header authenticated, so no node may apply any of it.
actor Tampering {
    /// The run's cluster id (hex): chunks of any other cluster seen in uploads are kept, to inject.
    let cluster: String
    /// Whether pull answers are being altered.
    private(set) var isOn = false
    /// The share of pull answers altered while on.
    private var probability = 0.0
    /// Encoded chunks of another cluster, captured from uploads that went through the proxy.
    private(set) var foreign: [[UInt8]] = []
    /// Encoded chunks of this cluster seen in pull answers (the latest few, small ones), to replay.
    private var authentic: [[UInt8]] = []
    /// What was done, by kind.
    private(set) var counts: [String: Int] = [:]
    private var random = SystemRandomNumberGenerator()

    init(cluster: String) { self.cluster = cluster }

    func set(on: Bool, probability: Double) {
        isOn = on
        self.probability = on ? probability : 0
    }

    /// Whether to alter the answer about to come.
    func shouldAlter() -> Bool { isOn && Double.random(in: 0..<1, using: &random) < probability }

    /// Keeps the chunks of another cluster from an upload's body.
    func captureUpload(_ body: [UInt8]) {
        guard foreign.count < 8, let entries = Self.entries(body) else { return }
        for entry in entries where foreign.count < 8 {
            guard let envelope = try? RelayEnvelope.decode(entry[...]), envelope.cluster != cluster else { continue }
            foreign.append(entry)
        }
    }

    /// Keeps some authentic chunks of a pull answer that went through unaltered.
    func capturePull(_ body: [UInt8]) {
        guard let entries = Self.entries(body) else { return }
        for entry in entries where entry.count <= 64 * 1024 {
            authentic.append(entry)
        }
        if authentic.count > 32 { authentic.removeFirst(authentic.count - 32) }
    }

    /// `body` (a ``RelayEnvelopeList``) altered one way; the same bytes when it cannot be parsed.
    func alter(_ body: [UInt8]) -> [UInt8] {
        guard var entries = Self.entries(body) else { return body }
        var kinds = ["replayed chunk"]
        if !entries.isEmpty { kinds.append("flipped byte") }
        if entries.count >= 2 { kinds.append("swapped chunks") }
        if !foreign.isEmpty { kinds.append("foreign chunk") }
        let kind = kinds.randomElement(using: &random)!
        switch kind {
        case "flipped byte":
            let index = Int.random(in: 0..<entries.count, using: &random)
            // Mostly inside the sealed body (the AEAD refuses it), sometimes in the header (its seal covers it).
            let count = entries[index].count
            let offset =
                Bool.random(using: &random) && count > 60
                ? Int.random(in: (count - 28)..<count, using: &random) : Int.random(in: 0..<count, using: &random)
            entries[index][offset] ^= UInt8.random(in: 1...255, using: &random)
        case "swapped chunks":
            let first = Int.random(in: 0..<entries.count, using: &random)
            var second = Int.random(in: 0..<(entries.count - 1), using: &random)
            if second >= first { second += 1 }
            entries.swapAt(first, second)
        case "foreign chunk":
            var chunk = foreign.randomElement(using: &random)!
            // Half the time dressed as this cluster's, under a site and range the page holds (its seal still says
            // otherwise).
            if Bool.random(using: &random), var envelope = try? RelayEnvelope.decode(chunk[...]) {
                envelope.cluster = cluster
                if let other = entries.lazy.compactMap({ try? RelayEnvelope.decode($0[...]) }).first {
                    envelope.site = other.site
                    envelope.from = other.from
                    envelope.to = other.from + 1
                    envelope.flags = [.batchEnd, .rangeEnd]
                    envelope.index = 0
                }
                chunk = envelope.encoded()
            }
            entries.insert(chunk, at: Int.random(in: 0...entries.count, using: &random))
        default:
            guard let earlier = authentic.randomElement(using: &random) else {
                // Nothing seen yet: this page's own first chunk again, later in the page.
                if let first = entries.first { entries.append(first) }
                break
            }
            var chunk = earlier
            // Mostly re-filed after the range it belonged to (its authenticated header said otherwise); sometimes sent
            // again exactly as it was.
            if Int.random(in: 0..<4, using: &random) != 0, var envelope = try? RelayEnvelope.decode(earlier[...]) {
                let length = max(envelope.to > envelope.from ? envelope.to - envelope.from : 1, 1)
                let later = entries.lazy.compactMap { try? RelayEnvelope.decode($0[...]) }
                    .filter { $0.site == envelope.site }.map { max($0.to, $0.from) }.max()
                envelope.from = max(later ?? 0, envelope.to, envelope.from) + UInt64.random(in: 0...2, using: &random)
                envelope.to = envelope.from + length
                envelope.index = 0
                envelope.flags = [.batchEnd, .rangeEnd]
                chunk = envelope.encoded()
            }
            entries.append(chunk)
        }
        counts[kind, default: 0] += 1
        var altered: [UInt8] = []
        for entry in entries {
            let length = UInt32(entry.count)
            altered += [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)]
            altered += entry
        }
        return altered
    }

    /// The entries of an envelope list (each one's bytes, without its length), or nil when the framing is broken.
    static func entries(_ body: [UInt8]) -> [[UInt8]]? {
        var entries: [[UInt8]] = []
        var position = 0
        while position < body.count {
            guard body.count - position >= 4 else { return nil }
            let length = body[position..<position + 4].reduce(0) { $0 << 8 | Int($1) }
            position += 4
            guard body.count - position >= length else { return nil }
            entries.append(Array(body[position..<position + length]))
            position += length
        }
        return entries
    }
}

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
