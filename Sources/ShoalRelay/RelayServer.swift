import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NIOSSL
import Prometheus
import ServiceLifecycle
import ShoalCore
import ShoalRelayProtocol

/// How a relay serves.
public struct RelayServerConfiguration: Sendable {
    /// The address to listen on.
    public var host: String
    /// The port (0: any free one, reported by `onListening`).
    public var port: Int
    /// PEM certificate chain and key for HTTPS; without them the relay serves plain HTTP, on loopback only.
    public var tlsCertificatePath: String?
    /// The PEM private key that goes with ``tlsCertificatePath``.
    public var tlsKeyPath: String?
    /// The largest request body accepted (413 beyond).
    public var maximumRequestBytes = RelayAPI.defaultMaximumRequestBytes
    /// The largest change set accepted (413 beyond).
    public var maximumEnvelopeBytes = RelayAPI.defaultMaximumEnvelopeBytes
    /// Requests per second each token may make, on average (429 beyond); bursts of twice as many pass.
    public var requestsPerSecond = 1_000
    /// The byte budget of a pull's page, at most.
    public var maximumPageBytes = 16 * 1024 * 1024
    /// Open connections at most (the ones beyond wait in the listen backlog); kept under the process's limit of
    /// open files, which the relay raises to its hard limit at start.
    public var maximumConnections = 10_000
    /// A connection that sends nothing (no request, or half of one) for this long is closed; longer than any
    /// long-poll.
    public var idleTimeoutSeconds: Int64 = 45
    /// Bytes of pull answers held at once across all connections, at most, from before a page is read until its answer
    /// is written out: a pull whose page budget does not fit waits its turn, and gets 503 with `Retry-After` after
    /// ``pageMemoryWaitSeconds``; so slow readers cannot make the relay hold more.
    public var maximumPagesBytes = 256 * 1024 * 1024
    /// How long a pull waits for its page budget to fit under ``maximumPagesBytes``.
    public var pageMemoryWaitSeconds: Int64 = 10
    /// A connection whose peer takes nothing of an answer for this long is closed (answers go out in slices of
    /// ``answerSliceBytes``, each once the peer took the slices before).
    public var writeStallSeconds: Int64 = 30
    /// The slices an answer is written in.
    public static let answerSliceBytes = 64 * 1024
    /// How long change sets a snapshot covers are kept (by age and by bytes per cluster); the rest are kept until a
    /// snapshot covers them.
    public var retention = RelayRetention(maximumAgeMilliseconds: 7 * 24 * 3_600_000, maximumBytes: 256 * 1024 * 1024)
    /// Where the relay logs (failures of its storage; no request is logged).
    public var logger: Logger
    /// The registry `GET /metrics` serves (Prometheus text), with no token; nil (the default): no such route.
    ///
    /// Off unless asked for (`shoal relay serve --metrics`), because a relay usually faces the internet and the
    /// metrics would tell anyone who can reach it which clusters it serves, how much each stores and how busy it is.
    /// An operator who turns it on should keep `/metrics` from the public (a reverse proxy or firewall that lets only
    /// the scraper reach it). The metrics themselves are emitted through swift-metrics whatever this says: the
    /// process that bootstraps swift-metrics with this registry decides where they go.
    public var metrics: PrometheusCollectorRegistry?

    /// Serves on `host`:`port` with the default limits.
    public init(host: String, port: Int, logger: Logger) {
        self.host = host
        self.port = port
        self.logger = logger
    }

    /// Whether `host` names a loopback address: `localhost`, `::1`, or an IPv4 address in 127.0.0.0/8 written as
    /// one (a name that merely starts with "127." is not).
    public static func isLoopback(_ host: String) -> Bool {
        RelayAPI.isLoopback(host)
    }
}

