import NIOCore
import ShoalCore
import ShoalProtocol
import ShoalStore

/// Connections: running each one's driver, admitting it, and recording how it went.
extension SyncNode {
    /// Runs one connection to its end; returns whether the handshake succeeded, and why not.
    func handle(
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
        case .admitted(let registered, let evicting):
            id = registered
            evicting?.yield(.evicted)
        case .refused(let rejection):
            try? await channel.executeThenClose { _, outbound in try await outbound.write(.reject(rejection)) }
            return ConnectionDriver.Outcome(established: false, error: nil)
        }
        // Who is there, before a byte of ours: with TLS, the handshake's check of the peer's key against the roster.
        let identity: PeerIdentity?
        do {
            identity = try await channelSetup.authenticatedPeer(of: channel.channel)
        } catch {
            try? await channel.executeThenClose { _, _ in }
            closed(id, error: error)
            noteHandshakeFailure(error.message, dialed: dialed, address: address, remoteIP: remoteIP)
            return ConnectionDriver.Outcome(established: false, error: error)
        }
        if let identity {
            registry.identify(id, as: identity)
            if identity.purpose == .join {
                if let authorizer = configuration.peerAuthorizer, !dialed {
                    await authorizer.join(channel, identity: identity, address: address)
                } else {
                    try? await channel.executeThenClose { _, _ in }
                }
                closed(id, error: nil)
                return ConnectionDriver.Outcome(established: false, error: nil)
            }
        }
        var settings = driverSettings
        // On an authenticated link the dialler speaks second: the accepting side checks its key last (in TLS 1.3 the
        // client's certificate is checked after the client's handshake ended), and nothing is sent before that.
        settings.session.speaksFirst = !(dialed && identity != nil)
        // One side keeps a quiet link alive: the dialler pings, the other hears it (and answers).
        settings.session.sendsKeepalives = dialed
        // Bytes to a peer on this machine never cross a network: compressing them would only cost CPU.
        if !configuration.compressesLoopback, Self.isLoopback(remoteIP) { settings.session.compression = false }
        var driver = ConnectionDriver(
            id: id,
            address: address,
            worker: worker,
            delegate: self,
            settings: settings
        )
        var hello: Hello
        do {
            hello = try await worker.hello(
                clusterID: configuration.clusterID,
                nodeName: configuration.nodeName,
                listenPort: UInt16(listeningPort ?? 0)
            )
            members.named(siteID, hello.nodeName)
            let highest = max(hello.versions.lowerBound, min(hello.versions.upperBound, settings.session.highestVersion))
            hello.versions = hello.versions.lowerBound...highest
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
        if !outcome.established, !outcome.duplicate, let error = outcome.error {
            let reason = outcome.refusal.map { "the peer refused: \($0.message.printable(limit: 300))" } ?? error.message
            noteHandshakeFailure(reason, dialed: dialed, address: address, remoteIP: remoteIP)
        }
        closed(id, error: outcome.error, refusal: outcome.refusal)
        return outcome
    }

    /// Reports a connection that failed before its handshake ended, once per repeating failure.
    private func noteHandshakeFailure(_ reason: String, dialed: Bool, address: String, remoteIP: String?) {
        if dialed {
            if let line = failures.note(address, reason) {
                eventSink.yield(.connectionFailed(address: address, reason: line))
            }
        } else if let line = failures.note("from \(remoteIP ?? address)", reason, retrying: false) {
            // Counted by remote IP: each inbound connection has a port of its own.
            eventSink.yield(.inboundConnectionFailed(address: remoteIP ?? address, reason: line))
        }
    }

    /// Closes every connection with a node in `nodes` (removed from the roster); returns how many.
    @discardableResult
    public func closeConnections(of nodes: Set<NodeID>) -> Int {
        let inboxes = registry.entries.values.filter { entry in
            entry.identity.map { nodes.contains($0.nodeID) } ?? false
        }.map(\.inbox)
        for inbox in inboxes { inbox.yield(.revoked) }
        return inboxes.count
    }

    /// How many duplicate refusals within ``strayDuplicateWindowMilliseconds``, with no connection to the peer held
    /// here, mean that another process is connected to it as this node (two such processes take turns: each
    /// connection the peer takes evicts the other's, so rounds still finish now and then).
    static let strayDuplicateLimit = 3
    static let strayDuplicateWindowMilliseconds: UInt64 = 60_000

    /// What every connection's driver runs with.
    private var driverSettings: ConnectionDriver.Settings {
        ConnectionDriver.Settings(
            session: configuration.session,
            maxChangesPerBatch: configuration.maxChangesPerBatch,
            maxBytesPerBatch: configuration.maxBytesPerBatch,
            clock: configuration.clock,
            stopping: stopping
        )
    }

