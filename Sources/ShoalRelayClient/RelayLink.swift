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

/// How a node uses a relay.
public struct RelayClientConfiguration: Sendable {
    /// The relay's base URL: `https://HOST[:PORT]`, or `http://` to a loopback address.
    public var url: String
    /// Other instances of the same relay (sharing its storage), tried in turn when the one in use does not answer: a
    /// pull resumes on the next at once, from the node's version vector.
    public var otherURLs: [String] = []
    /// The bearer token (`shoal relay token create`).
    public var token: String
    /// The node's cluster id (what the token was made for).
    public var clusterID: String
    /// The cluster secret: epoch 0 of the sealing keys.
    public var clusterSecret: [UInt8]
    /// The node's identity, to open the key grants of later epochs and to sign new ones: without it the node neither
    /// rotates the key when a member is removed nor follows another member's rotation.
    public var identity: NodeIdentity?
    /// The cluster's roster as it stands (who gets grants, who was removed).
    public var roster: (@Sendable () -> Roster)?
    /// Where the epochs learnt and the newest token are kept (``RelayKeyring``); nil: in memory only.
    public var keyringPath: String?
    /// A PEM file of the CA (or the self-signed certificate) to trust instead of the system's roots.
    public var caCertificatePath: String?
    /// The byte budget asked of each pull.
    public var pageBytes = RelayAPI.defaultPageBytes
    /// The largest plaintext sealed into one envelope.
    public var pieceBytes = 1024 * 1024
    /// About how many bytes each upload request carries.
    public var requestBytes = 8 * 1024 * 1024
    /// When the change sets the relay's snapshot does not cover grow beyond this many bytes (and beyond the snapshot
    /// itself), a node that holds everything the relay holds uploads a new snapshot; the relay then drops what it
    /// covers, after its retention.
    public var snapshotMinimumBytes: Int64 = 8 * 1024 * 1024
    /// How long a pull waits at the relay for new change sets (long-poll).
    public var waitMilliseconds = 25_000
    /// Retries after failures: exponential with jitter between these bounds.
    public var initialBackoffMilliseconds: UInt64 = 250
    /// The longest wait between retries (before jitter).
    public var maximumBackoffMilliseconds: UInt64 = 30_000
    /// After the relay refused the token, the node waits at least this long before trying again.
    public var unauthorizedBackoffMilliseconds: UInt64 = 60_000
    /// Where the link logs.
    public var logger: Logger
    /// The wall clock, for the status's times.
    public var clock: any WallClock = SystemWallClock()

    /// A configuration with the default sizes and backoff.
    public init(url: String, token: String, clusterID: String, clusterSecret: [UInt8], logger: Logger) {
        self.url = url
        self.token = token
        self.clusterID = clusterID
        self.clusterSecret = clusterSecret
        self.logger = logger
    }
}

/// A node's link to a relay: uploads every transaction the relay lacks (the node's own and those it learnt from LAN
/// peers), pulls what the node lacks with a long-poll, and applies it like changes from a peer. It never blocks the
/// node: a relay that does not answer is retried with backoff and jitter while local writes and LAN sync go on.
public final class RelayLink: Service, Sendable {
    /// How the link works.
    public let configuration: RelayClientConfiguration
    let node: SyncNode
    /// The relay's instances; requests go to the one `instance` names.
    private let bases: [String]
    /// The instance in use, and how many instances in a row failed to answer since one last did.
    private let instance = Mutex<(index: Int, failures: Int)>((0, 0))
    private let state: Mutex<RelayStatus>
    private let sizes: Mutex<(piece: Int, request: Int)>
    private let lastReported = Mutex<String?>(nil)
    /// This process's uploader id (``RelayAPI/uploaderHeader``).
    private let uploaderID = String(UInt64.random(in: 1...UInt64.max), radix: 16)
    /// The keys and the token in use: they change when the key rotates.
    private let credentials: Mutex<Credentials>
    /// The token the relay said a rotation retired: until another is in use, the grants are fetched before the next
    /// request. (A request that left with the old token may come back refused after the new one was adopted.)
    private let grantsNeeded = Mutex<String?>(nil)
    /// What the relay's snapshot leaves uncovered (as last read, plus what this node uploaded since), the snapshot's
    /// size, and when this node last tried to upload one.
    private let snapshotState = Mutex<(uncovered: Int64, snapshotBytes: Int64, triedMs: UInt64?)>((0, 0, nil))
    /// The roster members whose grants were last checked (members that join after a rotation get grants).
    private let grantedMembers = Mutex<Set<NodeID>?>(nil)
    /// When this node last checked that the relay holds every key epoch it holds (monotonic milliseconds).
    private let epochsChecked = Mutex<UInt64?>(nil)
    /// The relay's heads as last read, for the relay's staleness.
    private let knownHeads = Mutex<VersionVector?>(nil)
    private let metrics = RelayLinkMetrics()

