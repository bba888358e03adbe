import AsyncHTTPClient
import Logging
import ServiceLifecycle
import ShoalCore
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
    /// Whether the pull loop brought everything the relay held for this node since the link started or last failed
    /// (a page came back empty): until then the uploader waits (at most ``pullFirstMilliseconds``), so that a member
    /// back from a long absence learns first whether peers collected deletes without it, and then keeps its own writes
    /// made meanwhile (see `Store+Suspension.swift`) rather than upload them.
    let pulledUp = Mutex(false)
    let pulledUpSignals: AsyncStream<Void>
    let pulledUpWake: AsyncStream<Void>.Continuation
    /// How long the uploader waits for the pull loop after a start or a failure, at most (a site it cannot open would
    /// otherwise keep it waiting for good).
    static let pullFirstMilliseconds: UInt64 = 15_000

    /// A link for `node`; the configuration is checked here (``RelayClientConfiguration/checkedBases()``: an `http://`
    /// URL must name a loopback address, the token would otherwise cross the network in clear).
    public init(node: SyncNode, configuration: RelayClientConfiguration) throws(ShoalError) {
        bases = try configuration.checkedBases()
        self.node = node
        self.configuration = configuration
        let keyring = try configuration.keyringPath.map { path throws(ShoalError) in try RelayKeyring.load(path) }
        state = Mutex(RelayLinkState(bases: bases, configuration: configuration, keyring: keyring ?? RelayKeyring()))
        (events, eventSink) = AsyncStream.makeStream(of: RelayEvent.self, bufferingPolicy: .bufferingNewest(1_000))
        (pushSignals, pushWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        (pulledUpSignals, pulledUpWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// The relay as this node sees it now.
    public var status: RelayStatus { state.withLock { $0.status } }

    /// Uploads and pulls until cancelled or shut down gracefully.
    public func run() async throws {
        let http = configuration.httpConfiguration
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: http)
        let api = RelayAPIClient(
            http: client,
            bases: bases,
            uploaderID: uploaderID,
            route: { self.state.withLock { ($0.instance, $0.credentials.token) } },
            answered: { used, ok, boot in self.markReachable(used, ok: ok, boot: boot) }
        )
        // A read of the relay's whole state (a fresh state through it) asks as another process: the relay leaves out
        // of a page the ranges the asking process uploaded, and this read must see every row.
        let reader = RelayAPIClient(
            http: client,
            bases: bases,
            uploaderID: String(UInt64.random(in: 1...UInt64.max), radix: 16),
            route: { self.state.withLock { ($0.instance, $0.credentials.token) } },
            answered: { used, ok, boot in self.markReachable(used, ok: ok, boot: boot) }
        )
        await node.readsRelayState { covering in
            do {
                return try await self.readStateForFreshState(reader, snapshotCovering: covering)
            } catch {
                throw ShoalError(code: .relay, message: "\(error)")
            }
        }
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
        await node.readsRelayState(nil)
        eventSink.finish()
        try? await client.shutdown()
    }

    /// Waits until the pull loop brought everything the relay held for this node (``pulledUp``), at most `limit`
    /// milliseconds.
    func awaitPulledUp(limit: UInt64) async {
        guard !pulledUp.withLock({ $0 }) else { return }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await _ in self.pulledUpSignals where self.pulledUp.withLock({ $0 }) { return }
            }
            group.addTask { try? await Task.sleep(for: .milliseconds(limit)) }
            await group.next()
            group.cancelAll()
        }
    }

    /// Records whether the pull loop is pulled up; once it is, the node looks at the suspensions it may have brought
    /// (so that its own writes are held back before the uploader runs), and the uploader is woken.
    func setPulledUp(_ value: Bool) async {
        guard pulledUp.withLock({ $0 }) != value else { return }
        if value { await node.lookAtSuspensions() }
        pulledUp.withLock { $0 = value }
        if value { pulledUpWake.yield() }
    }

    // MARK: Status

    /// Reports `event` on the link's own stream and among the node's events.
    func report(_ event: RelayEvent) {
        eventSink.yield(event)
        node.relayDid(event)
    }

    /// Records that instance `used` answered (`ok`: with success).
    func markReachable(_ used: Int, ok: Bool, boot: String?) {
        let now = configuration.clock.nowMilliseconds()
        let (reachable, restarted) = state.withLock { state in
            (state.answered(used, ok: ok, now: now), boot.map { state.answered(by: $0) } ?? false)
        }
        if reachable {
            configuration.logger.info("relay reachable", metadata: ["url": "\(bases[used])"])
            report(.reachable)
        }
        if restarted {
            configuration.logger.info("another relay process answered; reading its heads again")
            pushWake.yield()
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

    /// Records a failure, wakes the uploader when the relay's heads must be read again, and returns how long to wait
    /// before the next try.
    func failed(_ error: RelayCallError, backoff: inout Backoff) -> UInt64 {
        let now = configuration.clock.nowMilliseconds()
        let unauthorized = configuration.unauthorizedBackoffMilliseconds
        var random = SystemRandomNumberGenerator()
        let (failure, stale) = state.withLock { state in
            let failure = state.failed(
                error, backoff: &backoff, unauthorizedBackoffMilliseconds: unauthorized, now: now, random: &random
            )
            return (failure, state.headsStale)
        }
        if let next = failure.nextInstance {
            configuration.logger.info("relay instance did not answer; trying the next", metadata: ["next": "\(next)"])
        }
        if let report = failure.report { configuration.logger.warning("\(report)") }
        if let event = failure.event { report(event) }
        if stale { pushWake.yield() }
        return failure.delay
    }

    /// Updates the relay's lacking and staleness gauges (its own, and its gap and staleness as a peer) as often as the
    /// node samples its own (neither is known before the relay's heads were first read).
    func sampleMetrics() async throws {
        let interval = await node.configuration.metricsIntervalMilliseconds
        guard interval > 0 else { return }
        while !Task.isCancelled {
            if let heads = state.withLock({ $0.knownHeads }) {
                let age = await node.ageOfOldestChangeLacking(in: heads)
                metrics.sample(lacking: status.lacking ?? 0, stalenessSeconds: Double(age) / 1000)
            }
            try await Task.sleep(for: .milliseconds(interval))
        }
    }

    // MARK: The node's store

    /// What the node holds: its version vector, read through its store.
    func held() async throws(RelayCallError) -> VersionVector {
        try await local { () throws(ShoalError) in try await node.store.versionVector() }
    }

    /// Runs a step on the node's store; its failure is a local one, not the relay's.
    func local<T>(_ body: () async throws(ShoalError) -> T) async throws(RelayCallError) -> T {
        do {
            return try await body()
        } catch {
            throw RelayCallError.local(error)
        }
    }
}
