import Logging
import NIOCore
import ServiceLifecycle
import ShoalCore
import ShoalProtocol
import ShoalStore

/// A Shoal node: listens for peers, dials the ones its peer sources find, and keeps every connected peer in sync.
///
/// ``run()`` does the work until its task is cancelled. Every commit to the database, by this node, by another
/// process (noticed when it writes the file: ``DatabaseFileWatcher``) or from a peer, starts a round with every
/// connected peer at once.
/// The node itself only wires parts together: each connection runs the one ``ConnectionDriver``, peers are
/// plain data in a ``PeerDirectory``, peers are found by ``PeerSource``s, connections are admitted by a
/// ``ConnectionRegistry``, and how a connection's pipeline is built is the configured ``ChannelSetup``.
public actor SyncNode: Service {
    /// How the node runs.
    public let configuration: NodeConfiguration
    let worker: SerializedStore
    /// Events as they happen, for observers and tests.
    public nonisolated let events: AsyncStream<NodeEvent>
    let eventSink: AsyncStream<NodeEvent>.Continuation
    /// Wakes the collection loop: a member is known to hold more, or its interval passed (``collectPeriodically()``).
    let collectionWakes: AsyncStream<Void>
    let collectionWaker: AsyncStream<Void>.Continuation
    /// Peers offered for a fresh state while the database awaits one (``takeFreshStateWhenOffered()``).
    let freshStateSources: AsyncStream<PeerAddress?>
    let freshStateSource: AsyncStream<PeerAddress?>.Continuation
    /// The node's site id.
    public nonisolated let siteID: SiteID
    /// The port the node listens on, once ``run()`` has bound it.
    public internal(set) var listeningPort: Int?

    /// Open connections and the pools that admit them.
    var registry: ConnectionRegistry
    /// What the node knows about its peers.
    var directory = PeerDirectory()
    /// What a relay holds, as its link last read it (its heads): the relay acknowledges like a peer.
    var relayHeads = VersionVector() {
        didSet { wakeAcknowledgementWaiters() }
    }
    /// What the relay's ranges brought this node, as its link counted them: the node holds the effect of every
    /// transaction they cover, including those overwritten before they were sent, which its version vector may not
    /// claim (a relay range never completes a claim).
    var relayBrought = VersionVector()
    /// Who waits for an acknowledgement (``waitUntilAcknowledged(_:by:timeoutMilliseconds:)``).
    var acknowledgementWaiters: [Int: AsyncStream<Void>.Continuation] = [:]
    var nextAcknowledgementWaiter = 0
    /// The dialler of each peer found (by site) or configured address (site not known yet).
    var dialers: [DialerKey: Dialer] = [:]
    /// Repeating failures, logged once with a count.
    var failures = RepeatingFailures()
    /// Where to remember peers that dialled this node, once a round with them finishes.
    var toRemember: [SiteID: PeerAddress] = [:]
    /// Peers the node was told to forget (removed from the cluster): found again, they are not dialled.
    var forgotten: Set<SiteID> = []
    /// How far ahead of local time each peer's clocks last looked.
    var clockViews: [SiteID: ClockView] = [:]
    /// Set once the node stops: connections still arriving are closed at once.
    var shuttingDown = false
    /// Set once the node stops, for every connection's driver: an answer in progress ends at its next batch.
    nonisolated let stopping = Flag()
    var digestRefreshing = false
    /// Who hears when the data may have changed (``changeSignals()``).
    var changeWatchers: [Int: AsyncStream<Void>.Continuation] = [:]
    var nextChangeWatcher = 0
    /// Who hears when a peer's last connection closed (``disconnections()``).
    var disconnectionWatchers: [Int: AsyncStream<SiteID>.Continuation] = [:]
    var lastRefreshedDigest: StateDigest?
    /// The node's metrics (swift-metrics; see `SyncNode+Metrics.swift`).
    var nodeMetrics: NodeMetrics
    /// The change frames sent to peers, counted by the connections (``changeTraffic``).
    nonisolated let trafficCounter: ChangeTrafficCounter
    /// When the node came to hold what it holds, for the age of what a peer lacks.
    var vectorHistory = VersionVectorHistory()
    /// Which peers hold the same changes but not the same rows (see `SyncNode+Divergence.swift`).
    var divergenceWatch = DivergenceWatch()
    /// Peers whose last acknowledgement carried a digest not yet compared with this node's.
    var uncomparedDigests: Set<SiteID> = []
    /// What every member was last known to hold (``MemberDirectory``).
    var members = MemberDirectory()
    /// The cluster's current members (the sites their memberships name), when known (``setMembers(_:boundSites:)``): tombstones
    /// are collected only then.
    var collectionMembers: Set<SiteID>?
    /// Per member, the other sites it signed that it writes under (``setMembers(_:boundSites:)``): its report rows
    /// written under one of them count as its own.
    var memberWritingSites: [SiteID: Set<SiteID>] = [:]
    /// The pulls under way, by connection, with what each brings at least (``pullUnderWay(covering:except:)``).
    var pullsUnderWay: [Int: VersionVector] = [:]
    /// Whether a link put its pull off for one of those: the next to end tells every link.
    var pullsPutOff = false
    /// What collection did since the node started (``collectionStatus()``).
    var collection = CollectionProgress()
    /// Whether the database awaits its fresh state (``Store/awaitsFreshState()``), as read at start.
    var awaitingFreshState = false
    /// What a peer must hold to give that fresh state (``Store/freshStateFloor()``), as read at start.
    var freshStateFloor = VersionVector()
    /// The removal fences, read while this database awaits its fresh state (``withinFences(_:)``).
    var freshStateFences: [SiteID: UInt64] = [:]
    /// Members suspended for collection (by this node or another), with the cuts their fresh state must cover: not
    /// pulled from until they showed one (``mayPull(from:)``).
    var suspendedSites: [SiteID: VersionVector] = [:]
    /// What the last fresh state each peer took covers, as it told this node.
    var peerFreshStates: [SiteID: VersionVector] = [:]
    /// What the last fresh state this node took covers, to tell its peers.
    var lastFreshStateCovers: VersionVector?
    /// Whether a commit other than a member's report came since this node last wrote its own.
    var memberReportDue = false
    /// Whether a relay link reported what the relay holds (``relayHolds(_:)``).
    var relayLinked = false
    /// Reads what the relay holds, whole, for a fresh state through it (``readsRelayState(_:)``).
    var relayStateReader: (@Sendable (VersionVector) async throws -> RelayStateKeys)?
    /// No read of the relay's state for a fresh state before then (monotonic milliseconds).
    var relayStateReadDueMs: UInt64 = 0
    /// When each member's report row this node folded into ``members`` was written (theirs, by site).
    var foldedMemberReports: [SiteID: UInt64] = [:]
    /// Per peer, when (monotonic milliseconds) it lately refused a connection as a duplicate while this node held none
    /// to it (see `SyncNode+Connections.swift`).
    var strayDuplicateRefusals: [SiteID: [UInt64]] = [:]

    /// Opens the database (it must exist: `shoal init` makes it) and prepares the node; ``run()`` starts it.
    public init(configuration: NodeConfiguration) async throws(ShoalError) {
        guard configuration.channelSetup != nil || configuration.insecurePlaintext else {
            throw ShoalError(
                code: .invalidArgument,
                message: "no channel setup: configure the node's security (NodeSecurity.configure), or set "
                    + "insecurePlaintext to run without authentication or encryption"
            )
        }
        if configuration.channelSetup == nil {
            configuration.logger.warning(
                "peer links are plaintext: peers are neither authenticated nor encrypted (insecurePlaintext)"
            )
        }
        self.configuration = configuration
        let traffic = ChangeTrafficCounter()
        trafficCounter = traffic
        nodeMetrics = NodeMetrics(traffic: traffic)
        let worker = try SerializedStore(path: configuration.databasePath, options: configuration.storeOptions)
        self.worker = worker
        self.siteID = await worker.siteID
        self.registry = ConnectionRegistry(
            localSite: await worker.identitySiteID,
            limits: ConnectionRegistry.Limits(
                maximumConnections: configuration.maximumConnections,
                maximumPending: configuration.maximumPendingConnections,
                maximumPendingPerAddress: configuration.maximumPendingPerAddress
            )
        )
        (events, eventSink) = AsyncStream.makeStream(of: NodeEvent.self, bufferingPolicy: .bufferingNewest(10_000))
        (collectionWakes, collectionWaker) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        (freshStateSources, freshStateSource) = AsyncStream.makeStream(
            of: PeerAddress?.self,
            bufferingPolicy: .bufferingNewest(1)
        )
    }

    /// Open connections (handshaking or established).
    public var connectionCount: Int { registry.count }

    /// The most handshaking connections seen at once from each remote address (for tests and diagnostics).
    var pendingHighWater: [String: Int] { registry.pendingHighWater }

    /// Peers seen since start, connected or not.
    public func peerStatuses() -> [PeerStatus] {
        directory.statuses()
    }

    /// What every member this node heard of was last known to hold, when, and who said so (itself included).
    public func memberStatuses() async -> [MemberStatus] {
        if let local = try? await worker.versionVector() {
            members.heard(siteID, holds: local, at: configuration.clock.nowMilliseconds(), from: .local)
        }
        return members.statuses()
    }

    /// Configured peers never reached yet: their address, how they were learned, and why they cannot be reached.
    public func unreachedPeers() -> [UnreachedPeer] {
        directory.unreachedPeers()
    }

    /// How many times the node dialled `address` (connected or tried to), since it started.
    public func dialCount(_ address: PeerAddress) -> Int { directory.dialCount(address) }

    /// The database's one door: everything that reaches this node's database goes through it (the relay link,
    /// membership, the app), and every commit made through it starts rounds with the connected peers.
    public nonisolated var store: SerializedStore { worker }

    /// Runs SQL through the node's own connection; its commit starts rounds at once (``followCommits()``).
    @discardableResult
    public func execute(_ sql: String, _ arguments: [SQLValue] = []) async throws(ShoalError) -> QueryResult {
        try await worker.withStore { store throws(ShoalError) in try store.execute(sql, arguments) }
    }

    /// Runs `body` on the node's store (on its own thread, between the connections' work), then starts rounds at
    /// once: for the security layer's roster and invites, which live in the database.
    public func withStore<T: Sendable>(
        _ body: @Sendable (Store) throws(ShoalError) -> T
    ) async throws(ShoalError) -> T {
        try await worker.withStore(body)
    }

    /// Runs `body` on the node's store for a read, or a write to Shoal's local tables (invites), which changes no
    /// replicated data: no round follows.
    public func readStore<T: Sendable>(
        _ body: @Sendable (Store) throws(ShoalError) -> T
    ) async throws(ShoalError) -> T {
        try await worker.read(body)
    }

    /// The node's version vector.
    public func versionVector() async throws(ShoalError) -> VersionVector {
        try await worker.versionVector()
    }

    /// Local transactions that no peer (nor the relay) has acknowledged holding yet (from the version vector as last
    /// read: answered at once, even while a long apply runs).
    public func pendingLocalChanges() -> UInt64 {
        let local = worker.latestVersionVector.withLock { $0 }[siteID]
        let seen = max(directory.highestAcknowledged(of: siteID), relayHeads[siteID])
        return local > seen ? local - seen : 0
    }

    /// How far this machine's clock runs ahead of its most advanced peer's, when beyond the drift bound: local writes
    /// are then stamped with the peers' time, and the clock needs setting right. `nil` while it does not.
    public func clockAheadOfPeers() -> UInt64? {
        worker.latestClockAhead.withLock { $0 }
    }

    /// The node's digest, recomputed when stale but at most every `interval` ms (for status reports). Without
    /// `waiting`, it answers at once with the digest of the last refresh and starts the next one in the
    /// background, so a status report never waits behind a long apply.
    public func refreshDigest(
        minimumIntervalMilliseconds interval: UInt64 = 2_000,
        quietMilliseconds quiet: UInt64 = 1_000,
        waiting: Bool = true
    ) async throws(ShoalError) -> StateDigest? {
        guard waiting else {
            if !digestRefreshing {
                digestRefreshing = true
                Task { await self.refreshDigestInBackground(interval: interval, quiet: quiet) }
            }
            return lastRefreshedDigest
        }
        return try await refreshDigestOnWorker(interval: interval, quiet: quiet)
    }

    /// Asks the worker to refresh the digest until it is ready or not due, one slice of changed rows a call.
    private func refreshDigestOnWorker(interval: UInt64, quiet: UInt64) async throws(ShoalError) -> StateDigest? {
        while true {
            switch try await worker.refreshDigest(
                minimumIntervalMilliseconds: interval,
                quietMilliseconds: quiet,
                now: configuration.clock.nowMilliseconds()
            ) {
            case .ready(let digest): return digest
            case .notDue: return nil
            case .inProgress: continue
            }
        }
    }

    private func refreshDigestInBackground(interval: UInt64, quiet: UInt64) async {
        lastRefreshedDigest = try? await refreshDigestOnWorker(interval: interval, quiet: quiet)
        digestRefreshing = false
        if lastRefreshedDigest != nil { await compareAcknowledgedDigests(refreshing: false) }
    }

    /// The state digest of the node's database.
    public func digest() async throws(ShoalError) -> StateDigest {
        try await worker.digest()
    }

    /// Listens, dials, and syncs until a graceful shutdown (run it in a `ServiceGroup`) or cancellation, and then
    /// returns: a stop asked for is not an error (an app that stops on SIGTERM exits with status 0). It throws when
    /// the node fails (it cannot listen, say).
    public func run() async throws {
        do {
            try await cancelWhenGracefulShutdown { try await self.serve() }
        } catch is CancellationError {
            // Asked to stop.
        }
    }

    private func serve() async throws {
        let listener = try await PeerListener.bind(
            host: configuration.listenHost,
            port: configuration.listenPort,
            group: configuration.eventLoopGroup,
            setup: channelSetup
        )
        _ = try? await worker.versionVector()
        collection.startedAtMs = configuration.clock.nowMilliseconds()
        if configuration.collectionIntervalMilliseconds > 0 {
            // Before any link starts: a member this node (or another) suspended for collection is not pulled from,
            // from the first round on (a node restarted while it collects without one must not take its writes).
            lastFreshStateCovers = (try? await worker.freshStateCovers()).flatMap { $0.isEmpty ? nil : $0 }
            await refreshSuspensions()
        }
        listeningPort = listener.port
        if let listeningPort { eventSink.yield(.listening(port: listeningPort)) }
        configuration.logger.info(
            "listening",
            metadata: ["address": "\(configuration.listenHost):\(listeningPort ?? 0)", "site": "\(siteID.hex)"]
        )
        defer {
            eventSink.finish()
            for watcher in changeWatchers.values { watcher.finish() }
            for watcher in disconnectionWatchers.values { watcher.finish() }
        }
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask {
                // The accept loop runs apart from the node's cancellation: on shutdown the listening channel is
                // closed, the loop hands out what was already accepted, and every connection is told to close.
                // (A channel created by NIO must always reach executeThenClose, or NIO traps: cancelling the loop
                // would drop what it had queued.)
                let acceptor = Task {
                    await listener.run { child, address in
                        _ = await self.handle(child, dialed: false, address: address)
                    }
                }
                await withTaskCancellationHandler {
                    _ = await acceptor.result
                } onCancel: {
                    listener.close()
                    Task { await self.closeAllConnections() }
                }
            }
            if (try? await worker.awaitsFreshState()) == true {
                awaitingFreshState = true
                freshStateFloor = (try? await worker.freshStateFloor()) ?? VersionVector()
                await readFreshStateFences()
            }
            group.addTask { await self.takeFreshStateWhenOffered() }
            group.addTask { await self.followCommits() }
            if writesMemberReports {
                group.addTask { try await self.reportHoldingsAsRows() }
            }
            group.addTask { await self.followPeerSources() }
            group.addTask { try await self.watchLocalChanges() }
            group.addTask { try await self.periodicRounds() }
            if configuration.compactionIntervalMilliseconds > 0 {
                group.addTask { try await self.compactPeriodically() }
            }
            if configuration.collectionIntervalMilliseconds > 0 {
                group.addTask { try await self.collectPeriodically() }
            }
            if configuration.metricsIntervalMilliseconds > 0 {
                group.addTask { try await self.sampleMetricsPeriodically() }
            }
        }
    }

    /// How every connection's pipeline is built: the configured setup, or plain framing.
    var channelSetup: any ChannelSetup {
        configuration.channelSetup ?? FramingChannelSetup(maximumFrameLength: configuration.maximumFrameLength)
    }

    func closeAllConnections() {
        shuttingDown = true
        stopping.set()
        for inbox in registry.inboxes { inbox.yield(.shutdown) }
    }

    func broadcast(_ event: ConnectionEvent) {
        for inbox in registry.inboxes { inbox.yield(event) }
        switch event {
        case .localChange, .periodic: signalChangeWatchers()
        default: break
        }
    }
}