    /// Records that connection `id` ended (with `error`, or refused by the peer).
    private func closed(_ id: Int, error: ShoalError?, refusal: Rejection? = nil) {
        guard let entry = registry.remove(id) else { return }
        guard let peer = entry.peer else { return }
        if !registry.isConnected(peer) {
            directory.disconnected(peer)
            // Heard from until now: a member idle on a live link sends no reports, and its silence (for the
            // collection horizon) starts when the link goes down, not at its last report.
            members.heardDirectly(peer, at: configuration.clock.nowMilliseconds())
            for watcher in disconnectionWatchers.values { watcher.yield(peer) }
        }
        // Errors while this node stops (a send cut short, …) say nothing about the peer.
        if shuttingDown {
            eventSink.yield(.peerDisconnected(peer, reason: "this node is stopping"))
            return
        }
        // A failure is what this side refused, or what the peer refused us for; the peer stopping or keeping
        // another connection is not one.
        var failure: String?
        if let refusal, ![.duplicateConnection, .shuttingDown].contains(refusal.reason) {
            failure = "the peer refused: \(refusal.message.printable(limit: 300))"
        } else if let error, error.code != .rejected {
            failure = error.message
        }
        // Refused as a duplicate while this node holds no connection to the peer: once is two nodes dialling each
        // other at once; again and again, the peer is connected to another process as this node (a copy of this
        // database that kept its key file runs elsewhere), and this node syncs with it no more.
        if refusal?.reason == .duplicateConnection, !registry.isConnected(peer) {
            let now = configuration.clock.monotonicMilliseconds()
            let recent = (strayDuplicateRefusals[peer] ?? []).filter { now - $0 < Self.strayDuplicateWindowMilliseconds }
            strayDuplicateRefusals[peer] = recent + [now]
            if recent.count + 1 >= Self.strayDuplicateLimit {
                failure =
                    "the peer keeps a connection from another process as this node (the same key): a copy of this "
                    + "database that kept its key file runs elsewhere? Stop one of the two; to make the copy another "
                    + "node, remove its key file, then run shoal init --new-key and shoal join"
            }
        }
        guard let failure else {
            eventSink.yield(.peerDisconnected(peer, reason: error?.message ?? "closed"))
            return
        }
        directory.failed(peer, reason: failure, refusedByPeer: refusal != nil)
        if let line = failures.note(peer.hex, failure) {
            configuration.logger.info(
                "sync with a peer failed",
                metadata: ["peer": "\(peer.hex.prefix(8))", "reason": "\(line)"]
            )
            eventSink.yield(.peerDisconnected(peer, reason: line))
        }
    }
}

/// What the connections' drivers report.
extension SyncNode: ConnectionDelegate {
    func pullStarting(_ id: Int, expecting: VersionVector) {
        pullsUnderWay[id] = expecting
    }

    func pullEnded(_ id: Int) {
        guard pullsUnderWay.removeValue(forKey: id) != nil, pullsPutOff else { return }
        pullsPutOff = false
        broadcast(.pullsEnded)
    }

    func pullUnderWay(covering vector: VersionVector, except id: Int) -> Bool {
        let covered = pullsUnderWay.contains { $0.key != id && $0.value.dominatesOrEquals(vector) }
        if covered { pullsPutOff = true }
        return covered
    }

    /// Records an established connection, unless it duplicates a live one or the node is full.
    ///
    /// Of two connections between the same pair, both sides keep the one dialled by the smaller site id.
    func connectionEstablished(_ id: Int, peer hello: Hello, address: String) -> Admission {
        guard let entry = registry.entries[id] else { return .duplicate }
        if let authorizer = configuration.peerAuthorizer,
            let rejection = authorizer.authorize(hello, identity: entry.identity)
        {
            return .refused(rejection)
        }
        // Learn who is behind a dialled address before anything else, so its dialer can stand by while that
        // peer is connected, even when this connection loses to another one.
        if entry.dialed, let dialled = PeerAddress(parsing: address) { directory.learnSite(hello.siteID, at: dialled) }
        let (admission, evicted) = registry.establish(id, peer: hello.siteID)
        evicted?.yield(.duplicate)
        guard admission == .accepted else { return admission }
        let reachable = directory.connected(hello, address: address, dialed: entry.dialed, remoteIP: entry.remoteIP)
        // While the same failure repeats, its reconnections are not announced each time.
        if !failures.isRepeating(hello.siteID.hex) {
            eventSink.yield(.peerConnected(hello.siteID, name: hello.nodeName, address: address))
            members.named(hello.siteID, hello.nodeName)
        }
        // Remember where to reach it: the address dialled, at once; for a peer that dialled us, its IP with the port
        // it says it listens on, once a round with it finished (anyone can send a hello; the list would fill with
        // addresses nobody listens at, each dialled after a restart).
        if let reachable, configuration.rememberPeers {
            if entry.dialed {
                remember(hello.siteID, at: reachable)
            } else {
                toRemember[hello.siteID] = reachable
            }
        }
        return .accepted
    }

    private func remember(_ site: SiteID, at address: PeerAddress) {
        let worker = self.worker
        Task { try? await worker.rememberPeer(site, host: address.host, port: address.port) }
    }

    func connectionRoundFinished(peer: SiteID, applied: Int, milliseconds: UInt64) {
        if let address = toRemember.removeValue(forKey: peer) { remember(peer, at: address) }
        if directory.roundFinished(peer, milliseconds: milliseconds, now: configuration.clock.nowMilliseconds()) {
            failures.clear(peer.hex)
        }
        eventSink.yield(.roundFinished(peer: peer, applied: applied))
    }

