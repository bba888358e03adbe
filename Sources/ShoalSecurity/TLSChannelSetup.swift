import NIOCore
import NIOSSL
import NIOTLS
import ShoalCore
import ShoalProtocol
import ShoalTransport
import Synchronization

/// Mutual TLS 1.3 around the plain framing: every connection proves both keys, and the peer's key is checked
/// against the roster in NIOSSL's custom verification callback before the handshake ends. No message is read
/// before the check passed, and the node sends nothing before ``authenticatedPeer(of:)`` returned.
///
/// A member's certificate negotiates ALPN `shoal/1`; a joining device's (``NodeIdentity/CertificatePurpose/join``)
/// negotiates `shoal-join/1` and gets only the join exchange. TLS 1.2 and older are refused, as is a peer without
/// a certificate or with a key that is not P-256. A handshake that has not ended after the handshake timeout is
/// closed, so a stalled ClientHello holds nothing but its own socket (and its slot in the pool of handshaking
/// connections).
public struct TLSChannelSetup: ChannelSetup {
    /// The ALPN name of sync connections.
    public static let syncProtocol = "shoal/1"
    /// The ALPN name of join connections.
    public static let joinProtocol = "shoal-join/1"

    private let framing: FramingChannelSetup
    private let serverContext: NIOSSLContext
    private let clientContext: NIOSSLContext
    private let trust: TrustStore?
    private let handshakeTimeout: TimeAmount
    private let clock: any WallClock
    /// Each channel's verdict, kept apart from its pipeline: a connection refused in its handshake closes, and its
    /// handlers go, before the node asks why.
    private let outcomes = Outcomes()

    /// A member's setup: its certificate (made now from `identity`, with its admission as `trust`'s roster has it),
    /// and the roster check through `trust`.
    public init(
        identity: NodeIdentity,
        name: String,
        siteID: SiteID,
        trust: TrustStore,
        maximumFrameLength: Int = WireProtocol.defaultMaximumFrameLength,
        handshakeTimeoutMilliseconds: Int64 = 10_000,
        clock: any WallClock = SystemWallClock()
    ) throws(ShoalError) {
        let certificate = try identity.certificate(
            name: name,
            siteID: siteID,
            purpose: .member,
            admission: trust.roster.admissionProof(of: identity.nodeID)
        )
        let key = try identity.tlsPrivateKey()
        self.framing = FramingChannelSetup(maximumFrameLength: maximumFrameLength)
        self.serverContext = try Self.context(certificate, key, server: true, protocols: [Self.syncProtocol, Self.joinProtocol])
        self.clientContext = try Self.context(certificate, key, server: false, protocols: [Self.syncProtocol])
        self.trust = trust
        self.handshakeTimeout = .milliseconds(handshakeTimeoutMilliseconds)
        self.clock = clock
    }

    /// A joining device's setup (dialling only): its certificate says it comes to join, and it takes any member's
    /// key, which the join exchange then proves (the member must know the invite code).
    public init(
        joining identity: NodeIdentity,
        name: String,
        siteID: SiteID,
        handshakeTimeoutMilliseconds: Int64 = 10_000
    ) throws(ShoalError) {
        let certificate = try identity.certificate(name: name, siteID: siteID, purpose: .join)
        let key = try identity.tlsPrivateKey()
        self.framing = FramingChannelSetup(maximumFrameLength: WireProtocol.maximumHelloFrameLength + JoinMessage.maximumWelcomeBytes)
        self.serverContext = try Self.context(certificate, key, server: true, protocols: [Self.joinProtocol])
        self.clientContext = try Self.context(certificate, key, server: false, protocols: [Self.joinProtocol])
        self.trust = nil
        self.handshakeTimeout = .milliseconds(handshakeTimeoutMilliseconds)
        self.clock = SystemWallClock()
    }

    /// TLS 1.3 only, this certificate, and the peer's certificate required (the caller checks it against the roster).
    static func context(
        _ certificate: NIOSSLCertificate,
        _ key: NIOSSLPrivateKey,
        server: Bool,
        protocols: [String]
    ) throws(ShoalError) -> NIOSSLContext {
        var configuration =
            server
            ? TLSConfiguration.makeServerConfiguration(certificateChain: [.certificate(certificate)], privateKey: .privateKey(key))
            : TLSConfiguration.makeClientConfiguration()
        if !server {
            configuration.certificateChain = [.certificate(certificate)]
            configuration.privateKey = .privateKey(key)
        }
        configuration.minimumTLSVersion = .tlsv13
        configuration.maximumTLSVersion = .tlsv13
        // Ask for, and require, the peer's certificate; the roster check replaces the chain of trust.
        configuration.certificateVerification = .noHostnameVerification
        configuration.trustRoots = .certificates([])
        configuration.applicationProtocols = protocols
        do {
            return try NIOSSLContext(configuration: configuration)
        } catch {
            throw ShoalError(code: .handshakeFailed, message: "cannot set up TLS: \(error)")
        }
    }