    private struct Credentials {
        var keyring: RelayKeyring
        var seal: RelaySeal
        var token: String
    }
    /// What happens, as it happens.
    public let events: AsyncStream<RelayEvent>
    private let eventSink: AsyncStream<RelayEvent>.Continuation

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
        credentials = Mutex(
            Credentials(
                keyring: keyring,
                seal: RelaySeal(secrets: keyring.secrets(clusterSecret: configuration.clusterSecret), epoch: keyring.newest),
                token: keyring.token ?? configuration.token
            )
        )
        var status = RelayStatus(url: bases[0])
        status.epoch = keyring.newest
        state = Mutex(status)
        sizes = Mutex((configuration.pieceBytes, configuration.requestBytes))
        (events, eventSink) = AsyncStream.makeStream(of: RelayEvent.self, bufferingPolicy: .bufferingNewest(1_000))
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
    public var status: RelayStatus { state.withLock { $0 } }

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
        do {
            try await cancelWhenGracefulShutdown {
                try await withThrowingDiscardingTaskGroup { group in
                    group.addTask { try await self.pushLoop(client) }
                    group.addTask { try await self.pullLoop(client) }
                    group.addTask { try await self.sampleMetrics() }
                }
            }
        } catch {
            // Cancelled: the node is stopping.
        }
        eventSink.finish()
        try? await client.shutdown()
    }

    // MARK: Upload

    private func pushLoop(_ client: HTTPClient) async throws {
        var signals = await node.changeSignals().makeAsyncIterator()
        var heads: VersionVector?
        var lastHeads: VersionVector?
        var backoff = Backoff(
            initialMilliseconds: configuration.initialBackoffMilliseconds,
            maximumMilliseconds: configuration.maximumBackoffMilliseconds
        )
        var due = true
        var raced = 0
        var headsFetched: UInt64 = 0
        while !Task.isCancelled {
            if !due {
                guard await signals.next() != nil else { return }
            }
            due = false
            do throws(RelayCallError) {
                try await refreshGrantsIfNeeded(client)
                try await rotateIfNeeded(client)
                // The heads are read again now and then, not only after a failure: another uploader, or an
                // operator's repair, may have moved them.
                let now = configuration.clock.monotonicMilliseconds()
                if heads == nil || now - headsFetched > 30_000 {
                    heads = try await fetchHeads(client)
                    headsFetched = now
                }
                var known = heads!
                let finished = try await pushOnce(client, heads: &known)
                heads = known
                lastHeads = known
                if finished {
                    raced = 0
                    backoff.reset()
                    if snapshotDue(held: try await local { () throws(ShoalError) in try await node.versionVector() }, heads: known) {
                        // Read again first: another node may have just uploaded one.
                        heads = try await fetchHeads(client)
                        headsFetched = now
                        if snapshotDue(held: try await local { () throws(ShoalError) in try await node.versionVector() }, heads: heads!) {
                            try await uploadSnapshot(client)
                        }
                    }
                } else {
                    // Another node moved the relay's heads while this one uploaded: cut again from the new heads,
                    // at once the first time, then with backoff.
                    raced += 1
                    due = true
                    if raced > 1 { try? await Task.sleep(for: .milliseconds(backoff.next())) }
                }
            } catch {
                if case .cancelled = error {} else { metrics.pushFailed.increment() }
                // What the relay lacks keeps growing while it does not answer: counted against the last heads known.
                if let lastHeads, let held = try? await node.versionVector() { noteLacking(held: held, heads: lastHeads) }
                heads = nil
                due = true
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    private func fetchHeads(_ client: HTTPClient) async throws(RelayCallError) -> VersionVector {
        let (body, _) = try await call(client, .GET, RelayAPI.headsPath, body: nil, timeout: .seconds(30))
        let heads: RelayHeads = try decodeJSON(body)
        snapshotState.withLock { state in
            state.uncovered = heads.uncoveredBytes ?? 0
            state.snapshotBytes = heads.snapshot?.bytes ?? 0
        }
        if let cluster = heads.cluster, cluster != configuration.clusterID {
            throw RelayCallError.unauthorized(
                "the token is for cluster \(cluster.prefix(64)), and this node belongs to \(configuration.clusterID)",
                token: nil
            )
        }
        let vector: VersionVector
        do {
            vector = try RelayAPI.vector(heads.heads)
        } catch {
            throw RelayCallError.malformed("the relay's heads: \(error.message)")
        }
        // Nobody holds more of this node's own site than the node itself: a head beyond it is a forged or corrupt
        // range, which hides this node's next transactions from the relay until its operator removes it.
        let own = node.siteID
        let held = try await local { () throws(ShoalError) in try await node.versionVector() }
        if vector[own] > held[own] {
            note(
                "the relay claims transactions \(held[own] + 1)...\(vector[own]) of this node's own site, which it never "
                    + "made: a forged or corrupt range; this node's later writes cannot reach the relay until its "
                    + "operator removes that range"
            )
        }
        return vector
    }

    /// Uploads every transaction the relay's `heads` lack; `false` when the relay's heads moved under it.
    private func pushOnce(_ client: HTTPClient, heads: inout VersionVector) async throws(RelayCallError) -> Bool {
        let held = try await local { () throws(ShoalError) in try await node.versionVector() }
        noteLacking(held: held, heads: heads)
        guard held.entries.contains(where: { $0.value > heads[$0.key] }) else { return true }
        let started = ContinuousClock.now
        let (pieceBytes, requestBytes) = sizes.withLock { $0 }
        let cursor = try await local { () throws(ShoalError) in try await node.openChangeCursor(since: heads) }
        var chunker = RelayChunker(
            cluster: configuration.clusterID,
            seal: credentials.withLock { $0.seal },
            heads: heads,
            pieceBytes: pieceBytes
        )
        var outgoing: [RelayEnvelope] = []
        var outgoingBytes = 0
        var finished = true
        do throws(RelayCallError) {
            cutting: while let batch = try await local({ () throws(ShoalError) in
                try await node.nextChangeBatch(cursor, maxChanges: 20_000, maxBytes: pieceBytes)
            }) {
                for envelope in try localNow({ () throws(ShoalError) in try chunker.envelopes(for: batch) }) {
                    outgoing.append(envelope)
                    outgoingBytes += envelope.encodedCount
                    if outgoingBytes >= requestBytes {
                        guard try await send(client, &outgoing, heads: &heads) else {
                            finished = false
                            break cutting
                        }
                        outgoingBytes = 0
                    }
                }
            }
            if finished && !outgoing.isEmpty { finished = try await send(client, &outgoing, heads: &heads) }
        } catch {
            await node.closeChangeCursor(cursor)
            throw error
        }
        await node.closeChangeCursor(cursor)
        noteLacking(held: try await local { () throws(ShoalError) in try await node.versionVector() }, heads: heads)
        metrics.pushOK.increment()
        metrics.pushTime.record(duration: ContinuousClock.now - started)
        return finished
    }

    /// Posts `body` to `path` authenticated with `epoch`'s upload key, so the relay stores only what a holder of the
    /// secret sent; registers the key first when the relay does not know it yet.
    private func postAuthenticated(
        _ client: HTTPClient,
        _ path: String,
        body: [UInt8],
        contentType: String,
        epoch: UInt32
    ) async throws(RelayCallError) -> [UInt8] {
        let seal = credentials.withLock { $0.seal }
        guard let authentication = seal.authenticate(body, epoch: epoch), let uploadKey = seal.uploadKey(epoch) else {
            throw RelayCallError.local(ShoalError(code: .sealBroken, message: "no upload key for epoch \(epoch)"))
        }
        let headers = [(RelayAPI.uploadEpochHeader, "\(epoch)"), (RelayAPI.uploadAuthHeader, authentication)]
        do {
            return try await call(client, .POST, path, body: body, contentType: contentType, headers: headers, timeout: .seconds(120)).body
        } catch {
            guard case .noUploadKey = error else { throw error }
            // The relay does not know this epoch's upload key yet (a new relay, or the cluster's first upload).
            let key = RelayUploadKey(epoch: epoch, key: Data(uploadKey).base64EncodedString())
            do {
                _ = try await call(
                    client, .POST, RelayAPI.keysPath, body: Array((try? JSONEncoder().encode(key)) ?? Data()), timeout: .seconds(30)
                )
            } catch {
                guard case .conflict(_, let why) = error else { throw error }
                // The relay holds another key for this epoch: see the 403 above.
                throw RelayCallError.epochRetired(why, token: credentials.withLock { $0.token })
            }
            return try await call(client, .POST, path, body: body, contentType: contentType, headers: headers, timeout: .seconds(120)).body
        }
    }

    /// Sends `envelopes` (and empties it) to the change log, or to snapshot `snapshot`; `false` when some were refused
    /// because the relay's heads moved.
    private func send(
        _ client: HTTPClient,
        _ envelopes: inout [RelayEnvelope],
        heads: inout VersionVector,
        snapshot: UInt64? = nil
    ) async throws(RelayCallError) -> Bool {
        let body = RelayEnvelopeList.encode(envelopes)
        let count = envelopes.count
        let epoch = envelopes.first?.epoch ?? 0
        envelopes = []
        let path = snapshot.map { "\(RelayAPI.snapshotsPath)/\($0)" } ?? RelayAPI.changeSetsPath
        let answer = try await postAuthenticated(client, path, body: body, contentType: RelayAPI.envelopeContentType, epoch: epoch)
        let result: RelayUploadResult = try decodeJSON(answer)
        if snapshot == nil { snapshotState.withLock { $0.uncovered += Int64(body.count) } }
        do {
            heads.merge(try RelayAPI.vector(result.heads))
        } catch {
            throw RelayCallError.malformed("the relay's heads: \(error.message)")
        }
        let now = configuration.clock.nowMilliseconds()
        state.withLock { status in
            status.lastPushMs = now
            status.uploaded += UInt64(result.stored)
        }
        if result.stored > 0 { eventSink.yield(.uploaded(chunks: result.stored)) }
        configuration.logger.debug(
            "uploaded to the relay",
            metadata: ["sent": "\(count)", "stored": "\(result.stored)", "gaps": "\(result.gaps)"]
        )
        return result.gaps == 0
    }

    /// Whether this node should upload a snapshot now: it holds exactly what the relay holds (a node still catching up
    /// would cover less than the snapshot it replaces), the change sets the relay's snapshot leaves uncovered outgrew
    /// both that snapshot and the minimum, and no attempt of its failed in the last minute.
    private func snapshotDue(held: VersionVector, heads: VersionVector) -> Bool {
        guard held.entries.allSatisfy({ $0.value <= heads[$0.key] }), heads.entries.allSatisfy({ $0.value <= held[$0.key] })
        else { return false }
        let now = configuration.clock.nowMilliseconds()
        return snapshotState.withLock { state in
            guard state.uncovered >= max(configuration.snapshotMinimumBytes, state.snapshotBytes) else { return false }
            if let tried = state.triedMs, now < tried + 60_000 { return false }
            return true
        }
    }

    /// Uploads a snapshot: the node's whole merged state, as a change stream from the empty vector cut in ranges like
    /// any upload, into a snapshot of a new id; then tells the relay it is whole and what it covers.
    private func uploadSnapshot(_ client: HTTPClient) async throws(RelayCallError) {
        snapshotState.withLock { $0.triedMs = configuration.clock.nowMilliseconds() }
        let id = UInt64.random(in: 1...UInt64(Int64.max))
        let (pieceBytes, requestBytes) = sizes.withLock { $0 }
        let cursor = try await local { () throws(ShoalError) in try await node.openChangeCursor(since: VersionVector()) }
        let seal = credentials.withLock { $0.seal }
        var chunker = RelayChunker(cluster: configuration.clusterID, seal: seal, heads: VersionVector(), pieceBytes: pieceBytes)
        var outgoing: [RelayEnvelope] = []
        var outgoingBytes = 0
        var uploaded = VersionVector()
        do throws(RelayCallError) {
            while let batch = try await local({ () throws(ShoalError) in
                try await node.nextChangeBatch(cursor, maxChanges: 20_000, maxBytes: pieceBytes)
            }) {
                for envelope in try localNow({ () throws(ShoalError) in try chunker.envelopes(for: batch) }) {
                    outgoing.append(envelope)
                    outgoingBytes += envelope.encodedCount
                    if outgoingBytes >= requestBytes {
                        guard try await send(client, &outgoing, heads: &uploaded, snapshot: id) else {
                            throw RelayCallError.refused("the relay refused part of a snapshot")
                        }
                        outgoingBytes = 0
                    }
                }
            }
            if !outgoing.isEmpty, !(try await send(client, &outgoing, heads: &uploaded, snapshot: id)) {
                throw RelayCallError.refused("the relay refused part of a snapshot")
            }
        } catch {
            await node.closeChangeCursor(cursor)
            throw error
        }
        await node.closeChangeCursor(cursor)
        let covered = chunker.covered
        guard !covered.isEmpty else {
            snapshotState.withLock { $0.triedMs = nil }
            return
        }
        let completion = Array((try? JSONEncoder().encode(RelaySnapshotCompletion(vector: RelayAPI.json(covered)))) ?? Data())
        do throws(RelayCallError) {
            _ = try await postAuthenticated(
                client,
                "\(RelayAPI.snapshotsPath)/\(id)/complete",
                body: completion,
                contentType: "application/json",
                epoch: seal.epoch
            )
        } catch {
            if case .conflict = error {
                // Another node's snapshot completed meanwhile and replaced this one: nothing failed, so the next
                // attempt comes in about 10 s rather than a minute.
                let soon = configuration.clock.nowMilliseconds() &- 50_000
                snapshotState.withLock { $0.triedMs = soon }
            }
            throw error
        }
        let now = configuration.clock.nowMilliseconds()
        state.withLock { $0.lastSnapshotMs = now }
        snapshotState.withLock { state in
            state.uncovered = 0
            state.triedMs = nil
        }
        configuration.logger.info("uploaded a snapshot", metadata: ["snapshot": "\(id)"])
        eventSink.yield(.snapshotted)
    }

    private func noteLacking(held: VersionVector, heads: VersionVector) {
        knownHeads.withLock { $0 = heads }
        var lacking: UInt64 = 0
        for (site, seq) in held.entries where seq > heads[site] { lacking += seq - heads[site] }
        if heads[node.siteID] > held[node.siteID] { lacking += 1 }  // see fetchHeads: it cannot be trusted
        let now = configuration.clock.nowMilliseconds()
        state.withLock { status in
            status.lacking = lacking
            if lacking == 0 {
                status.lackingSinceMs = nil
            } else if status.lackingSinceMs == nil {
                status.lackingSinceMs = now
            }
        }
    }

    /// Updates the relay's lacking and staleness gauges as often as the node samples its own (neither is known
    /// before the relay's heads were first read).
    private func sampleMetrics() async throws {
        let interval = await node.configuration.metricsIntervalMilliseconds
        guard interval > 0 else { return }
        while !Task.isCancelled {
            if let heads = knownHeads.withLock({ $0 }) {
                metrics.lackingGauge.record(status.lacking ?? 0)
                metrics.stalenessGauge.record(Double(await node.ageOfOldestChangeLacking(in: heads)) / 1000)
            }
            try await Task.sleep(for: .milliseconds(interval))
        }
    }

    // MARK: Pull

    /// How long a site whose range could not be used is left aside before it is tried again.
    static let blockedSiteMilliseconds: UInt64 = 60_000

    /// Pulls pages and carries out what the pull session decides (``RelayPullSession``): the session checks each chunk,
    /// the link opens it with the seal and applies what the session hands back.
    private func pullLoop(_ client: HTTPClient) async throws {
        var session = RelayPullSession(
            site: node.siteID,
            cluster: configuration.clusterID,
            backoff: Backoff(
                initialMilliseconds: configuration.initialBackoffMilliseconds,
                maximumMilliseconds: configuration.maximumBackoffMilliseconds
            ),
            blockMilliseconds: Self.blockedSiteMilliseconds
        )
        var backoff = Backoff(
            initialMilliseconds: configuration.initialBackoffMilliseconds,
            maximumMilliseconds: configuration.maximumBackoffMilliseconds
        )
        while !Task.isCancelled {
            do throws(RelayCallError) {
                try await refreshGrantsIfNeeded(client)
                let held = try await local { () throws(ShoalError) in try await node.versionVector() }
                let request = session.request(
                    held: held,
                    now: configuration.clock.nowMilliseconds(),
                    wait: configuration.waitMilliseconds,
                    maximumBytes: configuration.pageBytes
                )
                let body = Array((try? JSONEncoder().encode(request)) ?? Data())
                let (answer, _) = try await call(
                    client,
                    .POST,
                    RelayAPI.pullPath,
                    body: body,
                    contentType: "application/json",
                    timeout: .milliseconds(Int64(configuration.waitMilliseconds) + 60_000)
                )
                let entries: [RelayEnvelopeList.Entry]
                do {
                    entries = try RelayEnvelopeList.decodeEntries(answer, maximumEnvelopeBytes: 64 * 1024 * 1024)
                } catch {
                    throw RelayCallError.malformed("a page from the relay: \(error.message)")
                }
                var applied = 0
                for entry in entries {
                    switch entry {
                    case .envelope(let envelope):
                        applied += try await receive(envelope, &session, client)
                    case .undecodable(let site, let error):
                        session.undecodable(site: site, error, now: configuration.clock.nowMilliseconds())
                    }
                }
                if let (claims, proof) = session.readyClaims() {
                    let result = try await local { () throws(ShoalError) in
                        try await node.applyReceived(claims, received: proof)
                    }
                    session.held(result.versionVector)
                }
                for problem in session.problems { note(problem) }
                let pulled = configuration.clock.nowMilliseconds()
                state.withLock { status in
                    status.lastPullMs = pulled
                    status.received += UInt64(entries.count)
                    status.applied += UInt64(applied)
                }
                if applied > 0 { eventSink.yield(.applied(changes: applied)) }
                metrics.pullOK.increment()
                metrics.applied.increment(by: applied)
                backoff.reset()
                if let wait = session.pageEnded() {
                    do {
                        try await Task.sleep(for: .milliseconds(wait))
                    } catch {
                        throw RelayCallError.cancelled
                    }
                }
            } catch {
                if case .cancelled = error {} else { metrics.pullFailed.increment() }
                for problem in session.problems { note(problem) }
                session.failed()
                try await Task.sleep(for: .milliseconds(failed(error, backoff: &backoff)))
            }
        }
    }

    /// Carries out what the session decides for one chunk; returns the changes applied.
    private func receive(
        _ envelope: RelayEnvelope,
        _ session: inout RelayPullSession,
        _ client: HTTPClient
    ) async throws(RelayCallError) -> Int {
        var verdict = session.check(envelope, now: configuration.clock.nowMilliseconds())
        if verdict == .readHeld {
            // The ranges this process uploaded are not sent back: the node holds them, so its own version vector,
            // read now, covers what the page skipped.
            session.held(try await local { () throws(ShoalError) in try await node.versionVector() })
            verdict = session.recheck(envelope, now: configuration.clock.nowMilliseconds())
        }
        guard verdict == .open else { return 0 }
        if !credentials.withLock({ $0.seal }).holds(envelope.epoch) {
            // Sealed with an epoch this node has not learnt yet: its grant is in the relay's mailbox.
            try await refreshGrants(client, required: false)
        }
        let plaintext: Result<[UInt8], ShoalError>
        do {
            plaintext = .success(try credentials.withLock { $0.seal }.open(envelope))
        } catch {
            plaintext = .failure(error)
        }
        guard case .apply(let batch, let received) = session.opened(
            envelope, plaintext: plaintext, now: configuration.clock.nowMilliseconds()
        ) else { return 0 }
        let result = try await local { () throws(ShoalError) in
            try await node.applyReceived(batch, received: received)
        }
        session.applied(envelope, received: result.received, held: result.versionVector)
        return result.applied
    }

    // MARK: Calls

    private func call(
        _ client: HTTPClient,
        _ method: HTTPMethod,
        _ path: String,
        body: [UInt8]?,
        contentType: String = "application/json",
        headers extra: [(String, String)] = [],
        timeout: TimeAmount
    ) async throws(RelayCallError) -> (body: [UInt8], headers: HTTPHeaders) {
        // The instance this call goes to: a failure moves on from it, not from wherever the other loop moved since.
        let used = instance.withLock { $0.index }
        var request = HTTPClientRequest(url: bases[used] + path)
        request.method = method
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        let token = credentials.withLock { $0.token }
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: RelayAPI.uploaderHeader, value: uploaderID)
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let status: HTTPResponseStatus
        let headers: HTTPHeaders
        let answer: [UInt8]
        do {
            let response = try await client.execute(request, timeout: timeout)
            status = response.status
            headers = response.headers
            answer = Array(try await response.body.collect(upTo: 80 * 1024 * 1024).readableBytesView)
        } catch is CancellationError {
            throw RelayCallError.cancelled
        } catch {
            if Task.isCancelled { throw RelayCallError.cancelled }
            let (why, problem) = Self.describe(error)
            throw RelayCallError.unreachable(why, instance: used, problem: problem)
        }
        markReachable(used)
        guard status.code >= 300 else {
            state.withLock { status in
                if status.unauthorized { status.unauthorized = false }
                if status.problem != nil { status.problem = nil }
            }
            return (answer, headers)
        }
        let refusal = try? JSONDecoder().decode(RelayErrorBody.self, from: Data(answer))
        let reason = refusal.map { "\($0.message) (\(status.code) \($0.error))" } ?? "HTTP \(status.code)"
        switch status.code {
        case 401 where refusal?.error == "token_rotated":
            throw RelayCallError.rotated(reason, token: token)
        case 403 where refusal?.error == "no_upload_key":
            throw RelayCallError.noUploadKey(reason)
        case 403 where refusal?.error == "epoch_retired" || refusal?.error == "bad_upload_auth":
            // Sealed under an epoch the relay retired, or under a key it does not hold for that epoch (it lost its state
            // and a member started the epoch afresh): the relay's current epoch is in this node's grants.
            throw RelayCallError.epochRetired(reason, token: token)
        case 401, 403:
            throw RelayCallError.unauthorized(reason, token: token)
        case 409:
            throw RelayCallError.conflict(epoch: refusal?.epoch, reason)
        case 413:
            throw RelayCallError.tooLarge(limit: refusal?.limit, reason)
        case 429:
            let retry = headers.first(name: "Retry-After").flatMap { Int($0) } ?? refusal?.retryAfterSeconds ?? 1
            throw RelayCallError.rateLimited(retryAfterSeconds: retry, reason)
        case 400..<500:
            throw RelayCallError.refused(reason)
        case 503 where refusal?.error == "storage_unavailable":
            throw RelayCallError.server(reason, instance: used, problem: .storageDown)
        default:
            throw RelayCallError.server(reason, instance: used, problem: .serverError)
        }
    }

    /// A failed request's cause, in words and by kind.
    static func describe(_ error: any Error) -> (String, RelayProblem) {
        if let error = error as? HTTPClientError {
            switch error {
            case .connectTimeout, .getConnectionFromPoolTimeout: return ("the connection timed out", .unreachable)
            case .readTimeout, .deadlineExceeded: return ("the relay did not answer in time", .unreachable)
            case .remoteConnectionClosed: return ("the relay closed the connection", .unreachable)
            default: break
            }
        }
        if let error = error as? NIOSSLExtraError, error == .failedToValidateHostname {
            return (
                "TLS failed: the relay's certificate is for another host name than the one in --relay (\(error))",
                .wrongHost
            )
        }
        if error is NIOSSLError || error is BoringSSLError || error is NIOSSLExtraError {
            let text = "\(error)"
            if text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("certificate") {
                return (
                    "TLS failed: the relay's certificate is not trusted (give its CA, or the certificate itself, "
                        + "with --relay-ca)",
                    .untrustedCertificate
                )
            }
            return ("TLS failed: \(text.prefix(200))", .tlsFailed)
        }
        if error is ChannelError { return ("the connection was closed", .unreachable) }
        let text = "\(error)"
        if text.contains("connectionRefused") || text.contains("Connection refused") { return ("connection refused", .unreachable) }
        return (text, .unreachable)
    }

    private func decodeJSON<T: Decodable>(_ bytes: [UInt8]) throws(RelayCallError) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch {
            throw RelayCallError.malformed("the relay answered with JSON this build cannot read")
        }
    }

    private func local<T>(_ body: () async throws(ShoalError) -> T) async throws(RelayCallError) -> T {
        do {
            return try await body()
        } catch {
            throw RelayCallError.local(error)
        }
    }

    private func localNow<T>(_ body: () throws(ShoalError) -> T) throws(RelayCallError) -> T {
        do {
            return try body()
        } catch {
            throw RelayCallError.local(error)
        }
    }

    // MARK: Key epochs

    private func refreshGrantsIfNeeded(_ client: HTTPClient) async throws(RelayCallError) {
        guard let refused = grantsNeeded.withLock({ $0 }) else { return }
        if credentials.withLock({ $0.token }) == refused {
            try await refreshGrants(client, required: true)
        }
        grantsNeeded.withLock { if $0 == refused { $0 = nil } }
    }

    /// Fetches the grants of epochs after the newest held and adopts those made for this node by a member.
    /// `required`: the token was retired, so finding none means this node was left out.
    private func refreshGrants(_ client: HTTPClient, required: Bool) async throws(RelayCallError) {
        guard let identity = configuration.identity else {
            if required {
                throw RelayCallError.unauthorized(
                    "the token was retired by a key rotation, and this node has no key to open grants", token: nil
                )
            }
            return
        }
        // Refused (the token retired, or an upload under a key the relay does not hold): every grant for this node is
        // read again, not only newer epochs, since the relay may hold another secret for an epoch held here.
        let newest = required ? 0 : credentials.withLock { $0.keyring.newest }
        // When the token was retired, the grant may still be on its way (a member grants those it sees join): wait
        // for it at the relay rather than asking again and again.
        let wait = required ? configuration.waitMilliseconds : 0
        let recipient = identity.nodeID.description.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        let (body, _) = try await call(
            client,
            .GET,
            RelayAPI.grantsPath + "?after=\(newest)&recipient=\(recipient)&wait=\(wait)",
            body: nil,
            timeout: .milliseconds(Int64(wait) + 30_000)
        )
        let listed: RelayGrants = try decodeJSON(body)
        let roster = configuration.roster?()
        let me = identity.nodeID.description
        var adopted: [(epoch: UInt32, contents: EpochGrant.Contents)] = []
        let held = credentials.withLock { credentials in
            Set(credentials.keyring.epochs.map { "\($0.epoch) \($0.secret)" })
        }
        for grant in listed.grants where grant.recipient == me {
            guard let data = Data(base64Encoded: grant.body), let decoded = try? EpochGrant(decoding: Array(data)),
                decoded.epoch == grant.epoch
            else { continue }
            // Only a member's grant counts: a removed node that rotated first gains nothing by it.
            if let roster, roster.members[decoded.signer] == nil || roster.removed[decoded.signer] != nil { continue }
            guard let contents = try? decoded.open(with: identity, cluster: configuration.clusterID),
                !held.contains("\(decoded.epoch) \(Data(contents.secret).base64EncodedString())")
            else { continue }
            adopted.append((decoded.epoch, contents))
        }
        guard !adopted.isEmpty else {
            if required {
                throw RelayCallError.ungranted(
                    "the token was retired when the cluster's key moved to epoch \(listed.epoch ?? 0), and no grant "
                        + "for this node was found: it was removed from the cluster, or the member who rotated did not "
                        + "know it yet (members add grants for newer members as they see them)"
                )
            }
            return
        }
        try adopt(adopted, rotatedHere: false)
    }

    /// Keeps the epochs of `grants`, seals with the newest from now on, and uses its token.
    private func adopt(_ grants: [(epoch: UInt32, contents: EpochGrant.Contents)], rotatedHere: Bool) throws(RelayCallError) {
        let (keyring, newest) = credentials.withLock { credentials in
            let before = credentials.keyring.newest
            for grant in grants {
                let epoch = RelayKeyring.Epoch(
                    epoch: grant.epoch,
                    secret: Data(grant.contents.secret).base64EncodedString(),
                    removed: grant.contents.removed.map(\.description)
                )
                // An epoch held with another secret: the relay lost its state and a member who never learnt this one
                // started the same epoch afresh. The relay's (a member signed it) is the one everyone can reach now;
                // what was sealed with the other lived only on the relay that lost it.
                credentials.keyring.epochs.removeAll { $0.epoch == grant.epoch && $0.secret != epoch.secret }
                if !credentials.keyring.epochs.contains(where: { $0.epoch == grant.epoch }) {
                    credentials.keyring.epochs.append(epoch)
                }
            }
            credentials.keyring.epochs.sort { $0.epoch < $1.epoch }
            if let latest = grants.max(by: { $0.epoch < $1.epoch }), latest.epoch >= before, !latest.contents.token.isEmpty {
                credentials.keyring.token = latest.contents.token
                credentials.token = latest.contents.token
            }
            credentials.seal = RelaySeal(
                secrets: credentials.keyring.secrets(clusterSecret: configuration.clusterSecret),
                epoch: credentials.keyring.newest
            )
            return (credentials.keyring, credentials.keyring.newest)
        }
        if let path = configuration.keyringPath {
            try localNow { () throws(ShoalError) in try keyring.save(path) }
        }
        state.withLock { $0.epoch = newest }
        grantedMembers.withLock { $0 = nil }
        eventSink.yield(.epoch(newest, rotatedHere: rotatedHere))
    }

    /// Starts a new key epoch when the roster removed a node that no epoch held here excludes yet; and leaves grants
    /// for members that joined after the last rotation.
    private func rotateIfNeeded(_ client: HTTPClient) async throws(RelayCallError) {
        guard let identity = configuration.identity, let roster = configuration.roster?() else { return }
        guard roster.removed[identity.nodeID] == nil else { return }
        try await reestablishIfNeeded(client, identity: identity, roster: roster)
        let removed = Set(roster.removed.keys.map(\.description))
        if !removed.isSubset(of: credentials.withLock({ $0.keyring.removed })) {
            // Another member may have rotated already.
            try await refreshGrants(client, required: false)
        }
        if !removed.isSubset(of: credentials.withLock({ $0.keyring.removed })) {
            try await rotate(client, identity: identity, roster: roster)
        } else {
            try await grantNewMembers(client, identity: identity, roster: roster)
        }
    }

    /// Starts again at the relay the epochs this node holds beyond the relay's newest, in order, each with its grants
    /// for the members and its upload key: a relay that lost its storage, or was restored from a copy older than a
    /// rotation, learns them back from the members instead of a member starting a different epoch under the same
    /// number. The newest comes with the token members hold for it. Checked when the relay's heads are read again.
    private func reestablishIfNeeded(_ client: HTTPClient, identity: NodeIdentity, roster: Roster) async throws(RelayCallError) {
        let now = configuration.clock.monotonicMilliseconds()
        let (keyring, token) = credentials.withLock { ($0.keyring, $0.token) }
        guard keyring.newest > 0, epochsChecked.withLock({ $0.map { now - $0 >= 30_000 } ?? true }) else { return }
        let (body, _) = try await call(client, .GET, RelayAPI.grantsPath + "?after=\(keyring.newest)", body: nil, timeout: .seconds(30))
        let listed: RelayGrants = try decodeJSON(body)
        epochsChecked.withLock { $0 = now }
        guard let relayNewest = listed.epoch, relayNewest < keyring.newest else { return }
        configuration.logger.info(
            "the relay lacks key epochs this node holds (it lost or rolled back its storage): starting them again there",
            metadata: ["relay": "\(relayNewest)", "held": "\(keyring.newest)"]
        )
        for epoch in keyring.epochs where epoch.epoch > relayNewest {
            guard let secret = Data(base64Encoded: epoch.secret).map(Array.init) else { continue }
            let newest = epoch.epoch == keyring.newest
            let contents = EpochGrant.Contents(
                secret: secret,
                token: newest ? token : "",
                removed: epoch.removed.compactMap { NodeID(parsing: $0) }
            )
            var grants: [RelayGrant] = []
            for recipient in Self.recipients(roster, identity: identity, excluding: keyring.removed) {
                grants.append(try grant(epoch.epoch, contents, to: recipient, signer: identity))
            }
            let uploadKey = RelaySeal(secrets: [epoch.epoch: secret], epoch: epoch.epoch).uploadKey(epoch.epoch)
                .map { Data($0).base64EncodedString() }
            // Only the newest epoch's token is one members use; an older epoch's is never handed out.
            let tokenHash = RelayAPI.tokenHash(newest ? token : RelayAPI.makeToken())
            let rotation = RelayRotation(epoch: epoch.epoch, tokenHash: tokenHash, grants: grants, uploadKey: uploadKey)
            do {
                _ = try await call(
                    client, .POST, RelayAPI.rotatePath, body: Array((try? JSONEncoder().encode(rotation)) ?? Data()),
                    timeout: .seconds(30)
                )
            } catch {
                guard case .conflict = error else { throw error }
                // Another member started it first (this node's, or one made afresh): the grants say which.
                return
            }
        }
        grantedMembers.withLock { $0 = nil }
    }

    /// The members of `roster` and this node, with their keys, minus every node an epoch held here was made without:
    /// a member whose roster has not caught up with a removal yet must not grant the removed node what excluded it.
    private static func recipients(_ roster: Roster, identity: NodeIdentity, excluding removed: Set<String>)
        -> [(node: NodeID, key: [UInt8])]
    {
        var recipients = roster.members.values.filter { !removed.contains($0.nodeID.description) }
            .map { (node: $0.nodeID, key: $0.publicKeyDER) }
        if !recipients.contains(where: { $0.node == identity.nodeID }) {
            recipients.append((identity.nodeID, identity.publicKeyDER))
        }
        return recipients
    }

    private func rotate(_ client: HTTPClient, identity: NodeIdentity, roster: Roster) async throws(RelayCallError) {
        let epoch = credentials.withLock { $0.keyring.newest } + 1
        var generator = SystemRandomNumberGenerator()
        let secret = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let token = RelayAPI.makeToken()
        let contents = EpochGrant.Contents(secret: secret, token: token, removed: roster.removed.keys.sorted())
        var grants: [RelayGrant] = []
        let excluded = credentials.withLock { $0.keyring.removed }.union(contents.removed.map(\.description))
        for recipient in Self.recipients(roster, identity: identity, excluding: excluded) {
            grants.append(try grant(epoch, contents, to: recipient, signer: identity))
        }
        let tokenHash = RelayAPI.tokenHash(token)
        let uploadKey = RelaySeal(secrets: [epoch: secret], epoch: epoch).uploadKey(epoch).map { Data($0).base64EncodedString() }
        let rotation = RelayRotation(epoch: epoch, tokenHash: tokenHash, grants: grants, uploadKey: uploadKey)
        let body = Array((try? JSONEncoder().encode(rotation)) ?? Data())
        do {
            _ = try await call(client, .POST, RelayAPI.rotatePath, body: body, timeout: .seconds(30))
        } catch {
            if case .conflict = error {
                // Another member started this epoch: adopt its grant; the next pass checks what it excludes.
                try await refreshGrants(client, required: false)
                return
            }
            throw error
        }
        try adopt([(epoch, contents)], rotatedHere: true)
        configuration.logger.info("rotated the relay key", metadata: ["epoch": "\(epoch)"])
    }

    /// `contents` of `epoch` sealed to `recipient` and signed by `signer`, as the relay's mailbox keeps it.
    private func grant(
        _ epoch: UInt32,
        _ contents: EpochGrant.Contents,
        to recipient: (node: NodeID, key: [UInt8]),
        signer: NodeIdentity
    ) throws(RelayCallError) -> RelayGrant {
        let grant = try localNow { () throws(ShoalError) in
            try EpochGrant.make(
                cluster: configuration.clusterID,
                epoch: epoch,
                contents: contents,
                recipient: recipient.node,
                recipientKey: recipient.key,
                signer: signer
            )
        }
        return RelayGrant(epoch: epoch, recipient: recipient.node.description, body: Data(grant.encoded).base64EncodedString())
    }

    private func grantNewMembers(_ client: HTTPClient, identity: NodeIdentity, roster: Roster) async throws(RelayCallError) {
        let members = Set(roster.members.keys).union([identity.nodeID])
        guard grantedMembers.withLock({ $0 }) != members else { return }
        let (keyring, token) = credentials.withLock { ($0.keyring, $0.token) }
        guard !keyring.epochs.isEmpty else {
            grantedMembers.withLock { $0 = members }
            return
        }
        let (body, _) = try await call(client, .GET, RelayAPI.grantsPath + "?after=0", body: nil, timeout: .seconds(30))
        let listed: RelayGrants = try decodeJSON(body)
        let held = Set(listed.grants.map { "\($0.epoch) \($0.recipient)" })
        var grants: [RelayGrant] = []
        for epoch in keyring.epochs {
            guard let secret = Data(base64Encoded: epoch.secret) else { continue }
            let contents = EpochGrant.Contents(
                secret: Array(secret),
                token: epoch.epoch == keyring.newest ? token : "",
                removed: epoch.removed.compactMap { NodeID(parsing: $0) }
            )
            for recipient in Self.recipients(roster, identity: identity, excluding: keyring.removed)
            where !held.contains("\(epoch.epoch) \(recipient.node.description)") {
                grants.append(try grant(epoch.epoch, contents, to: recipient, signer: identity))
            }
        }
        if !grants.isEmpty {
            let posted = Array((try? JSONEncoder().encode(RelayGrants(grants: grants))) ?? Data())
            _ = try await call(client, .POST, RelayAPI.grantsPath, body: posted, timeout: .seconds(30))
        }
        grantedMembers.withLock { $0 = members }
    }

    // MARK: Status

    /// Records that instance `used` answered.
    private func markReachable(_ used: Int) {
        instance.withLock { $0.failures = 0 }
        let now = configuration.clock.nowMilliseconds()
        let changed = state.withLock { status in
            status.url = bases[used]
            guard status.reachable != true else { return false }
            status.reachable = true
            status.sinceMs = now
            return true
        }
        if changed {
            lastReported.withLock { $0 = nil }
            configuration.logger.info("relay reachable", metadata: ["url": "\(bases[used])"])
            eventSink.yield(.reachable)
        }
    }

    /// Records a failure that costs no backoff (it concerns one site; the others go on), said once.
    private func note(_ reason: String) {
        let now = configuration.clock.nowMilliseconds()
        state.withLock { status in
            status.lastError = reason
            status.lastErrorMs = now
        }
        let isNew = lastReported.withLock { last in
            defer { last = reason }
            return last != reason
        }
        if isNew {
            configuration.logger.warning("\(reason)")
            eventSink.yield(.failed(reason))
        }
    }

    /// Records a failure and returns how long to wait before the next try.
    private func failed(_ error: RelayCallError, backoff: inout Backoff) -> UInt64 {
        let now = configuration.clock.nowMilliseconds()
        var delay = backoff.next()
        let reason: String
        switch error {
        case .cancelled:
            return 0
        case .unreachable(let why, let used, let problem), .server(let why, let used, let problem):
            switch problem {
            case .unreachable: reason = "the relay at \(bases[used]) did not answer: \(why)"
            case .storageDown: reason = "the relay at \(bases[used]) answered that its storage is down: \(why)"
            case .serverError: reason = "the relay at \(bases[used]) answered with a server error: \(why)"
            case .untrustedCertificate, .wrongHost, .tlsFailed: reason = "the relay at \(bases[used]): \(why)"
            }
            // The next instance is tried at once, until every one has failed in a row; then the backoff holds. The
            // upload and the pull loops share the instance: a failure moves on only from the instance it met (the
            // other loop may have moved on already), and counts once per instance.
            let next = instance.withLock { instance -> String? in
                guard bases.count > 1 else { return nil }
                if instance.index == used {
                    instance.failures += 1
                    instance.index = (used + 1) % bases.count
                }
                return instance.failures < bases.count ? bases[instance.index] : nil
            }
            // A relay that comes back may have lost or rolled back its storage: its key epochs are checked again
            // before the next upload.
            epochsChecked.withLock { $0 = nil }
            if let next {
                configuration.logger.info("relay instance did not answer; trying the next", metadata: ["next": "\(next)"])
                return UInt64.random(in: 0...50)
            }
            state.withLock { status in
                if status.reachable != false { status.sinceMs = now }
                status.reachable = false
                status.problem = problem
                status.url = bases[instance.withLock { $0.index }]
            }
        case .unauthorized(let why, let refused):
            reason = "the relay refused the token: \(why)"
            // The relay may have lost its tokens with the rest of its storage: check its key epochs again first.
            epochsChecked.withLock { $0 = nil }
            let fellBack = credentials.withLock { credentials in
                // Refused a token no longer in use (the other loop moved on meanwhile): try again soon.
                if let refused, refused != credentials.token { return true }
                // A token from a rotation refused: try the configured one (an operator may have made a new one).
                guard credentials.token != configuration.token else { return false }
                credentials.token = configuration.token
                return true
            }
            if !fellBack { delay = max(delay, configuration.unauthorizedBackoffMilliseconds) }
        case .rotated(let why, let token):
            reason = "the relay retired the token at a key rotation (\(why)); fetching this node's grant"
            grantsNeeded.withLock { $0 = token }
        case .epochRetired(let why, let token):
            reason = "the relay refused an upload sealed with a retired key epoch (\(why)); fetching this node's grant"
            grantsNeeded.withLock { $0 = token }
        case .ungranted(let why):
            // Retried with the ordinary backoff: a member adds grants for members it sees joining.
            reason = "the relay refused the token: \(why)"
        case .conflict(_, let why):
            reason = "relay: \(why)"
        case .rateLimited(let seconds, let why):
            reason = "the relay limits requests: \(why)"
            delay = max(delay, UInt64(max(1, seconds)) * 1000 + UInt64.random(in: 0...500))
        case .tooLarge(let limit, let why):
            reason = "the relay refused a request as too large: \(why)"
            sizes.withLock { sizes in
                // Under the limit the relay named (it may be the request's or a change set's), with room for headers.
                let cap = limit.map { max(2 * 1024, $0 / 2) } ?? Int.max
                sizes.piece = max(1024, min(sizes.piece / 2, cap))
                sizes.request = max(2 * 1024, min(sizes.request / 2, cap))
            }
        case .refused(let why), .malformed(let why), .noUploadKey(let why):
            reason = "relay: \(why)"
        case .local(let why):
            reason = "relay changes could not be used here: \(why.message)"
        }
        state.withLock { status in
            status.lastError = reason
            status.lastErrorMs = now
            switch error {
            case .unauthorized, .ungranted: status.unauthorized = true
            default: break
            }
        }
        let isNew = lastReported.withLock { last in
            defer { last = reason }
            return last != reason
        }
        if isNew {
            configuration.logger.warning("\(reason); retrying in \(delay / 1000) s and later with backoff")
            switch error {
            case .unauthorized, .ungranted: eventSink.yield(.unauthorized(reason))
            default: eventSink.yield(.failed(reason))
            }
        }
        switch error {
        case .unauthorized, .ungranted, .rotated, .epochRetired: break
        default: state.withLock { $0.unauthorized = false }
        }
        return delay
    }
}

/// Why a call to the relay failed.
enum RelayCallError: Error {
    case cancelled
    /// The instance at `instance` did not answer (or not in time, or TLS failed), with the cause.
    case unreachable(String, instance: Int, problem: RelayProblem)
    /// The instance at `instance` answered with a server error (its storage down, or another).
    case server(String, instance: Int, problem: RelayProblem)
    /// The relay refused `token` (nil: not a token the relay saw, but a check of this node's).
    case unauthorized(String, token: String?)
    case rateLimited(retryAfterSeconds: Int, String)
    case tooLarge(limit: Int?, String)
    case refused(String)
    case malformed(String)
    case local(ShoalError)
    /// The token was retired by a key rotation: the node's grant holds the new one.
    case rotated(String, token: String)
    /// An upload was sealed with an epoch older than the cluster's newest: the node's grant holds the new key.
    case epochRetired(String, token: String)
    /// The token was retired by a rotation and no grant for this node is there (yet, or ever: a removed node).
    case ungranted(String)
    /// The relay holds no upload key for the epoch (registered on the spot, then the upload is sent again).
    case noUploadKey(String)
    /// Another member started the key epoch first.
    case conflict(epoch: UInt32?, String)
}
