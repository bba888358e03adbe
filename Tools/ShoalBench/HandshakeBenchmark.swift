import Foundation
import NIOCore
import NIOPosix
import Shoal
import ShoalProcesses

/// How long a connection takes from the TCP connect to the peer's hello: mutual TLS 1.3 with the roster check
/// (and, for the ratio, the same without TLS), against a real `shoal serve` on loopback.
enum HandshakeBenchmark {
    /// Handshake latency percentiles (milliseconds), TLS and plaintext.
    static func run(_ directory: String, connections: Int) async throws -> [(String, Double)] {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let server = directory + "/server.db"
        let client = directory + "/client.db"
        for path in [server, client] {
            let store = try Store(path: path)
            try store.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, a TEXT)")
            try store.replicate(table: "t")
        }
        try Membership.formLocally([server, client], now: SystemWallClock().nowMilliseconds())
        var figures: [(String, Double)] = []
        for plaintext in [false, true] {
            let serving = try ServeProcess.startIsolated(
                database: server,
                name: "server",
                peers: [],
                extra: plaintext ? ["--insecure-plaintext"] : []
            )
            defer { serving.stop() }
            let store = try Store(path: client)
            let security = try NodeSecurity(databasePath: client, store: store, name: "client")
            let setup: any ChannelSetup =
                plaintext
                ? FramingChannelSetup()
                : try TLSChannelSetup(
                    identity: security.keyFile.identity,
                    name: "client",
                    siteID: store.siteID,
                    trust: security.trust
                )
            let hello = Hello(
                clusterID: plaintext ? "default" : security.keyFile.cluster.idHex,
                siteID: store.siteID,
                nodeName: "client",
                schemaFingerprint: try store.schemaFingerprint(),
                listenPort: 0
            )
            var samples: [Double] = []
            for _ in 0..<connections {
                let started = ContinuousClock.now
                let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .connect(host: "127.0.0.1", port: serving.port) { channel in setup.configure(channel, role: .client) }
                _ = try await setup.authenticatedPeer(of: channel.channel)
                let answered = try await channel.executeThenClose { inbound, outbound in
                    try await outbound.write(.hello(hello))
                    var messages = inbound.makeAsyncIterator()
                    guard case .hello = try await messages.next() else { return false }
                    return true
                }
                guard answered else { throw ServeError(message: "the node did not answer the hello") }
                samples.append(Double((ContinuousClock.now - started).components.attoseconds) / 1e15
                    + Double((ContinuousClock.now - started).components.seconds) * 1000)
            }
            samples.sort()
            func percentile(_ fraction: Double) -> Double { samples[min(samples.count - 1, Int(Double(samples.count) * fraction))] }
            let name = plaintext ? "handshake_plaintext" : "handshake_tls"
            figures += [("\(name)_p50_ms", percentile(0.5)), ("\(name)_p99_ms", percentile(0.99))]
        }
        return figures
    }
}
