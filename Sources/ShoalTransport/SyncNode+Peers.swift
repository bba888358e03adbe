import NIOCore
import NIOPosix
import ShoalCore
import ShoalStore

/// Which peer a dialler works for: a site once known, else the configured address.
enum DialerKey: Hashable {
    /// A peer whose site id is known (found by mDNS, remembered).
    case site(SiteID)
    /// A configured address, whose site is learnt at its first handshake.
    case address(PeerAddress)
}

/// One running dial loop.
struct Dialer {
    /// Where it dials.
    let address: PeerAddress
    /// When it started (monotonic milliseconds).
    let since: UInt64
    /// The loop.
    let task: Task<Void, Never>
}

/// Finding peers and dialling them: every peer source is followed, and what they find is dialled with backoff.
extension SyncNode {
    /// Follows the configured addresses, the remembered peers and every configured source until cancelled; then
    /// stops every dialler and waits for each to let go of its connection.
    func followPeerSources() async {
        guard let port = listeningPort else { return }
        let context = PeerSourceContext(
            siteID: siteID,
            clusterID: configuration.clusterID,
            clusterHint: configuration.clusterHint ?? NodeConfiguration.plainHint(configuration.clusterID),
            nodeID: configuration.nodeID.map { $0.description.replacingOccurrences(of: "-", with: "") },
            nodeName: configuration.nodeName ?? "shoal",
            listenHost: configuration.listenHost,
            listeningPort: port,
            logger: configuration.logger
        )
        // Configured addresses first, so that a remembered peer at one of them keeps its "static" origin.
        var sources: [any PeerSource] = [StaticPeerSource(configuration.staticPeers)]
        if configuration.rememberPeers {
            sources.append(RememberedPeerSource(peers: (try? await worker.knownPeers()) ?? []))
        }
        for source in sources {
            for await sighting in source.sightings(context) { seen(sighting) }
        }
        await withDiscardingTaskGroup { group in
            for source in configuration.peerSources {
                group.addTask {
                    for await sighting in source.sightings(context) { await self.seen(sighting) }
                }
            }
        }
        // The sources may all have finished: dialling goes on until the node stops.
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(3_600)) }
        let running = dialers.values.map(\.task)
        dialers.removeAll()
        for task in running { task.cancel() }
        for task in running { await task.value }
    }

    /// Handles one sighting from a source.
    private func seen(_ sighting: PeerSighting) {
        switch sighting {
        case .found(let candidate):
            found(candidate)
        case .lost:
            // A restarted node re-registers, and the removal of its old registration may arrive after the new
            // one: keep the dialer (its backoff copes with a peer that is really gone); the connection itself
            // notices the peer leaving.
            break
        case .available(let interface):
            eventSink.yield(.discoveryAvailable(interface: interface))
        case .unavailable(let reason):
            eventSink.yield(.discoveryUnavailable(reason))
            // Reported through the event (the CLI prints it); the log keeps a trace for library users.
            configuration.logger.debug("mDNS discovery is off", metadata: ["reason": "\(reason)"])
        }
    }

    /// Records a found peer and dials it. Both sides dial what they find (so a node that returns reconnects as
    /// soon as it sees the ones that stayed); of two connections between a pair, both keep the one dialled by
    /// the smaller site id, and a dialer waits while its peer is connected.
    private func found(_ candidate: PeerCandidate) {
        let address = candidate.address
        guard let site = candidate.siteID else {
            // A configured address: one dialler per address, for as long as the node runs.
            directory.found(candidate)
            guard dialers[.address(address)] == nil else { return }
            dialers[.address(address)] = startDialer(address, site: nil)
            return
        }
        guard site != siteID, !forgotten.contains(site) else { return }
        // A remembered peer at a configured address is that address's peer: its dialler is already running.
        if candidate.origin == .remembered, directory.origin(of: address) == .static { return }
        directory.found(candidate)
        // A peer that (re)appears while not connected gets a fresh dialer at once: a new port after a restart, or
        // the old one with its backoff reset. The same sighting again within moments (once per address family)
        // changes nothing.
        let now = configuration.clock.monotonicMilliseconds()
        if let current = dialers[.site(site)] {
            let justStarted = now - current.since < 2_000
            if current.address == address && (directory.isConnected(site) || justStarted) { return }
            current.task.cancel()
        }
        if candidate.origin == .mdns {
            eventSink.yield(.peerDiscovered(site, address: address.description))
        }
        dialers[.site(site)] = startDialer(address, site: site)
    }

    /// Stops dialling the peer of site `site` and forgets its remembered address: a node removed from the cluster
    /// (addresses given with `--peer` are dialled still: a person asked for them).
    public func forget(_ site: SiteID) async {
        forgotten.insert(site)
        toRemember[site] = nil
        dialers.removeValue(forKey: .site(site))?.task.cancel()
        try? await worker.forgetPeer(site)
    }

    private func startDialer(_ address: PeerAddress, site: SiteID?) -> Dialer {
        Dialer(
            address: address,
            since: configuration.clock.monotonicMilliseconds(),
            task: Task { await self.dialLoop(address, site: site) }
        )
    }

    /// A stream of the peers whose last connection just closed, until the node stops.
    func disconnections() -> AsyncStream<SiteID> {
        let (stream, continuation) = AsyncStream.makeStream(of: SiteID.self, bufferingPolicy: .bufferingNewest(16))
        nextChangeWatcher += 1
        let id = nextChangeWatcher
        disconnectionWatchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.dropDisconnectionWatcher(id) } }
        return stream
    }

    private func dropDisconnectionWatcher(_ id: Int) {
        disconnectionWatchers[id] = nil
    }

    /// Dials `address` until cancelled: connects, runs the connection, and after it ends dials again with
    /// backoff (from the shortest delay again only after a healthy connection).
    private func dialLoop(_ address: PeerAddress, site: SiteID?) async {
        directory.noteOrigin(.static, of: address)
        var backoff = Backoff(
            initialMilliseconds: configuration.backoffInitialMilliseconds,
            maximumMilliseconds: configuration.backoffMaximumMilliseconds
        )
        let setup = channelSetup
        let group = configuration.eventLoopGroup
        var disconnected = disconnections().makeAsyncIterator()
        while !Task.isCancelled {
            if let site = site ?? directory.site(at: address), directory.isConnected(site) {
                // Already connected to this peer (it dialled us): dial once that connection ends, not before.
                configuration.logger.trace(
                    "connected to the peer already: dialling once that connection ends",
                    metadata: ["peer": "\(address)", "site": "\(site.hex.prefix(8))"]
                )
                while true {
                    guard let gone = await disconnected.next() else { return }  // the node stopped
                    if gone == site { break }
                }
                continue
            }
            var healthy = false
            configuration.logger.trace("dialling", metadata: ["peer": "\(address)"])
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
                directory.dialed(address)
                configuration.logger.trace("connected; handshake next", metadata: ["peer": "\(address)"])
                let outcome = await handle(channel, dialed: true, address: address.description)
                configuration.logger.trace(
                    "connection ended",
                    metadata: [
                        "peer": "\(address)", "established": "\(outcome.established)", "healthy": "\(outcome.healthy)",
                        "error": "\(outcome.error.map { $0.message } ?? "none")",
                    ]
                )
                // Only a connection that finished a round and ended without a failure or a refusal starts the
                // backoff again; a refusal after the handshake (a clock too far ahead, a failing apply) backs off
                // like a refused dial.
                healthy = outcome.healthy
                if let failure = outcome.error, !outcome.established {
                    let reason = outcome.refusal.map { "the peer refused: \($0.message)" } ?? failure.message
                    directory.dialFailed(address, site: site, reason: reason)
                }
            } catch {
                directory.dialed(address)
                let reason = DialFailure.describe(error, address: address)
                directory.dialFailed(address, site: site, reason: reason)
                if let line = failures.note(address.description, reason) {
                    eventSink.yield(.connectionFailed(address: address.description, reason: line))
                    configuration.logger.debug("dial failed", metadata: ["peer": "\(address)", "error": "\(line)"])
                }
            }
            if healthy {
                backoff.reset()
                failures.clear(address.description)
            }
            let delay = backoff.next()
            directory.retry(address, site: site, in: healthy ? nil : delay)
            try? await Task.sleep(for: .milliseconds(delay))
        }
    }
}