    /// Adds the TLS handler and the verifier, then the framing.
    public func configure(
        _ channel: any Channel,
        role: ChannelRole
    ) -> EventLoopFuture<NIOAsyncChannel<WireMessage, WireMessage>> {
        let address = channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "unknown"
        return channel.eventLoop.makeCompletedFuture {
            let verifier = PeerVerifier(
                trust: trust,
                role: role,
                address: address,
                timeout: handshakeTimeout,
                clock: clock
            )
            let callback: NIOSSLCustomVerificationCallback = { certificates, promise in
                promise.succeed(verifier.verify(certificates))
            }
            let tls: NIOSSLHandler =
                switch role {
                case .server: NIOSSLServerHandler(context: serverContext, customVerificationCallback: callback)
                case .client:
                    try NIOSSLClientHandler(context: clientContext, serverHostname: nil, customVerificationCallback: callback)
                }
            try channel.pipeline.syncOperations.addHandler(tls)
            try channel.pipeline.syncOperations.addHandler(verifier)
            outcomes.keep(verifier.outcome, for: channel)
        }.flatMap {
            framing.configure(channel, role: role)
        }
    }

    /// Waits for the handshake and the roster check (at most the handshake timeout).
    public func authenticatedPeer(of channel: any Channel) async throws(ShoalError) -> PeerIdentity? {
        guard let outcome = outcomes.take(for: channel) else {
            throw ShoalError(code: .handshakeFailed, message: "the connection closed during the TLS handshake")
        }
        do {
            return try await outcome.get()
        } catch let error as ShoalError {
            throw error
        } catch {
            throw ShoalError(code: .handshakeFailed, message: "the TLS handshake did not finish: \(error)")
        }
    }
}

/// The verdicts of channels being set up, by channel; each is taken once, or dropped a minute after its channel
/// closed.
private final class Outcomes: Sendable {
    private let byChannel = Mutex<[ObjectIdentifier: EventLoopFuture<PeerIdentity>]>([:])

    func keep(_ outcome: EventLoopFuture<PeerIdentity>, for channel: any Channel) {
        let key = ObjectIdentifier(channel)
        byChannel.withLock { $0[key] = outcome }
        channel.closeFuture.whenComplete { [self] _ in
            channel.eventLoop.scheduleTask(in: .seconds(60)) { [self] in drop(key, outcome) }
        }
    }

    func take(for channel: any Channel) -> EventLoopFuture<PeerIdentity>? {
        byChannel.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }

    private func drop(_ key: ObjectIdentifier, _ outcome: EventLoopFuture<PeerIdentity>) {
        byChannel.withLock { entries in
            if let kept = entries[key], kept === outcome { entries[key] = nil }
        }
    }
}

