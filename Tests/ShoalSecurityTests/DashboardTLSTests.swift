import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import ShoalDashboard
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalSecurity
@testable import ShoalStore

/// The dashboard over HTTPS with a node's own TLS identity (``MemberTLSServerSetup``), over real sockets on
/// loopback: a member's certificate gets the page's state, and the server shows the node's key; a stranger's
/// certificate, a joining device's, and none at all are refused in the handshake, before any HTTP.
@Suite struct DashboardTLSTests {
    /// What a TLS client saw: the server's node id, the bytes it received, and the error that ended it.
    struct Exchange {
        var serverNode: NodeID?
        var received: String
        var error: String?
    }

    @Test func membersAreServedOthersAreRefused() async throws {
        let directory = try temporaryDirectory("dashboard-tls")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let strangerDirectory = directory.appendingPathComponent("stranger")
        try FileManager.default.createDirectory(at: strangerDirectory, withIntermediateDirectories: true)
        let stranger = try makeDatabase("x", in: strangerDirectory)
        let security = try NodeSecurity(databasePath: paths[0], store: try Store(path: paths[0]))
        let setup = try MemberTLSServerSetup(
            identity: security.keyFile.identity,
            name: security.name,
            siteID: security.siteID,
            trust: security.trust
        )
        let hub = DashboardHub()
        hub.publish(DashboardState(title: "tls test", mode: "node", controls: false))
        let (ports, bound) = AsyncStream.makeStream(of: Int.self)
        let server = DashboardServer(
            host: "127.0.0.1",
            port: 0,
            hub: hub,
            secureChannel: { channel in try setup.addHandler(to: channel) },
            logger: Logger(label: "test"),
            onListening: { port in bound.yield(port) }
        )
        let running = Task { try await server.run() }
        defer { running.cancel() }
        var iterator = ports.makeAsyncIterator()
        let port = try #require(await iterator.next())

        func identity(_ path: String, purpose: NodeIdentity.CertificatePurpose = .member) throws -> (
            NIOSSLCertificate, NIOSSLPrivateKey
        ) {
            let key = try KeyFile.load(forDatabase: path).identity
            let site = try Store(path: path).identitySiteID
            return (try key.certificate(name: "client", siteID: site, purpose: purpose), try key.tlsPrivateKey())
        }

        // A member (b) is served, by a server that shows a's key.
        let member = try await Self.get(port, "/state", certificate: try identity(paths[1]))
        #expect(member.received.hasPrefix("HTTP/1.1 200"), "a member got: \(member.received.prefix(200)) \(member.error ?? "")")
        #expect(member.received.contains("tls test"))
        #expect(member.serverNode == security.keyFile.identity.nodeID)
        // The node's own key is a member too.
        let own = try await Self.get(port, "/", certificate: try identity(paths[0]))
        #expect(own.received.hasPrefix("HTTP/1.1 200"))

        // A stranger's key, a joining device's certificate of a member's key, and no certificate: no HTTP at all.
        for (what, certificate) in [
            ("a stranger's certificate", try identity(stranger)),
            ("a joining device's certificate", try identity(paths[1], purpose: .join)),
            ("no certificate", nil),
        ] as [(String, (NIOSSLCertificate, NIOSSLPrivateKey)?)] {
            let refused = try await Self.get(port, "/state", certificate: certificate)
            #expect(refused.received.isEmpty, "\(what) got: \(refused.received.prefix(200))")
            #expect(refused.error != nil, "\(what): the connection ended without an error")
        }
        // A client that stalls in its handshake (a record header of a ClientHello, then nothing) is let go at the
        // deadline (10 s) rather than holding one of the server's connections for the 60 s idle time.
        #expect(await serverClosesAStalledClient(port: port, sending: [0x16, 0x03, 0x01, 0x02, 0x00, 0x01]))
        // A stranger is not listed as a device asking to join.
        #expect(security.trust.pendingDevices.isEmpty)
        // Plain HTTP gets no page either.
        let plain = try await Self.get(port, "/state", certificate: nil, tls: false)
        #expect(!plain.received.contains("tls test"))
    }

    /// `GET path` over TLS 1.3 (or plain TCP), presenting `certificate` (or none); the server's certificate is
    /// read, not checked (what the server admits is under test). Reads until the server closes, 10 s at most.
    static func get(
        _ port: Int,
        _ path: String,
        certificate: (NIOSSLCertificate, NIOSSLPrivateKey)?,
        tls: Bool = true
    ) async throws -> Exchange {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv13
        configuration.certificateVerification = .none
        configuration.applicationProtocols = ["http/1.1"]
        if let (certificate, key) = certificate {
            configuration.certificateChain = [.certificate(certificate)]
            configuration.privateKey = .privateKey(key)
        }
        let context = try NIOSSLContext(configuration: configuration)
        let recorder = Recorder()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if tls {
                        let handler = try NIOSSLClientHandler(context: context, serverHostname: nil) { chain, promise in
                            recorder.serverNode = chain.first.flatMap { try? PeerCertificate($0).nodeID }
                            promise.succeed(.certificateVerified)
                        }
                        try channel.pipeline.syncOperations.addHandler(handler)
                    }
                    try channel.pipeline.syncOperations.addHandler(recorder)
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        let request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        try? await channel.writeAndFlush(ByteBuffer(string: request))
        let deadline = channel.eventLoop.scheduleTask(in: .seconds(10)) { channel.close(promise: nil) }
        try? await channel.closeFuture.get()
        deadline.cancel()
        return try await channel.eventLoop.submit {
            Exchange(serverNode: recorder.serverNode, received: recorder.received, error: recorder.error)
        }.get()
    }

    private final class Recorder: ChannelInboundHandler, @unchecked Sendable {
        // Touched on the channel's event loop only.
        typealias InboundIn = ByteBuffer
        var received = ""
        var error: String?
        var serverNode: NodeID?

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += String(buffer: unwrapInboundIn(data))
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            self.error = "\(error)"
            context.close(promise: nil)
        }
    }
}