    func connectionProgress(peer: SiteID, changes: Int, bytes: Int, remaining: UInt64, milliseconds: UInt64) {
        directory.progress(
            peer,
            CatchUpProgress(changes: changes, bytes: bytes, remaining: remaining, milliseconds: milliseconds)
        )
        eventSink.yield(
            .catchUpProgress(peer: peer, changes: changes, remaining: remaining, milliseconds: milliseconds)
        )
    }

    func connectionAcknowledged(peer: SiteID, _ ack: Ack) {
        if members.heard(peer, holds: ack.versionVector, at: configuration.clock.nowMilliseconds(), from: .direct) {
            collectionWaker.yield()
        }
        if directory.acknowledged(peer, ack) { failures.clear(peer.hex) }
        wakeAcknowledgementWaiters()
        // Compared apart from the connection's loop: it reads the store.
        if ack.digest != nil { uncomparedDigests.insert(peer) }
        Task { await self.compareAcknowledgedDigests(refreshing: true) }
        if awaitingFreshState {
            offerFreshState(
                peer: peer,
                peerVector: ack.versionVector,
                localVector: worker.latestVersionVector.withLock { $0 }
            )
        }
    }

    /// Admits an inspection (`shoal verify --peer`) from a peer the authorizer lets in: apart from the sync links,
    /// so it is never a duplicate of one.
    func inspectionStarted(_ id: Int, peer hello: Hello, address: String) -> Admission {
        guard let entry = registry.entries[id], !shuttingDown else { return .full }
        if let authorizer = configuration.peerAuthorizer,
            let rejection = authorizer.authorize(hello, identity: entry.identity)
        {
            return .refused(rejection)
        }
        guard registry.inspecting(id) else { return .full }
        configuration.logger.info(
            "a peer inspects this node's digests (shoal verify)",
            metadata: ["peer": "\(hello.siteID.hex.prefix(8))", "address": "\(address)"]
        )
        return .accepted
    }

    func connectionPeerHolds(peer: SiteID, _ vector: VersionVector) {
        if members.heard(peer, holds: vector, at: configuration.clock.nowMilliseconds(), from: .direct) {
            collectionWaker.yield()
        }
        directory.holds(peer, vector)
    }

    func connectionMemberReports(peer: SiteID, _ reports: [MemberGossip]) {
        let generation = members.generation
        members.passedOn(reports, by: peer, own: registry.localSite, now: configuration.clock.nowMilliseconds())
        if members.generation != generation { collectionWaker.yield() }
    }

    func memberGossip(for peer: SiteID, since generation: Int?, refresh: Bool) async -> (Int, [MemberGossip])? {
        let now = configuration.clock.nowMilliseconds()
        if let local = try? await worker.versionVector() { members.heard(siteID, holds: local, at: now, from: .local) }
        guard refresh || generation != members.generation else { return nil }
        return (members.generation, members.gossip(for: peer, now: now))
    }

    func connectionRoundFailed(peer: SiteID, reason: String) {
        directory.roundFailed(peer, reason: reason)
    }

    /// Notes how far ahead of local time the clocks of a batch a peer sent were (negative: behind), as a view
    /// to compare a later clock refusal with.
    func connectionClockView(peer: SiteID, aheadMilliseconds: Int64) {
        clockViews[peer] = ClockView(ahead: aheadMilliseconds, refused: false)
    }

    /// Rewrites a clock refusal so that it says how far apart the clocks are, which one looks wrong when
    /// another peer gives a third view, and what happens meanwhile.
    func describeClockRefusal(_ error: ShoalError, batch: ChangeBatch, peer: SiteID?) -> ShoalError {
        let now = configuration.clock.nowMilliseconds()
        let newest = batch.changes.map(\.stamp.hlc.milliseconds).max() ?? now
        let ahead = Int64(newest) - Int64(now)
        guard let peer else { return error }
        clockViews[peer] = ClockView(ahead: ahead, refused: true)
        let others = clockViews.filter { $0.key != peer }.map { (site: $0.key, view: $0.value) }
        let known = directory.status(of: peer)
        let name = known.map { "\($0.name.isEmpty ? "" : $0.name + " ")\(peer.hex.prefix(8))" } ?? "\(peer.hex.prefix(8))"
        let message = ClockRefusal.message(
            peer: name,
            aheadMilliseconds: ahead,
            boundMilliseconds: configuration.storeOptions.maximumClockDriftMilliseconds,
            otherViews: others.map { (directory.status(of: $0.site)?.name ?? String($0.site.hex.prefix(8)), $0.view) }
        )
        return ShoalError(code: .clockTooFarAhead, message: message)
    }
}

extension SyncNode {
    /// Whether `ip` is a loopback address (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6).
    static func isLoopback(_ ip: String?) -> Bool {
        guard let ip else { return false }
        return ip.hasPrefix("127.") || ip == "::1" || ip.hasPrefix("::ffff:127.")
    }
}