/// Checks the peer's certificate (in the TLS callback), then waits for the handshake's end, for the ALPN name that
/// matches the purpose, or for the deadline; completes ``outcome`` either way.
final class PeerVerifier: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let trust: TrustStore?
    private let role: ChannelRole
    private let address: String
    private let timeout: TimeAmount
    private let clock: any WallClock
    private var promise: EventLoopPromise<PeerIdentity>?
    private var done = false
    private var deadline: Scheduled<Void>?
    /// What the callback decided: who, and for what; or why not.
    private var verified: PeerIdentity?
    private var refusal: String?

    init(trust: TrustStore?, role: ChannelRole, address: String, timeout: TimeAmount, clock: any WallClock) {
        self.trust = trust
        self.role = role
        self.address = address
        self.timeout = timeout
        self.clock = clock
    }

    /// Who the peer is, once verified; fails when the handshake or the check fails or times out.
    var outcome: EventLoopFuture<PeerIdentity> { promise!.futureResult }

    func handlerAdded(context: ChannelHandlerContext) {
        promise = context.eventLoop.makePromise()
        let channel = context.channel
        let milliseconds = timeout.nanoseconds / 1_000_000
        // Runs on the channel's event loop, as every call into this handler does.
        deadline = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
            self?.finish(
                .failure(ShoalError(code: .timeout, message: "the TLS handshake did not finish within \(milliseconds) ms"))
            )
            channel.close(promise: nil)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        finish(.failure(ShoalError(code: .handshakeFailed, message: "the connection closed during the TLS handshake")))
    }

    /// The verification callback's decision.
    func verify(_ certificates: [NIOSSLCertificate]) -> NIOSSLVerificationResult {
        guard let leaf = certificates.first else {
            refusal = "the peer sent no certificate"
            return .failed
        }
        let certificate: PeerCertificate
        do {
            certificate = try PeerCertificate(leaf)
        } catch {
            refusal = error.message
            return .failed
        }
        guard let trust else {
            // A joining device takes any member's key here: the join exchange proves it knows the code.
            verified = PeerIdentity(nodeID: certificate.nodeID, publicKey: certificate.publicKeyDER, name: certificate.name, purpose: .sync)
            return .certificateVerified
        }
        let ip = address.split(separator: ":").dropLast().joined(separator: ":")
        switch trust.check(certificate, address: ip, acceptsJoins: role == .server, now: clock.nowMilliseconds()) {
        case .member:
            verified = PeerIdentity(nodeID: certificate.nodeID, publicKey: certificate.publicKeyDER, name: certificate.name, purpose: .sync)
            return .certificateVerified
        case .joining:
            verified = PeerIdentity(nodeID: certificate.nodeID, publicKey: certificate.publicKeyDER, name: certificate.name, purpose: .join)
            return .certificateVerified
        case .refused(let reason):
            refusal = reason
            // A dialling node lets the handshake finish so that the peer sees its certificate too (and lists it as
            // pending), then closes before a byte of application data: ``outcome`` fails with the refusal.
            return role == .client ? .certificateVerified : .failed
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = event {
            // A joining device (no trust store) and a member taking a join speak the join protocol.
            let joining = trust == nil || verified?.purpose == .join
            let expected = joining ? TLSChannelSetup.joinProtocol : TLSChannelSetup.syncProtocol
            if let refusal {
                finish(.failure(ShoalError(code: .notAMember, message: refusal)))
                context.close(promise: nil)
                return
            }
            if let verified, negotiated == expected {
                finish(.success(verified))
            } else {
                let why = verified == nil ? "no certificate was checked" : "ALPN \(negotiated ?? "none"), not \(expected)"
                finish(.failure(ShoalError(code: .handshakeFailed, message: "TLS handshake refused: \(why)")))
                context.close(promise: nil)
                return
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // TLS delivers application data only after the handshake; before the check passed, nothing goes on.
        guard verified != nil, refusal == nil else { return }
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // What reaches the connection (during the handshake or after it, say an alert refusing our key) is a
        // ShoalError that says what happened.
        let described = (error as? ShoalError) ?? ShoalError(code: .handshakeFailed, message: describe(error))
        finish(.failure(described))
        context.fireErrorCaught(described)
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(.failure(ShoalError(code: .handshakeFailed, message: refusal ?? "the peer closed during the TLS handshake")))
        context.fireChannelInactive()
    }

    private func finish(_ result: Result<PeerIdentity, ShoalError>) {
        deadline?.cancel()
        deadline = nil
        guard !done, let promise else { return }
        done = true
        switch result {
        case .success(let identity): promise.succeed(identity)
        case .failure(let error): promise.fail(error)
        }
    }

    /// A person's account of a TLS failure; BoringSSL's own text only when it matches nothing known.
    private func describe(_ error: any Error) -> String {
        if let refusal { return refusal }
        let text = String(describing: error)
        if text.contains("PROTOCOL_VERSION") || text.contains("UNSUPPORTED_PROTOCOL") {
            return "the peer does not speak TLS 1.3"
        }
        if text.contains("NO_APPLICATION_PROTOCOL") {
            return "the peer does not speak Shoal's protocol (no ALPN \(TLSChannelSetup.syncProtocol))"
        }
        if text.contains("CERTIFICATE_REQUIRED") || text.contains("PEER_DID_NOT_RETURN_A_CERTIFICATE") {
            return "the peer sent no certificate"
        }
        if text.contains("CERTIFICATE") || text.contains("HANDSHAKE_FAILURE") {
            return "the peer does not accept this node's key (not on its roster: pending there until a member runs "
                + "`shoal trust add`, or removed)"
        }
        if text.contains("EOF during handshake") || text.contains("uncleanShutdown") {
            return "the peer closed the connection during the TLS handshake"
        }
        if text.contains("WRONG_VERSION_NUMBER") || text.contains("HTTP") || text.contains("PACKET_LENGTH") {
            return "the peer does not speak TLS (does it run with --insecure-plaintext?)"
        }
        // BoringSSL's errors name the source file: keep the reason, not the path.
        let reason = text.split(separator: " at /").first.map(String.init) ?? text
        return "the TLS handshake failed: \(reason.prefix(200))"
    }
}