/// The relay: a blind store-and-forward endpoint for sealed change sets (Hummingbird 2).
///
/// Routes (all but health and the API description need `Authorization: Bearer TOKEN`; a token reaches its own cluster
/// only); `GET /openapi.json` describes every one, with its bodies and refusals (OpenAPI 3.1):
/// - `GET /v1/health`
/// - `GET /v1/heads`: ``RelayHeads``
/// - `POST /v1/changesets` (an envelope list): ``RelayUploadResult``
/// - `POST /v1/pull` (a ``RelayPullRequest``): an envelope list, `Shoal-More: 1` when more remain; with nothing to
///   send it waits up to `waitMilliseconds` for an upload to the cluster (long-poll).
/// - `GET /metrics` (no token), only when ``RelayServerConfiguration/metrics`` is set: Prometheus text
public struct RelayServer: Sendable {
    /// How it serves.
    public let configuration: RelayServerConfiguration
    let storage: any RelayStorage
    let notifier = RelayNotifier()
    let limiter: RateLimiter
    let metrics = RelayMetrics()
    let pageMemory: RelayPageMemory
    let health = RelayStorageHealth()
    /// This process's ``RelayAPI/bootHeader``, on every answer.
    let boot = (0..<8).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()

    /// A relay serving `storage` as `configuration` says.
    public init(configuration: RelayServerConfiguration, storage: any RelayStorage) {
        self.configuration = configuration
        self.storage = storage
        self.limiter = RateLimiter(perSecond: configuration.requestsPerSecond)
        // Never under one page at the largest budget, or pulls could pass only one at a time.
        self.pageMemory = RelayPageMemory(limit: max(configuration.maximumPagesBytes, configuration.maximumPageBytes))
    }

