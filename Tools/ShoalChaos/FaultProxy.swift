import NIOCore
import NIOPosix

/// The faults currently injected between nodes; the harness changes them as it goes.
actor Faults {
    /// Node ports by index (a restarted node listens on a new port).
    var targets: [Int: Int] = [:]
    /// Unordered node pairs that cannot talk.
    var partitioned: Set<[Int]> = []
    var delayMilliseconds: UInt64 = 0
    var duplicateProbability = 0.0
    var reorderProbability = 0.0
    private var open: [[Int]: [Channel]] = [:]

    func setTarget(_ node: Int, port: Int?) { targets[node] = port }

    func partition(_ a: Int, _ b: Int) {
        let pair = [min(a, b), max(a, b)]
        partitioned.insert(pair)
        for channel in open[pair] ?? [] { channel.close(promise: nil) }
        open[pair] = []
    }

    func heal(_ a: Int, _ b: Int) { partitioned.remove([min(a, b), max(a, b)]) }

    func set(delay: UInt64, duplicate: Double, reorder: Double) {
        delayMilliseconds = delay
        duplicateProbability = duplicate
        reorderProbability = reorder
    }

    func healAll() {
        partitioned = []
        set(delay: 0, duplicate: 0, reorder: 0)
    }

    func isPartitioned(_ a: Int, _ b: Int) -> Bool { partitioned.contains([min(a, b), max(a, b)]) }

    func track(_ channel: Channel, _ a: Int, _ b: Int) { open[[min(a, b), max(a, b)], default: []].append(channel) }

    var frameFaults: (delay: UInt64, duplicate: Double, reorder: Double) {
        (delayMilliseconds, duplicateProbability, reorderProbability)
    }
}

/// Forwards connections from node `from` to node `to` through the faults.
struct FaultProxy {
    let from: Int
    let to: Int
    let faults: Faults

    /// Binds on 127.0.0.1 and serves until cancelled; `ready` receives the port.
    func run(ready: @escaping @Sendable (Int) -> Void) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
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

    private func forward(_ client: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        let (from, to, faults) = (self.from, self.to, self.faults)
        guard await !faults.isPartitioned(from, to), let port = await faults.targets[to] else {
            try? await client.channel.close()
            return
        }
        do {
            let upstream = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(2))
                .connect(host: "127.0.0.1", port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                    }
                }
            await faults.track(client.channel, from, to)
            await faults.track(upstream.channel, from, to)
            try await client.executeThenClose { clientIn, clientOut in
                try await upstream.executeThenClose { upstreamIn, upstreamOut in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask { try await Self.pump(clientIn, to: upstreamOut, faults: faults) }
                        group.addTask { try await Self.pump(upstreamIn, to: clientOut, faults: faults) }
                        try await group.next()
                        group.cancelAll()
                    }
                }
            }
        } catch {
            try? await client.channel.close()
        }
    }

    /// Copies TLS records (5-byte header, payload), delaying, duplicating or swapping whole records. Peer links are
    /// TLS: a duplicated or swapped record is what an attacker on the path could do, and TLS refuses it (the
    /// connection ends, and the nodes resume on the next one), while delays only slow the link.
    private static func pump(
        _ inbound: NIOAsyncChannelInboundStream<ByteBuffer>,
        to outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>,
        faults: Faults
    ) async throws {
        var pending = ByteBuffer()
        var held: ByteBuffer?
        for try await chunk in inbound {
            pending.writeImmutableBuffer(chunk)
            while let length = pending.getInteger(at: pending.readerIndex + 3, as: UInt16.self),
                pending.readableBytes >= 5 + Int(length)
            {
                let record = pending.readSlice(length: 5 + Int(length))!
                let (delay, duplicate, reorder) = await faults.frameFaults
                if delay > 0 { try await Task.sleep(for: .milliseconds(UInt64.random(in: 0...delay))) }
                if held == nil && Double.random(in: 0..<1) < reorder {
                    held = record
                    continue
                }
                try await outbound.write(record)
                if Double.random(in: 0..<1) < duplicate { try await outbound.write(record) }
                if let swapped = held {
                    held = nil
                    try await outbound.write(swapped)
                }
            }
        }
        if let swapped = held { try await outbound.write(swapped) }
    }
}
