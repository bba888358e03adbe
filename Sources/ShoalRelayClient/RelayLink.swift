import AsyncHTTPClient
import Foundation
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOSSL
import ServiceLifecycle
import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol
import ShoalSecurity
import ShoalTransport
import Synchronization

/// A node's link to a relay: uploads every transaction the relay lacks (the node's own and those it learnt from LAN
/// peers), pulls what the node lacks with a long-poll, and applies it like changes from a peer. It never blocks the
/// node: a relay that does not answer is retried with backoff and jitter while local writes and LAN sync go on.
public final class RelayLink: Service, Sendable {
    /// How the link works.
    public let configuration: RelayClientConfiguration
    let node: SyncNode
    /// The relay's instances.
    let bases: [String]
    /// What the link knows and decides (``RelayLinkState``): one lock around one value.
    let state: Mutex<RelayLinkState>
    /// This process's uploader id (``RelayAPI/uploaderHeader``).
    let uploaderID = String(UInt64.random(in: 1...UInt64.max), radix: 16)
    let metrics = RelayLinkMetrics()
    /// What happens, as it happens.
    public let events: AsyncStream<RelayEvent>
    let eventSink: AsyncStream<RelayEvent>.Continuation
    /// What wakes the uploader: the node's data changed, or the relay came back.
    let pushSignals: AsyncStream<Void>
    let pushWake: AsyncStream<Void>.Continuation

    /// A link for `node`; the URL is checked here (an `http://` URL must name a loopback address: the token would
    /// otherwise cross the network in clear).
    public init(node: SyncNode, configuration: RelayClientConfiguration) throws(ShoalError) {
        bases = try ([configuration.url] + configuration.otherURLs).map { url throws(ShoalError) in try Self.checked(url) }
        guard !configuration.token.isEmpty else {
            throw ShoalError(code: .invalidArgument, message: "a relay needs a token (--relay-token; `shoal relay token create` makes one)")
        }
        if let ca = configuration.caCertificatePath {
            let roots: [NIOSSLCertificate]
            do {
                roots = try NIOSSLCertificate.fromPEMFile(ca)
            } catch {
                throw ShoalError(code: .invalidArgument, message: "--relay-ca \(ca): cannot read it as PEM certificates (\(error))")
            }
            guard !roots.isEmpty else {
                throw ShoalError(code: .invalidArgument, message: "--relay-ca \(ca) holds no PEM certificate")
            }
        }
        self.node = node
        self.configuration = configuration
        let keyring = try configuration.keyringPath.map { path throws(ShoalError) in try RelayKeyring.load(path) } ?? RelayKeyring()
        state = Mutex(
            RelayLinkState(
                bases: bases,
                configuredToken: configuration.token,
                credentials: RelayLinkState.Credentials(
                    keyring: keyring,
                    seal: RelaySeal(secrets: keyring.secrets(clusterSecret: configuration.clusterSecret), epoch: keyring.newest),
                    token: keyring.token ?? configuration.token
                ),
                pieceBytes: configuration.pieceBytes,
                requestBytes: configuration.requestBytes
            )
        )
        (events, eventSink) = AsyncStream.makeStream(of: RelayEvent.self, bufferingPolicy: .bufferingNewest(1_000))
        (pushSignals, pushWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// `url` without trailing slashes, if it is an `https://` URL or an `http://` one to a loopback address.
    private static func checked(_ url: String) throws(ShoalError) -> String {
        var url = url
        while url.hasSuffix("/") { url.removeLast() }
        let lowered = url.lowercased()
        guard lowered.hasPrefix("https://") || lowered.hasPrefix("http://"),
            let components = URLComponents(string: url), let host = components.host, !host.isEmpty
        else {
            throw ShoalError(code: .invalidArgument, message: "--relay wants an https:// (or loopback http://) URL, got \"\(url)\"")
        }
        if lowered.hasPrefix("http://") {
            guard RelayAPI.isLoopback(host) else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "plain http:// to \(host) would send the token in clear: use https:// (http:// only to loopback)"
                )
            }
        }
        return url
    }

    /// The relay as this node sees it now.
    public var status: RelayStatus { state.withLock { $0.status } }

    /// Uploads and pulls until cancelled or shut down gracefully.
    public func run() async throws {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let ca = configuration.caCertificatePath { tls.trustRoots = .file(ca) }
        var http = HTTPClient.Configuration(
            tlsConfiguration: tls,
            // A connection refused is retried by the client until the connect timeout: kept short, so a node whose
            // relay instance died goes on with the next within seconds.
            timeout: HTTPClient.Configuration.Timeout(connect: .seconds(3), read: .seconds(90))
        )
        http.httpVersion = .http1Only
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: http)
        let api = RelayAPIClient(
            http: client,
            bases: bases,
            uploaderID: uploaderID,
            route: { self.state.withLock { ($0.instance, $0.credentials.token) } },
            answered: { used, ok in self.markReachable(used, ok: ok) }
        )
        do {
            try await cancelWhenGracefulShutdown {
                try await withThrowingDiscardingTaskGroup { group in
                    group.addTask {
                        for await _ in await self.node.changeSignals() { self.pushWake.yield() }
                        self.pushWake.finish()
                    }
                    group.addTask { try await self.pushLoop(api) }
                    group.addTask { try await self.pullLoop(api) }
                    group.addTask { try await self.sampleMetrics() }
                }
            }
        } catch {
            // Cancelled: the node is stopping.
        }
        eventSink.finish()
        try? await client.shutdown()
    }

    // MARK: Status

    /// Reports `event` on the link's own stream and among the node's events.
    func report(_ event: RelayEvent) {
        eventSink.yield(event)
        node.relayDid(event)
    }

    /// Records that instance `used` answered (`ok`: with success).
    func markReachable(_ used: Int, ok: Bool) {
        let now = configuration.clock.nowMilliseconds()
        if state.withLock({ $0.answered(used, ok: ok, now: now) }) {
            configuration.logger.info("relay reachable", metadata: ["url": "\(bases[used])"])
            report(.reachable)
        }
    }

    /// Records a failure that costs no backoff (it concerns one site; the others go on), said once.
    func note(_ reason: String) {
        let now = configuration.clock.nowMilliseconds()
        if state.withLock({ $0.note(reason, now: now) }) {
            configuration.logger.warning("\(reason)")
            report(.failed(reason))
        }
    }

    /// Records a failure and returns how long to wait before the next try.
    func failed(_ error: RelayCallError, backoff: inout Backoff) -> UInt64 {
        let now = configuration.clock.nowMilliseconds()
        var random = SystemRandomNumberGenerator()
        let failure = state.withLock { state in
            state.failed(
                error,
                backoff: &backoff,
                unauthorizedBackoffMilliseconds: configuration.unauthorizedBackoffMilliseconds,
                now: now,
                random: &random
            )
        }
        if let next = failure.nextInstance {
            configuration.logger.info("relay instance did not answer; trying the next", metadata: ["next": "\(next)"])
        }
        if let report = failure.report { configuration.logger.warning("\(report)") }
        if let event = failure.event { report(event) }
        if state.withLock({ $0.headsStale }) { pushWake.yield() }
        return failure.delay
    }

    /// Runs a step on the node's store; its failure is a local one, not the relay's.
    func local<T>(_ body: () async throws(ShoalError) -> T) async throws(RelayCallError) -> T {
        do {
            return try await body()
        } catch {
            throw RelayCallError.local(error)
        }
    }

    func localNow<T>(_ body: () throws(ShoalError) -> T) throws(RelayCallError) -> T {
        do {
            return try body()
        } catch {
            throw RelayCallError.local(error)
        }
    }
}