    /// Serves until cancelled or shut down gracefully; `onListening` gets the bound port.
    public func run(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        let router = makeRouter()
        let stall = TimeAmount.seconds(configuration.writeStallSeconds)
        let http1 = HTTP1Channel.Configuration(
            additionalChannelHandlers: [RelayWriteStallHandler(timeout: stall)],
            idleTimeout: .seconds(configuration.idleTimeoutSeconds)
        )
        let limit = Self.raiseOpenFilesLimit()
        let maximumConnections = max(16, min(configuration.maximumConnections, limit - 64))
        let server: HTTPServerBuilder
        if let certificate = configuration.tlsCertificatePath, let key = configuration.tlsKeyPath {
            let chain: [NIOSSLCertificateSource]
            let privateKey: NIOSSLPrivateKey
            do {
                chain = try NIOSSLCertificate.fromPEMFile(certificate).map { NIOSSLCertificateSource.certificate($0) }
            } catch {
                throw ShoalError(code: .invalidArgument, message: "cannot read the certificate chain \(certificate) (PEM): \(error)")
            }
            do {
                privateKey = try NIOSSLPrivateKey(file: key, format: .pem)
            } catch {
                throw ShoalError(code: .invalidArgument, message: "cannot read the private key \(key) (PEM): \(error)")
            }
            guard !chain.isEmpty else {
                throw ShoalError(code: .invalidArgument, message: "the certificate chain \(certificate) holds no PEM certificate")
            }
            let tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(privateKey))
            do {
                // The context checks that the key goes with the certificate: made here, a mismatch is refused at start
                // with its cause, not when the server starts listening.
                _ = try NIOSSLContext(configuration: tls)
                server = try .tls(.http1(configuration: http1), tlsConfiguration: tls)
            } catch {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "the private key \(key) does not go with the certificate \(certificate) (its first "
                        + "certificate must be the one the key signs for): \(error)"
                )
            }
        } else {
            guard RelayServerConfiguration.isLoopback(configuration.host) else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "plain HTTP is served on loopback only: give --tls-cert and --tls-key to listen on "
                        + "\(configuration.host)"
                )
            }
            server = .http1(configuration: http1)
        }
        let app = Application(
            router: router,
            server: server,
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: "shoal-relay",
                availableConnectionsDelegate: CountedConnections(
                    maximum: maximumConnections,
                    gauge: metrics.openConnections
                )
            ),
            onServerRunning: { channel in await onListening(channel.localAddress?.port ?? 0) },
            logger: configuration.logger
        )
        // Uploads that never completed are swept now and then; pulls waiting at shutdown are answered at once.
        let sweeper = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(600))
                let hourAgo = Int64(Date().timeIntervalSince1970 * 1000) - 3_600_000
                if let swept = try? await storage.sweep(before: hourAgo), swept > 0 {
                    configuration.logger.info("dropped chunks of uploads that never completed", metadata: ["chunks": "\(swept)"])
                }
                if let dropped = try? await storage.retain(configuration.retention), dropped > 0 {
                    configuration.logger.info("dropped change sets snapshots cover, past the retention", metadata: ["ranges": "\(dropped)"])
                }
            }
        }
        // Other instances sharing the storage announce what they store: their uploads wake pulls waiting here.
        let watcher = Task { await storage.watch { cluster in await notifier.bump(cluster) } }
        let prober = Task { await health.probe { () throws(ShoalError) in try await storage.ping() } }
        defer {
            sweeper.cancel()
            watcher.cancel()
            prober.cancel()
        }
        try await withGracefulShutdownHandler {
            try await app.runService()
        } onGracefulShutdown: {
            Task { await notifier.shutDown() }
        }
    }

    /// Every route the relay answers; ``RelayOpenAPI`` describes each one.
    func makeRouter() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: RelayMetricsMiddleware(metrics: metrics))
        router.add(middleware: RelayBootMiddleware(boot: boot))
        if let registry = configuration.metrics {
            // No token, on purpose: see RelayServerConfiguration.metrics for who should reach it. It is an operator's
            // route, not the API's: the API description leaves it out.
            router.get("/metrics") { _, _ in
                await scrape(registry)
            }
        }
        router.get(RouterPath(RelayAPI.openAPIPath)) { _, _ in
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            return Response(status: .ok, headers: headers, body: ResponseBody(byteBuffer: Self.openAPIDocument))
        }
        router.get(RouterPath(RelayAPI.healthPath)) { _, _ in
            if let down = health.down {
                return Self.json(.serviceUnavailable, ["status": "storage_down", "storage": "down", "error": down])
            }
            return Self.json(.ok, ["status": "ok", "storage": "ok"])
        }
        router.get(RouterPath(RelayAPI.headsPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await heads(request) }
        }
        router.post(RouterPath(RelayAPI.changeSetsPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await upload(request, snapshot: 0) }
        }
        router.post(RouterPath(RelayAPI.snapshotsPath + "/:id")) { request, context in
            await respond { () throws(RelayFailure) in try await upload(request, snapshot: try Self.snapshotID(context)) }
        }
        router.post(RouterPath(RelayAPI.snapshotsPath + "/:id/complete")) { request, context in
            await respond { () throws(RelayFailure) in try await completeSnapshot(request, snapshot: try Self.snapshotID(context)) }
        }
        router.post(RouterPath(RelayAPI.pullPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await pull(request) }
        }
        router.post(RouterPath(RelayAPI.rotatePath)) { request, _ in
            await respond { () throws(RelayFailure) in try await rotate(request) }
        }
        router.post(RouterPath(RelayAPI.keysPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await registerKey(request) }
        }
        router.get(RouterPath(RelayAPI.grantsPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await grants(request) }
        }
        router.post(RouterPath(RelayAPI.grantsPath)) { request, _ in
            await respond { () throws(RelayFailure) in try await addGrants(request) }
        }
        return router
    }

    /// Every route the router answers, `METHOD /path` (the API description must name each).
    var routes: [String] { makeRouter().routes.map { "\($0.method.rawValue) \($0.path)" } }

    static let openAPIDocument = ByteBuffer(string: RelayOpenAPI.document)

    /// The metrics' text, the per-cluster figures brought up to date first.
    private func scrape(_ registry: PrometheusCollectorRegistry) async -> Response {
        // Read from the storage, so every instance reports every cluster's snapshot, whoever completed it.
        await metrics.refresh(now: Int64(Date().timeIntervalSince1970 * 1000)) { () throws(ShoalError) in
            let statistics = try await storage.statistics()
            for cluster in statistics {
                if let snapshot = try await storage.snapshotState(cluster: cluster.cluster).snapshot {
                    metrics.snapshotMade(cluster: cluster.cluster, atMilliseconds: snapshot.created)
                }
            }
            return statistics
        }
        var headers = HTTPFields()
        headers[.contentType] = "text/plain; version=0.0.4; charset=utf-8"
        let body = ResponseBody(byteBuffer: ByteBuffer(bytes: registry.emitToBuffer()))
        return Response(status: .ok, headers: headers, body: body)
    }

    /// Raises the soft limit of open files to the hard limit; returns the soft limit now in force.
    static func raiseOpenFilesLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return limit.rlim_cur > rlim_t(Int.max) ? Int.max : Int(limit.rlim_cur)
    }

    // MARK: Routes

    private func heads(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let heads = try await storageCall { () throws(ShoalError) in try await storage.heads(cluster: token.cluster) }
        let state = try await storageCall { () throws(ShoalError) in try await storage.snapshotState(cluster: token.cluster) }
        let snapshot = state.snapshot.map {
            RelaySnapshotInfo(id: "\($0.id)", vector: RelayAPI.json($0.vector), bytes: $0.bytes, createdMs: $0.created)
        }
        return Self.json(
            .ok,
            RelayHeads(heads: RelayAPI.json(heads), cluster: token.cluster, snapshot: snapshot, uncoveredBytes: state.uncoveredBytes)
        )
    }

    /// The snapshot id of a `/v1/snapshots/ID` path: 1 to 2^63 - 1.
    private static func snapshotID(_ context: BasicRequestContext) throws(RelayFailure) -> UInt64 {
        guard let text = context.parameters.get("id"), let id = UInt64(text), (1...UInt64(Int64.max)).contains(id) else {
            throw RelayFailure(.badRequest, "malformed", "a snapshot id is a number from 1 to 2^63 - 1")
        }
        return id
    }

    /// The key epoch an upload's body is authenticated with, once its authentication checks: only a holder of the
    /// epoch's secret can store.
    private func authenticateUpload(_ request: Request, token: RelayToken, body: [UInt8]) async throws(RelayFailure) -> UInt32 {
        guard let epochText = request.headers[Self.uploadEpochField], let epoch = UInt32(epochText),
            let authentication = request.headers[Self.uploadAuthField]
        else {
            throw RelayFailure(
                .forbidden, "bad_upload_auth", "an upload must name its key epoch and carry its authentication; nothing was stored"
            )
        }
        let (stored, newest) = try await storageCall { () throws(ShoalError) in
            try await storage.uploadKey(cluster: token.cluster, epoch: epoch)
        }
        guard epoch >= newest else {
            // A removed member still holds the keys of the epochs before its removal: they seal nothing new.
            var failure = RelayFailure(
                .forbidden,
                "epoch_retired",
                "key epoch \(epoch) of this cluster was retired when the key moved to epoch \(newest): seal with the "
                    + "newest epoch (members find their grant at \(RelayAPI.grantsPath)); nothing was stored"
            )
            failure.body.epoch = newest
            throw failure
        }
        guard let key = stored else {
            throw RelayFailure(
                .forbidden,
                "no_upload_key",
                "the relay holds no upload key for epoch \(epoch) of this cluster: register it (\(RelayAPI.keysPath)); nothing was stored"
            )
        }
        guard RelayAPI.checkUploadAuthentication(authentication, body: body, key: key) else {
            throw RelayFailure(
                .forbidden,
                "bad_upload_auth",
                "the upload is not authenticated with this cluster's key of epoch \(epoch): nothing was stored"
            )
        }
        return epoch
    }

    private func completeSnapshot(_ request: Request, snapshot: UInt64) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let body = try await collect(request, limit: 1024 * 1024)
        _ = try await authenticateUpload(request, token: token, body: body)
        let vector: VersionVector
        do {
            vector = try RelayAPI.vector(try JSONDecoder().decode(RelaySnapshotCompletion.self, from: Data(body)).vector)
        } catch let error as ShoalError {
            throw RelayFailure(.badRequest, "malformed", error.message)
        } catch {
            throw RelayFailure(.badRequest, "malformed", "the body is not valid JSON of the documented shape")
        }
        let outcome = try await storageCall { () throws(ShoalError) in
            try await storage.completeSnapshot(
                cluster: token.cluster,
                snapshot: snapshot,
                vector: vector,
                retention: configuration.retention
            )
        }
        switch outcome {
        case .completed(let dropped):
            configuration.logger.info(
                "snapshot completed",
                metadata: ["cluster": "\(token.cluster)", "snapshot": "\(snapshot)", "dropped_ranges": "\(dropped)"]
            )
            return Self.json(.ok, ["snapshot": "\(snapshot)", "droppedRanges": "\(dropped)"])
        case .incomplete(let why):
            throw RelayFailure(.conflict, "snapshot_incomplete", "snapshot \(snapshot) is not whole: \(why)")
        }
    }

    private func upload(_ request: Request, snapshot: UInt64) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let body = try await collect(request, limit: configuration.maximumRequestBytes)
        let envelopes: [RelayEnvelope]
        do {
            envelopes = try RelayEnvelopeList.decode(body, maximumEnvelopeBytes: configuration.maximumEnvelopeBytes)
        } catch where error.code == .frameTooLarge {
            throw RelayFailure.tooLarge(error.message, limit: configuration.maximumEnvelopeBytes)
        } catch {
            throw RelayFailure(.badRequest, "malformed", "\(error.message); nothing was stored")
        }
        let epoch = try await authenticateUpload(request, token: token, body: body)
        for envelope in envelopes where envelope.epoch != epoch {
            throw RelayFailure(
                .badRequest, "malformed", "a change set sealed with epoch \(envelope.epoch) in an upload of epoch \(epoch)"
            )
        }
        for envelope in envelopes where envelope.cluster != token.cluster {
            throw RelayFailure(
                .forbidden,
                "wrong_cluster",
                "a change set of cluster \(envelope.cluster.prefix(64)) was sent with a token of cluster "
                    + "\(token.cluster); nothing was stored"
            )
        }
        let pairs = envelopes.map { (envelope: $0, encoded: $0.encoded()) }
        let result = try await storageCall { () throws(ShoalError) in
            try await storage.store(cluster: token.cluster, snapshot: snapshot, envelopes: pairs, uploader: Self.uploader(request))
        }
        if result.stored > 0 && snapshot == 0 { await notifier.bump(token.cluster) }
        metrics.changeSetsIn.increment(by: pairs.count)
        metrics.bytesIn.increment(by: pairs.reduce(0) { $0 + $1.encoded.count })
        metrics.stored.increment(by: result.stored)
        return Self.json(.ok, result)
    }

    private func pull(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let body = try await collect(request, limit: 1024 * 1024)
        let pull: RelayPullRequest
        let vector: VersionVector
        var resume: [SiteID: (from: UInt64, index: UInt32)] = [:]
        var snapshotSites: Set<SiteID> = []
        do {
            pull = try JSONDecoder().decode(RelayPullRequest.self, from: Data(body))
            vector = try RelayAPI.vector(pull.vector)
            for point in pull.resume ?? [] {
                guard let site = SiteID(hex: point.site) else {
                    throw ShoalError(code: .malformedMessage, message: "resume names \"\(point.site.prefix(40))\", not a site id")
                }
                resume[site] = (point.from, point.index)
            }
            let named = pull.snapshotSites ?? []
            guard named.count <= RelayPullRequest.maximumSnapshotSites else {
                throw ShoalError(
                    code: .malformedMessage,
                    message: "snapshotSites names \(named.count) sites, more than the "
                        + "\(RelayPullRequest.maximumSnapshotSites) a pull may"
                )
            }
            for name in named {
                guard let site = SiteID(hex: name) else {
                    throw ShoalError(code: .malformedMessage, message: "snapshotSites names \"\(name.prefix(40))\", not a site id")
                }
                snapshotSites.insert(site)
            }
        } catch let error as ShoalError {
            throw RelayFailure(.badRequest, "malformed", error.message)
        } catch {
            throw RelayFailure(.badRequest, "malformed", "the pull request is not valid JSON of the documented shape")
        }
        let budget = min(max(pull.maximumBytes ?? RelayAPI.defaultPageBytes, 64 * 1024), configuration.maximumPageBytes)
        let wait = min(max(pull.waitMilliseconds ?? 0, 0), RelayAPI.maximumWaitMilliseconds)
        var waited = false
        let (page, hold) = try await longPoll(cluster: token.cluster, milliseconds: wait) { () throws(RelayFailure) in
            // Woken after a wait: the token may have been revoked (or retired) meanwhile, and then gets nothing more.
            if waited { _ = try await authorize(request, counting: false) }
            waited = true
            // The page's budget is held before it is read, and what it carries until its answer is written out.
            guard let hold = await pageMemory.hold(budget, waitingAtMost: .seconds(configuration.pageMemoryWaitSeconds))
            else {
                throw RelayFailure(
                    .serviceUnavailable,
                    "busy",
                    "the relay is sending as many pages as its memory allows (\(pageMemory.limit) bytes); try again",
                    limit: pageMemory.limit,
                    retryAfter: 1
                )
            }
            let page = try await storageCall { () throws(ShoalError) in
                try await storage.page(
                    cluster: token.cluster,
                    vector: vector,
                    resume: resume,
                    snapshotSites: snapshotSites,
                    maximumBytes: budget,
                    uploader: Self.uploader(request)
                )
            }
            hold.resize(to: page.envelopes.reduce(0) { $0 + $1.count })
            return (page, hold)
        } isEmpty: { $0.0.envelopes.isEmpty }
        metrics.changeSetsOut.increment(by: page.envelopes.count)
        metrics.bytesOut.increment(by: page.envelopes.reduce(0) { $0 + $1.count })
        var headers = HTTPFields()
        headers[.contentType] = RelayAPI.envelopeContentType
        headers[Self.moreField] = page.more ? "1" : "0"
        let envelopes = page.envelopes
        let sliced = ResponseBody(contentLength: envelopes.reduce(0) { $0 + 4 + $1.count }) { writer in
            // Copied out a slice at a time, each once the connection took the ones before: a connection holds at most
            // a slice or two beyond the page (which its hold counts), and one that takes nothing is closed after
            // writeStallSeconds (RelayWriteStallHandler). The page's memory is given back when the answer is written.
            let sliceBytes = RelayServerConfiguration.answerSliceBytes
            var slice = ByteBuffer()
            slice.reserveCapacity(sliceBytes + 4)
            for envelope in envelopes {
                slice.writeInteger(UInt32(envelope.count))
                var offset = 0
                while offset < envelope.count {
                    let end = min(envelope.count, offset + max(0, sliceBytes - slice.readableBytes))
                    slice.writeBytes(envelope[offset..<end])
                    offset = end
                    if slice.readableBytes >= sliceBytes {
                        try await writer.write(slice)
                        slice = ByteBuffer()
                        slice.reserveCapacity(sliceBytes + 4)
                    }
                }
            }
            if slice.readableBytes > 0 { try await writer.write(slice) }
            try await writer.finish(nil)
            withExtendedLifetime(hold) {}
        }
        return Response(status: .ok, headers: headers, body: sliced)
    }

    /// Answers `query` at once when it finds something; otherwise waits (long-poll) until an upload, a rotation or new
    /// grants of `cluster` land, or `milliseconds` pass, and asks again. The generation is read before each query, so
    /// what lands between the query and the wait is never missed.
    private func longPoll<T>(
        cluster: String,
        milliseconds: Int,
        _ query: () async throws(RelayFailure) -> T,
        isEmpty: (T) -> Bool
    ) async throws(RelayFailure) -> T {
        let deadline = ContinuousClock.now + .milliseconds(milliseconds)
        while true {
            let generation = await notifier.generation(cluster)
            let answer = try await query()
            let remaining = deadline - ContinuousClock.now
            if !isEmpty(answer) || remaining <= .zero || Task.isCancelled { return answer }
            // The relay is stopping: answer now (asking again at once would spin until the deadline).
            guard await notifier.wait(cluster, after: generation, for: remaining) else { return answer }
        }
    }

    static let moreField = HTTPField.Name(RelayAPI.moreHeader)!
    static let uploaderField = HTTPField.Name(RelayAPI.uploaderHeader)!
    static let uploadEpochField = HTTPField.Name(RelayAPI.uploadEpochHeader)!
    static let uploadAuthField = HTTPField.Name(RelayAPI.uploadAuthHeader)!

    private func registerKey(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let posted: RelayUploadKey = try await decodeBody(request)
        guard let key = Data(base64Encoded: posted.key), key.count == 32 else {
            throw RelayFailure(.badRequest, "malformed", "an upload key is 32 bytes, base64")
        }
        let newest = try await storageCall { () throws(ShoalError) in
            try await storage.uploadKey(cluster: token.cluster, epoch: posted.epoch).newest
        }
        guard posted.epoch >= newest else {
            var failure = RelayFailure(
                .forbidden,
                "epoch_retired",
                "key epoch \(posted.epoch) of this cluster was retired when the key moved to epoch \(newest); nothing was stored"
            )
            failure.body.epoch = newest
            throw failure
        }
        let stored = try await storageCall { () throws(ShoalError) in
            try await storage.registerUploadKey(cluster: token.cluster, epoch: posted.epoch, key: Array(key))
        }
        guard stored else {
            throw RelayFailure(
                .conflict,
                "key_conflict",
                "the relay holds another upload key for epoch \(posted.epoch) of this cluster: someone with this "
                    + "cluster's token but not its secret registered one first; its operator must remove it"
            )
        }
        return Self.json(.ok, ["epoch": posted.epoch])
    }

    /// The uploader id a request names (at most 64 characters), if any.
    static func uploader(_ request: Request) -> String? {
        request.headers[uploaderField].flatMap { $0.isEmpty || $0.utf8.count > 64 ? nil : $0 }
    }

    private func rotate(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let rotation: RelayRotation = try await decodeBody(request)
        guard rotation.epoch >= 1, rotation.tokenHash.utf8.count == 64,
            rotation.tokenHash.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) })
        else {
            throw RelayFailure(.badRequest, "malformed", "a rotation needs an epoch from 1 and a token hash of 64 hex digits")
        }
        try Self.check(rotation.grants)
        let uploadKey = rotation.uploadKey.flatMap { Data(base64Encoded: $0) }.map { Array($0) }
        guard uploadKey?.count ?? 32 == 32 else {
            throw RelayFailure(.badRequest, "malformed", "an upload key is 32 bytes, base64")
        }
        let outcome = try await storageCall { () throws(ShoalError) in
            try await storage.rotate(
                cluster: token.cluster,
                epoch: rotation.epoch,
                tokenHash: rotation.tokenHash,
                grants: rotation.grants,
                uploadKey: uploadKey
            )
        }
        switch outcome {
        case .rotated:
            await notifier.bump(token.cluster)
            configuration.logger.info(
                "key epoch rotated; the cluster's earlier tokens are retired",
                metadata: ["cluster": "\(token.cluster)", "epoch": "\(rotation.epoch)"]
            )
            return Self.json(.ok, ["epoch": rotation.epoch])
        case .taken(let current):
            var failure = RelayFailure(.conflict, "epoch_taken", "the cluster's newest key epoch is \(current)")
            failure.body.epoch = current
            throw failure
        }
    }

    private func grants(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request, allowRotated: true)
        let parameters = request.uri.queryParameters
        let after = parameters.get("after").flatMap { UInt32($0) } ?? 0
        let recipient = parameters.get("recipient").map { String(describing: $0) }
        let wait = min(max(parameters.get("wait").flatMap { Int($0) } ?? 0, 0), RelayAPI.maximumWaitMilliseconds)
        // Nothing for this recipient yet: wait for a rotation or new grants, not for the node's next retry.
        let grants = try await longPoll(cluster: token.cluster, milliseconds: wait) { () throws(RelayFailure) in
            var grants = try await storageCall { () throws(ShoalError) in
                try await storage.grants(cluster: token.cluster, after: after)
            }
            if let recipient { grants.grants.removeAll { $0.recipient != recipient } }
            return grants
        } isEmpty: { $0.grants.isEmpty }
        return Self.json(.ok, grants)
    }

    private func addGrants(_ request: Request) async throws(RelayFailure) -> Response {
        let token = try await authorize(request)
        let posted: RelayGrants = try await decodeBody(request)
        try Self.check(posted.grants)
        let stored = try await storageCall { () throws(ShoalError) in
            try await storage.addGrants(cluster: token.cluster, grants: posted.grants)
        }
        if stored > 0 { await notifier.bump(token.cluster) }
        return Self.json(.ok, ["stored": stored])
    }

    private static func check(_ grants: [RelayGrant]) throws(RelayFailure) {
        guard grants.count <= 10_000,
            grants.allSatisfy({ $0.body.utf8.count <= 64 * 1024 && !$0.recipient.isEmpty && $0.recipient.utf8.count <= 128 })
        else {
            throw RelayFailure(.badRequest, "malformed", "at most 10,000 grants, each of at most 64 KiB, each naming its recipient")
        }
    }

    private func decodeBody<T: Decodable>(_ request: Request) async throws(RelayFailure) -> T {
        let body = try await collect(request, limit: configuration.maximumRequestBytes)
        do {
            return try JSONDecoder().decode(T.self, from: Data(body))
        } catch {
            throw RelayFailure(.badRequest, "malformed", "the body is not valid JSON of the documented shape")
        }
    }

    // MARK: Helpers

    /// The token `request` carries, if it is valid; `counting`: the request counts against the token's rate limit (a
    /// long-poll checking its token again after a wait does not).
    private func authorize(
        _ request: Request,
        allowRotated: Bool = false,
        counting: Bool = true
    ) async throws(RelayFailure) -> RelayToken {
        guard let header = request.headers[.authorization], header.lowercased().hasPrefix("bearer ") else {
            throw RelayFailure(.unauthorized, "unauthorized", "no bearer token: send Authorization: Bearer TOKEN")
        }
        let token = String(header.dropFirst("bearer ".count)).trimmingCharacters(in: .whitespaces)
        let hash = RelayTokens.hash(token)
        guard let record = try await storageCall({ () throws(ShoalError) in try await storage.token(hash: hash) }) else {
            throw RelayFailure(.unauthorized, "unauthorized", "unknown token")
        }
        if record.revoked != nil {
            guard let epoch = record.rotatedAtEpoch else {
                throw RelayFailure(.unauthorized, "unauthorized", "this token was revoked")
            }
            guard allowRotated else {
                throw RelayFailure(
                    .unauthorized,
                    "token_rotated",
                    "this token was retired when the cluster's key moved to epoch \(epoch); members find the new one in "
                        + "their grants (\(RelayAPI.grantsPath))"
                )
            }
        }
        if counting, let retry = limiter.admit(hash) {
            throw RelayFailure.rateLimited(limit: configuration.requestsPerSecond, retryAfter: retry)
        }
        return record
    }

    private func collect(_ request: Request, limit: Int) async throws(RelayFailure) -> [UInt8] {
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > limit {
            throw RelayFailure.tooLarge("a request body of \(length) bytes is over the limit of \(limit)", limit: limit)
        }
        do {
            let buffer = try await request.body.collect(upTo: limit)
            return Array(buffer.readableBytesView)
        } catch is NIOTooManyBytesError {
            throw RelayFailure.tooLarge("the request body is over the limit of \(limit) bytes", limit: limit)
        } catch {
            throw RelayFailure(.badRequest, "malformed", "the request body could not be read")
        }
    }

    private func storageCall<T>(_ body: () async throws(ShoalError) -> T) async throws(RelayFailure) -> T {
        // While the storage does not answer, a request is refused at once rather than left waiting for it.
        if let down = health.down { throw Self.storageUnavailable(down) }
        do {
            return try await body()
        } catch {
            configuration.logger.error("storage failed", metadata: ["error": "\(error.message)"])
            if let down = health.down { throw Self.storageUnavailable(down) }
            throw RelayFailure(.internalServerError, "internal", "the relay's storage failed; try again later")
        }
    }

    private static func storageUnavailable(_ why: String) -> RelayFailure {
        var failure = RelayFailure(
            .serviceUnavailable,
            "storage_unavailable",
            "the relay's storage is down (\(why.prefix(200))); try again after Retry-After"
        )
        failure.body.retryAfterSeconds = 5
        return failure
    }

    private func respond(_ body: () async throws(RelayFailure) -> Response) async -> Response {
        do {
            return try await body()
        } catch {
            var response = Self.json(error.status, error.body)
            if let retry = error.body.retryAfterSeconds { response.headers[.retryAfter] = "\(retry)" }
            return response
        }
    }

    static func json(_ status: HTTPResponse.Status, _ value: some Encodable) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = (try? encoder.encode(value)) ?? Data("{}".utf8)
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: ResponseBody(byteBuffer: ByteBuffer(bytes: data)))
    }
}

/// A refusal: its status and its JSON body.
struct RelayFailure: Error {
    var status: HTTPResponse.Status
    var body: RelayErrorBody

    init(_ status: HTTPResponse.Status, _ code: String, _ message: String, limit: Int? = nil, retryAfter: Int? = nil) {
        self.status = status
        body = RelayErrorBody(error: code, message: message, limit: limit, retryAfterSeconds: retryAfter)
    }

    static func tooLarge(_ message: String, limit: Int) -> RelayFailure {
        RelayFailure(.contentTooLarge, "too_large", message, limit: limit)
    }

    static func rateLimited(limit: Int, retryAfter: Int) -> RelayFailure {
        RelayFailure(
            .tooManyRequests,
            "rate_limited",
            "more than \(limit) requests a second with this token; try again in \(retryAfter) s",
            limit: limit,
            retryAfter: retryAfter
        )
    }
}
