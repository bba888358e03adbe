import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import ShoalCore
import ShoalDiscovery
import ShoalStore
import ShoalProtocol

/// A Shoal node: listens for peers, dials static peers, and keeps every connected peer in sync.
///
/// ``run()`` does the work until its task is cancelled. Every commit to the database, by this node or by
/// another process, starts a round with every connected peer within ``NodeConfiguration/localChangePollMilliseconds``.
public actor SyncNode: Service {
    public let configuration: NodeConfiguration
    let worker: StoreWorker
    /// Events as they happen, for observers and tests.
    public nonisolated let events: AsyncStream<NodeEvent>
    private let eventSink: AsyncStream<NodeEvent>.Continuation
    /// Open connections and the pools that admit them.
    private var registry: ConnectionRegistry
    private var peers: [SiteID: PeerStatus] = [:]
    /// Dial loops for peers found by mDNS, by site; cancelled when the peer leaves.
    private var discoveredDialers:
        [SiteID: (address: PeerAddress, since: ContinuousClock.Instant, dialer: Task<Void, Never>)] = [:]
    /// How each address was learned ("static" or "mdns"), to report per peer.
    private var addressOrigins: [String: String] = [:]
    /// The site behind each address we dialled, learned at its first handshake.
    private var addressSites: [String: SiteID] = [:]
    /// Every address each peer is known at (see ``PeerStatus/addresses``).
    private var knownAddresses: [SiteID: Set<String>] = [:]
    /// The port the node listens on, once ``run()`` has bound it.
    public private(set) var listeningPort: Int?
    public nonisolated let siteID: SiteID

    public init(configuration: NodeConfiguration) async throws {
        self.configuration = configuration
        let worker = try StoreWorker(path: configuration.databasePath, options: configuration.storeOptions)
        self.worker = worker
        self.siteID = await worker.siteID
        self.registry = ConnectionRegistry(
            localSite: siteID,
            limits: ConnectionRegistry.Limits(
                maximumConnections: configuration.maximumConnections,
                maximumPending: configuration.maximumPendingConnections,
                maximumPendingPerAddress: configuration.maximumPendingPerAddress
            )
        )
        (events, eventSink) = AsyncStream.makeStream(of: NodeEvent.self, bufferingPolicy: .bufferingNewest(10_000))
    }

    /// Open connections (handshaking or established).
    public var connectionCount: Int { registry.count }

    /// The most handshaking connections seen at once from each remote address (for tests and diagnostics).
    var pendingHighWater: [String: Int] { registry.pendingHighWater }

    /// Peers seen since start, connected or not.
    public func peerStatuses() -> [PeerStatus] {
        peers.values.sorted { $0.siteID < $1.siteID }.map { peer in
            var peer = peer
            peer.addresses = (knownAddresses[peer.siteID] ?? []).sorted()
            return peer
        }
    }

    /// Runs SQL through the node's own connection and starts rounds at once.
    @discardableResult
    public func execute(_ sql: String, _ arguments: [SQLValue] = []) async throws -> QueryResult {
        let result = try await worker.withStore { try $0.execute(sql, arguments) }
        broadcast(.localChange)
        return result
    }

    /// The node's version vector.
    public func versionVector() async throws -> VersionVector {
        try await worker.versionVector()
    }

    /// Local transactions that no peer has acknowledged holding yet (from the version vector as last read:
    /// answered at once, even while a long apply runs).
    public func pendingLocalChanges() async throws -> UInt64 {
        let local = worker.latestVersionVector.withLock { $0 }[siteID]
        let seen = peers.values.map { $0.versionVector[siteID] }.max() ?? 0
        return local > seen ? local - seen : 0
    }

    /// The node's digest, recomputed when stale but at most every `interval` ms (for status reports). Without
    /// `waiting`, it answers at once with the digest of the last refresh and starts the next one in the
    /// background, so a status report never waits behind a long apply.
    public func refreshDigest(
        minimumIntervalMilliseconds interval: UInt64 = 2_000,
        quietMilliseconds quiet: UInt64 = 1_000,
        waiting: Bool = true
    ) async throws -> StateDigest? {
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
    private func refreshDigestOnWorker(interval: UInt64, quiet: UInt64) async throws -> StateDigest? {
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

    private var digestRefreshing = false
    private var lastRefreshedDigest: StateDigest?

    private func refreshDigestInBackground(interval: UInt64, quiet: UInt64) async {
        lastRefreshedDigest = try? await refreshDigestOnWorker(interval: interval, quiet: quiet)
        digestRefreshing = false
    }

    /// The state digest of the node's database.
    public func digest() async throws -> StateDigest {
        try await worker.digest()
    }

    /// Listens, dials, and syncs until cancelled, or until a graceful shutdown (run it in a `ServiceGroup`).
    public func run() async throws {
        try await cancelWhenGracefulShutdown { try await self.serve() }
    }

    private func serve() async throws {
        let listener = try await PeerListener.bind(
            host: configuration.listenHost,
            port: configuration.listenPort,
            group: configuration.eventLoopGroup,
            setup: channelSetup
        )
        _ = try? await worker.versionVector()
        listeningPort = listener.port
        if let listeningPort { eventSink.yield(.listening(port: listeningPort)) }
        configuration.logger.info(
            "listening",
            metadata: ["address": "\(configuration.listenHost):\(listeningPort ?? 0)", "site": "\(siteID.hex)"]
        )
        defer { eventSink.finish() }
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask {
                // The accept loop runs apart from the node's cancellation: on shutdown the listening channel is
                // closed, the loop drains what was already accepted, and every connection is told to close.
                // (A channel created by NIO must always reach executeThenClose, or NIO traps.)
                let acceptor = Task {
                    try await listener.run { child, address in _ = await self.handle(child, dialed: false, address: address) }
                }
                await withTaskCancellationHandler {
                    _ = await acceptor.result
                } onCancel: {
                    listener.close()
                    Task { await self.closeAllConnections() }
                }
            }
            for peer in configuration.staticPeers {
                group.addTask { await self.dialLoop(peer) }
            }
            // Peers remembered from earlier runs (not also static): dialled with the usual backoff.
            let staticAddresses = Set(configuration.staticPeers.map(\.description))
            let remembered = configuration.rememberPeers ? (try? await worker.knownPeers()) ?? [] : []
            for known in remembered where known.siteID != siteID {
                let address = PeerAddress(host: known.host, port: known.port)
                guard !staticAddresses.contains(address.description) else { continue }
                addressOrigins[address.description] = "remembered"
                notePeer(known.siteID, name: "", address: address, foundBy: "remembered")
                group.addTask { await self.dialLoop(address, site: known.siteID) }
            }
            if configuration.mdns {
                group.addTask { await self.discover() }
            }
            group.addTask { try await self.watchLocalChanges() }
            group.addTask { try await self.periodicRounds() }
            if configuration.compactionIntervalMilliseconds > 0 {
                group.addTask { try await self.compactPeriodically() }
            }
        }
    }

    /// How every connection's pipeline is built: the configured setup, or plain framing.
    private var channelSetup: any ChannelSetup {
        configuration.channelSetup ?? FramingChannelSetup(maximumFrameLength: configuration.maximumFrameLength)
    }

    // MARK: - Discovery

    /// Runs mDNS discovery for as long as the node runs. When the daemon is missing, or goes away, the node says
    /// so once and tries again with backoff, so discovery comes back by itself once the daemon does.
    private func discover() async {
        guard let port = listeningPort else { return }
        // Advertise and browse where peers can reach us: on the interface of the address we listen on (the
        // loopback interface for 127.0.0.1), or on every interface when listening on all of them.
        let interface = MDNSDiscovery.interfaceName(owning: configuration.listenHost)
        // Unique per node and port, so a node restarted on another port is never mistaken for its old self.
        let name = String((configuration.nodeName ?? "shoal").prefix(40))
        let instance = "\(name) \(siteID.hex.prefix(12)) \(port)"
        let txt = ["site": siteID.hex, "cluster": configuration.clusterID, "proto": "\(WireProtocol.maximumVersion)"]
        var saidUnavailable = false
        var retry = Duration.seconds(1)
        defer {
            for current in discoveredDialers.values { current.dialer.cancel() }
            discoveredDialers.removeAll()
        }
        while !Task.isCancelled {
            let discovery = MDNSDiscovery(instanceName: instance, port: port, txt: txt, interface: interface)
            var reason: String?
            do {
                try discovery.start()
                saidUnavailable = false
                retry = .seconds(1)
                eventSink.yield(.discoveryAvailable(interface: interface))
                reason = await follow(discovery)
            } catch {
                reason = error.message
            }
            discovery.stop()
            guard let reason, !Task.isCancelled else { return }
            if !saidUnavailable {
                saidUnavailable = true
                eventSink.yield(.discoveryUnavailable(reason))
                // Reported through the event (the CLI prints it); the log keeps a trace for library users.
                configuration.logger.debug("mDNS discovery is off", metadata: ["reason": "\(reason)"])
            }
            try? await Task.sleep(for: retry)
            retry = min(retry * 2, .seconds(30))
        }
    }

    /// Dials the peers `discovery` finds until it stops: returns why it became unavailable, or nil when the
    /// node is stopping.
    private func follow(_ discovery: MDNSDiscovery) async -> String? {
        await withTaskCancellationHandler {
            for await event in discovery.events {
                switch event {
                case .found(let service):
                    guard let site = service.siteID, site != siteID, service.clusterID == configuration.clusterID
                    else { continue }
                    // The instance is "<name> <site> <port>": the name is what comes before.
                    let name = service.instance.split(separator: " ").dropLast(2).joined(separator: " ")
                    notePeer(
                        site,
                        name: name,
                        address: PeerAddress(host: service.host, port: service.port),
                        foundBy: "mdns"
                    )
                    // The advertised host name too, unless the peer was seen on loopback (where its name would lead
                    // to another interface, on which it does not listen).
                    if service.host != "127.0.0.1" {
                        knownAddresses[site, default: []].insert(
                            PeerAddress(host: service.hostName, port: service.port).description
                        )
                    }
                    dial(discovered: site, at: PeerAddress(host: service.host, port: service.port))
                case .lost:
                    // A restarted node re-registers, and the removal of its old registration may arrive after
                    // the new one: keep the dialer (its backoff copes with a peer that is really gone); the
                    // connection itself notices the peer leaving.
                    break
                case .unavailable(let reason):
                    return reason
                }
            }
            return nil
        } onCancel: {
            discovery.stop()
        }
    }

    /// Both sides dial what they find (so a node that returns reconnects as soon as it sees the ones that
    /// stayed); of two connections between a pair, both keep the one dialled by the smaller site id, and a
    /// dialer waits while its peer is connected.
    private func dial(discovered site: SiteID, at address: PeerAddress) {
        // A peer that (re)appears while not connected gets a fresh dialer at once: a new port after a restart, or
        // the old one with its backoff reset. The same sighting again within moments (once per address family)
        // changes nothing.
        if let current = discoveredDialers[site] {
            let connected = peers[site]?.isConnected ?? false
            let justStarted = ContinuousClock.now - current.since < .seconds(2)
            if current.address == address && (connected || justStarted) { return }
            current.dialer.cancel()
        }
        addressOrigins[address.description] = "mdns"
        eventSink.yield(.peerDiscovered(site, address: address.description))
        discoveredDialers[site] = (address, ContinuousClock.now, Task { await self.dialLoop(address, site: site) })
    }

    // MARK: - Dialling

    private func dialLoop(_ address: PeerAddress, site: SiteID? = nil) async {
        if addressOrigins[address.description] == nil { addressOrigins[address.description] = "static" }
        let site = site
        var backoff = configuration.backoffInitialMilliseconds
        let setup = channelSetup
        let group = configuration.eventLoopGroup
        while !Task.isCancelled {
            if let site = site ?? addressSites[address.description], peers[site]?.isConnected == true {
                // Already connected to this peer (perhaps it dialled us): nothing to do for now.
                try? await Task.sleep(for: .milliseconds(500))
                continue
            }
            var healthy = false
            do {
                // Connect in a task of its own: cancelling the node must not abandon a channel NIO has created.
                let connecting = Task {
                    try await ClientBootstrap(group: group)
                        .connectTimeout(.seconds(3))
                        .connect(host: address.host, port: address.port) { channel in
                            setup.configure(channel, role: .client)
                        }
                }
                let channel = try await connecting.value
                if Task.isCancelled {
                    try? await channel.executeThenClose { _, _ in }
                    return
                }
                dials[address.description, default: 0] += 1
                let outcome = await handle(channel, dialed: true, address: address.description)
                // Only a connection that finished a round and ended without a failure or a refusal starts the
                // backoff again; a refusal after the handshake (a clock too far ahead, a failing apply) backs off
                // like a refused dial.
                healthy = outcome.healthy
                if let failure = outcome.error, !outcome.established {
                    dialFailed(address, site: site, reason: outcome.refusal.map { "the peer refused: \($0.message)" } ?? failure.message)
                }
            } catch {
                dials[address.description, default: 0] += 1
                let reason = DialFailure.describe(error, address: address)
                dialFailed(address, site: site, reason: reason)
                if let line = failures.note(address.description, reason) {
                    eventSink.yield(.connectionFailed(address: address.description, reason: line))
                    configuration.logger.debug("dial failed", metadata: ["peer": "\(address)", "error": "\(line)"])
                }
            }
            if healthy {
                backoff = configuration.backoffInitialMilliseconds
                failures.clear(address.description)
            }
            let jittered = UInt64(Double(backoff) * Double.random(in: 0.8...1.2))
            if let known = site ?? addressSites[address.description] {
                peers[known]?.retryDelayMilliseconds = healthy ? nil : jittered
            }
            addressRetry[address.description] = healthy ? nil : jittered
            try? await Task.sleep(for: .milliseconds(jittered))
            backoff = min(backoff * 2, configuration.backoffMaximumMilliseconds)
        }
    }

    /// How many times each address was dialled (connections made or attempted).
    private var dials: [String: Int] = [:]
    /// The delay before each address is dialled again, while it is failing.
    private var addressRetry: [String: UInt64] = [:]

    /// How many times the node dialled `address` (connected or tried to), since it started.
    public func dialCount(_ address: PeerAddress) -> Int { dials[address.description] ?? 0 }

    /// Configured peers never reached yet: their address, how they were learned, and why they cannot be reached.
    public func unreachedPeers() -> [UnreachedPeer] {
        let identified = Set(addressSites.keys)
        return addressOrigins.keys.sorted().compactMap { address in
            guard !identified.contains(address), addressOrigins[address] == "static" else { return nil }
            let failure = addressFailures[address]
            return UnreachedPeer(
                address: address,
                foundBy: "static",
                attempts: dials[address] ?? 0,
                consecutiveFailures: failure?.count ?? 0,
                lastError: failure?.reason,
                retryDelayMilliseconds: addressRetry[address]
            )
        }
    }

    /// Failures of addresses whose peer is not known yet.
    private var addressFailures: [String: (count: Int, reason: String)] = [:]

    // MARK: - Triggers

    private func watchLocalChanges() async throws {
        // A failed first capture is retried with backoff by the worker, like any later one.
        _ = try? await worker.changedElsewhere()
        while !Task.isCancelled {
            try await Task.sleep(for: .milliseconds(configuration.localChangePollMilliseconds))
            do {
                if try await worker.changedElsewhere() { broadcast(.localChange) }
            } catch {
                // Retried with backoff by the worker; other writers' changes wait, nothing is lost.
                configuration.logger.warning(
                    "capturing other connections' writes failed",
                    metadata: ["error": "\(error)"]
                )
            }
        }
    }

    private func periodicRounds() async throws {
        while !Task.isCancelled {
            let interval = Double(configuration.roundIntervalMilliseconds) * Double.random(in: 0.8...1.2)
            try await Task.sleep(for: .milliseconds(UInt64(interval)))
            broadcast(.localChange)
        }
    }

    /// Records an address of a peer learned of without a connection (found by mDNS, or remembered), and lists
    /// the peer if it is new, so status shows it and why it cannot be reached.
    private func notePeer(_ site: SiteID, name: String, address: PeerAddress, foundBy: String) {
        knownAddresses[site, default: []].insert(address.description)
        guard peers[site] == nil else { return }
        var status = PeerStatus(siteID: site, name: name, address: address.description, isConnected: false)
        status.foundBy = foundBy
        peers[site] = status
    }

    /// Counts a failed attempt to reach the peer behind `address`, when it is known.
    private func dialFailed(_ address: PeerAddress, site: SiteID?, reason: String) {
        addressFailures[address.description] = ((addressFailures[address.description]?.count ?? 0) + 1, reason)
        guard let site = site ?? addressSites[address.description], peers[site]?.isConnected == false else { return }
        peers[site]?.consecutiveFailures += 1
        peers[site]?.lastError = reason
    }

    /// Keeps the change log from growing with overwritten entries, a slice at a time so writers and rounds
    /// never wait long.
    private func compactPeriodically() async throws {
        while !Task.isCancelled {
            try await Task.sleep(for: .milliseconds(configuration.compactionIntervalMilliseconds))
            var pass = CompactionReport()
            repeat {
                do {
                    pass = try await worker.compactLog(maxEntries: 5_000)
                } catch {
                    configuration.logger.warning("change-log compaction failed", metadata: ["error": "\(error)"])
                    break
                }
                if pass.removed > 0 || pass.keysDropped > 0 {
                    configuration.logger.debug(
                        "compacted the change log",
                        metadata: ["removed": "\(pass.removed)", "keysDropped": "\(pass.keysDropped)"]
                    )
                }
                if !pass.reachedEnd { try await Task.sleep(for: .seconds(1)) }
            } while !pass.reachedEnd && !Task.isCancelled
        }
    }

    /// Repeating failures, logged once with a count.
    private var failures = RepeatingFailures()
    /// Peers whose last failure was their refusal of our changes.
    private var refusedByPeer: Set<SiteID> = []
    /// How far ahead of local time each peer's clocks last looked.
    private var clockViews: [SiteID: ClockView] = [:]

    /// Set once the node stops: connections still arriving are closed at once.
    private var shuttingDown = false

    private func closeAllConnections() {
        shuttingDown = true
        for inbox in registry.inboxes { inbox.yield(.shutdown) }
    }

    private func broadcast(_ event: ConnectionEvent) {
        for inbox in registry.inboxes { inbox.yield(event) }
    }

    // MARK: - Connections

    /// Records an established connection; `false` when it duplicates a live one and must close.
    ///
    /// Of two connections between the same pair, both sides keep the one dialled by the smaller site id.
    private func established(_ id: Int, peer hello: Hello, address: String) -> Admission {
        guard let entry = registry.entries[id] else { return .duplicate }
        // Learn who is behind a dialled address before anything else, so its dialer can stand by while that
        // peer is connected, even when this connection loses to another one.
        if entry.dialed { addressSites[address] = hello.siteID }
        let (admission, evicted) = registry.establish(id, peer: hello.siteID)
        evicted?.yield(.duplicate)
        guard admission == .accepted else { return admission }
        var status =
            peers[hello.siteID]
            ?? PeerStatus(siteID: hello.siteID, name: hello.nodeName, address: address, isConnected: true)
        status.isConnected = true
        status.everConnected = true
        // A failure is cleared by a finished round, not by a handshake: a peer whose rounds keep failing stays
        // "failing" in the status while it reconnects.
        status.name = hello.nodeName
        status.address = address
        // How we learned of it: the origin of the address dialled; for a peer that dialled us, what we knew of
        // it before (found by mDNS, remembered, …), or "inbound" for a stranger.
        if entry.dialed { status.foundBy = addressOrigins[address] ?? "static" }
        peers[hello.siteID] = status
        // While the same failure repeats, its reconnections are not announced each time.
        if !failures.isRepeating(hello.siteID.hex) {
            eventSink.yield(.peerConnected(hello.siteID, name: hello.nodeName, address: address))
        }
        // Remember where to reach it: the address dialled, or its IP with the port it says it listens on.
        let reachable: PeerAddress? =
            entry.dialed
            ? PeerAddress(parsing: address)
            : (hello.listenPort == 0
                ? nil : PeerAddress(parsing: address).map { PeerAddress(host: $0.host, port: Int(hello.listenPort)) })
        if entry.dialed { knownAddresses[hello.siteID, default: []].insert(address) }
        if let reachable, let ip = entry.remoteIP {
            knownAddresses[hello.siteID, default: []].insert(PeerAddress(host: ip, port: reachable.port).description)
        }
        if let reachable, configuration.rememberPeers {
            let worker = self.worker
            let site = hello.siteID
            Task { try? await worker.rememberPeer(site, host: reachable.host, port: reachable.port) }
        }
        return .accepted
    }

    private func closed(_ id: Int, error: ShoalError?, refusal: Rejection? = nil) {
        guard let entry = registry.remove(id) else { return }
        guard let peer = entry.peer else { return }
        if !registry.isConnected(peer) { peers[peer]?.isConnected = false }
        // Errors while this node stops (a send cut short, …) say nothing about the peer.
        if shuttingDown {
            eventSink.yield(.peerDisconnected(peer, reason: "this node is stopping"))
            return
        }
        // A failure is what this side refused, or what the peer refused us for; the peer stopping or keeping
        // another connection is not one.
        var failure: String?
        if let refusal, ![.duplicateConnection, .shuttingDown].contains(refusal.reason) {
            failure = "the peer refused: \(refusal.message)"
        } else if let error, error.code != .rejected {
            failure = error.message
        }
        if let failure {
            // A refusal by the peer is over once the peer acknowledges our changes; one of ours once our pull
            // finishes (the other direction may work all along).
            if refusal != nil { refusedByPeer.insert(peer) } else { refusedByPeer.remove(peer) }
            peers[peer]?.consecutiveFailures += 1
            peers[peer]?.lastError = failure
            if let line = failures.note(peer.hex, failure) {
                configuration.logger.info(
                    "sync with a peer failed",
                    metadata: ["peer": "\(peer.hex.prefix(8))", "reason": "\(line)"]
                )
                eventSink.yield(.peerDisconnected(peer, reason: line))
            }
            return
        }
        eventSink.yield(.peerDisconnected(peer, reason: error?.message ?? "closed"))
    }

    private func roundFinished(peer: SiteID, applied: Int, milliseconds: UInt64) {
        peers[peer]?.lastSuccessfulSync = configuration.clock.nowMilliseconds()
        if !refusedByPeer.contains(peer) { failureOver(peer) }
        peers[peer]?.roundsFinished += 1
        peers[peer]?.recentRoundMilliseconds.append(milliseconds)
        if let count = peers[peer]?.recentRoundMilliseconds.count, count > 1_000 {
            peers[peer]?.recentRoundMilliseconds.removeFirst(count - 1_000)
        }
        eventSink.yield(.roundFinished(peer: peer, applied: applied))
    }

    private func failureOver(_ peer: SiteID) {
        refusedByPeer.remove(peer)
        peers[peer]?.consecutiveFailures = 0
        peers[peer]?.lastError = nil
        peers[peer]?.retryDelayMilliseconds = nil
        failures.clear(peer.hex)
    }

    private func acknowledged(peer: SiteID, _ ack: Ack) {
        if refusedByPeer.contains(peer) { failureOver(peer) }
        peers[peer]?.versionVector = ack.versionVector
        // No digest means the peer's is not current: forget the old one rather than report a stale match.
        peers[peer]?.digest = ack.digest.map { digest in
            digest.map { String($0, radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        }
    }

    /// Runs one connection to its end; returns whether the handshake succeeded, and why not.
    private func handle(
        _ channel: NIOAsyncChannel<WireMessage, WireMessage>,
        dialed: Bool,
        address: String
    ) async -> ConnectionDriver.Outcome {
        let (inbox, continuation) = AsyncStream.makeStream(of: ConnectionEvent.self)
        if shuttingDown || Task.isCancelled {
            try? await channel.executeThenClose { _, _ in }
            return ConnectionDriver.Outcome(established: false, error: nil)
        }
        let remoteIP = channel.channel.remoteAddress?.ipAddress
        let id: Int
        switch registry.register(dialed: dialed, remoteIP: remoteIP, inbox: continuation) {
        case .admitted(let registered):
            id = registered
        case .refused(let rejection):
            try? await channel.executeThenClose { _, outbound in try await outbound.write(.reject(rejection)) }
            return ConnectionDriver.Outcome(established: false, error: nil)
        }
        var driver = ConnectionDriver(
            id: id,
            address: address,
            worker: worker,
            delegate: self,
            settings: driverSettings
        )
        let hello: Hello
        do {
            hello = try await worker.hello(
                clusterID: configuration.clusterID,
                nodeName: configuration.nodeName,
                listenPort: UInt16(listeningPort ?? 0)
            )
        } catch {
            // Every channel NIO created must be closed through executeThenClose.
            try? await channel.executeThenClose { _, _ in }
            closed(id, error: error)
            return ConnectionDriver.Outcome(established: false, error: error, failedHere: true)
        }
        let outcome: ConnectionDriver.Outcome
        do {
            outcome = try await channel.executeThenClose { inbound, outbound in
                let stream = ChannelMessageStream(inbound: inbound, outbound: outbound, channel: channel.channel)
                return await driver.run(hello: hello, over: stream, inbox: inbox, events: continuation)
            }
        } catch {
            outcome = ConnectionDriver.Outcome(established: false, error: DialFailure.connectionLost(error))
        }
        if !outcome.established, let error = outcome.error {
            let reason = outcome.refusal.map { "the peer refused: \($0.message)" } ?? error.message
            if let line = failures.note(address, reason) {
                eventSink.yield(.connectionFailed(address: address, reason: line))
            }
        }
        closed(id, error: outcome.error, refusal: outcome.refusal)
        return outcome
    }

    /// What every connection's driver runs with.
    private var driverSettings: ConnectionDriver.Settings {
        ConnectionDriver.Settings(
            session: configuration.session,
            maxChangesPerBatch: configuration.maxChangesPerBatch,
            maxBytesPerBatch: configuration.maxBytesPerBatch,
            clock: configuration.clock
        )
    }

    // MARK: - ConnectionDelegate (what the connections' drivers report)

    func connectionEstablished(_ id: Int, peer: Hello, address: String) -> Admission {
        established(id, peer: peer, address: address)
    }

    func connectionRoundFinished(peer: SiteID, applied: Int, milliseconds: UInt64) {
        roundFinished(peer: peer, applied: applied, milliseconds: milliseconds)
    }

    func connectionProgress(peer: SiteID, changes: Int, remaining: UInt64, milliseconds: UInt64) {
        eventSink.yield(
            .catchUpProgress(peer: peer, changes: changes, remaining: remaining, milliseconds: milliseconds)
        )
    }

    func connectionAcknowledged(peer: SiteID, _ ack: Ack) {
        acknowledged(peer: peer, ack)
    }

    func connectionRoundFailed(peer: SiteID, reason: String) {
        peers[peer]?.roundsFailed += 1
        peers[peer]?.lastError = reason
    }

    /// Notes how far ahead of local time the clocks of a batch a peer sent were (negative: behind), as a view
    /// to compare a later clock refusal with.
    func connectionClockView(peer: SiteID, aheadMilliseconds: Int64) {
        clockViews[peer] = ClockView(ahead: aheadMilliseconds, refused: false)
    }

    /// Rewrites a clock refusal so that it says how far apart the clocks are, which one looks wrong when
    /// another peer gives a third view, and what happens meanwhile.
    func describeClockRefusal(_ error: ShoalError, batch: ChangeBatch, peer: SiteID?) -> ShoalError {
        let now = configuration.storeOptions.clock.nowMilliseconds()
        let newest = batch.changes.map(\.stamp.hlc.milliseconds).max() ?? now
        let ahead = Int64(newest) - Int64(now)
        guard let peer else { return error }
        clockViews[peer] = ClockView(ahead: ahead, refused: true)
        let others = clockViews.filter { $0.key != peer }.map { (site: $0.key, view: $0.value) }
        let name = peers[peer].map { "\($0.name.isEmpty ? "" : $0.name + " ")\(peer.hex.prefix(8))" } ?? "\(peer.hex.prefix(8))"
        let message = ClockRefusal.message(
            peer: name,
            aheadMilliseconds: ahead,
            boundMilliseconds: configuration.storeOptions.maximumClockDriftMilliseconds,
            otherViews: others.map { (peers[$0.site]?.name ?? String($0.site.hex.prefix(8)), $0.view) }
        )
        return ShoalError(code: .clockTooFarAhead, message: message)
    }
}

extension SyncNode: ConnectionDelegate {}
