import Foundation
import ShoalCore
import ShoalProtocol

/// Everything the node knows about its peers, as plain data: no I/O and no clock (times are passed in).
///
/// Peers are keyed by site id once known; addresses by ``PeerAddress``. An address given in the configuration
/// has no site until its first handshake says who answers there (``learnSite(_:at:)``); until then it is an
/// "unreached" peer with its own failure count.
struct PeerDirectory {
    /// Each peer seen (found by a source, or connected), by site.
    private var peers: [SiteID: PeerStatus] = [:]
    /// How each address was learned.
    private var origins: [PeerAddress: PeerOrigin] = [:]
    /// The site behind each address dialled, learned at its first handshake.
    private var sites: [PeerAddress: SiteID] = [:]
    /// Every address each peer is known at (see ``PeerStatus/addresses``).
    private var addresses: [SiteID: Set<PeerAddress>] = [:]
    /// How many times each address was dialled.
    private var dials: [PeerAddress: Int] = [:]
    /// The delay before each failing address is dialled again.
    private var retries: [PeerAddress: UInt64] = [:]
    /// Failures of each address (for addresses whose peer is not known yet).
    private var addressFailures: [PeerAddress: (count: Int, reason: String)] = [:]
    /// Peers whose last failure was their refusal of our changes: over once they acknowledge our changes.
    private var refusedBy: Set<SiteID> = []

    // MARK: - Reading

    /// Every peer, sorted by site, with its known addresses.
    func statuses() -> [PeerStatus] {
        peers.values.sorted { $0.siteID < $1.siteID }.map { peer in
            var peer = peer
            peer.addresses = (addresses[peer.siteID] ?? []).sorted().map(\.description)
            return peer
        }
    }

    /// One peer's record.
    func status(of site: SiteID) -> PeerStatus? { peers[site] }

    /// Whether a connection with `site` is established.
    func isConnected(_ site: SiteID) -> Bool { peers[site]?.isConnected ?? false }

    /// The site known to answer at `address`.
    func site(at address: PeerAddress) -> SiteID? { sites[address] }

    /// How `address` was learned.
    func origin(of address: PeerAddress) -> PeerOrigin? { origins[address] }

    /// How many times `address` was dialled.
    func dialCount(_ address: PeerAddress) -> Int { dials[address] ?? 0 }

    /// The highest sequence number of `site`'s changes that any peer acknowledged holding.
    func highestAcknowledged(of site: SiteID) -> UInt64 {
        peers.values.map { $0.versionVector[site] }.max() ?? 0
    }

    /// What each peer that ever connected acknowledged holding, and whether it is connected now.
    func acknowledgedVectors() -> [(site: SiteID, connected: Bool, vector: VersionVector)] {
        peers.values.filter(\.everConnected).map { ($0.siteID, $0.isConnected, $0.versionVector) }
    }

    /// Configured addresses never reached: where, how many attempts, why they failed, when the next one is.
    func unreachedPeers() -> [UnreachedPeer] {
        origins.filter { $0.value == .static && sites[$0.key] == nil }.keys.sorted().map { address in
            let failure = addressFailures[address]
            return UnreachedPeer(
                address: address.description,
                foundBy: .static,
                attempts: dials[address] ?? 0,
                consecutiveFailures: failure?.count ?? 0,
                lastError: failure?.reason,
                retryDelayMilliseconds: retries[address]
            )
        }
    }

    // MARK: - Finding

    /// Records how `address` was learned, unless it is known already (the first origin stays).
    mutating func noteOrigin(_ origin: PeerOrigin, of address: PeerAddress) {
        if origins[address] == nil { origins[address] = origin }
    }

    /// Records a peer found without a connection (by a source): its address, and the peer itself if it is new,
    /// so status lists it, and why it cannot be reached, before any connection.
    mutating func found(_ candidate: PeerCandidate) {
        // An address seen on the network is reported as found there, whatever was known of it before.
        if candidate.origin == .mdns { origins[candidate.address] = .mdns }
        noteOrigin(candidate.origin, of: candidate.address)
        guard let site = candidate.siteID else { return }
        addresses[site, default: []].insert(candidate.address)
        for other in candidate.otherAddresses { addresses[site, default: []].insert(other) }
        guard peers[site] == nil else { return }
        var status = PeerStatus(
            siteID: site,
            name: candidate.name,
            address: candidate.address.description,
            isConnected: false
        )
        status.foundBy = candidate.origin
        peers[site] = status
    }

    // MARK: - Dialling

    /// Counts one dial of `address` (connected or attempted).
    mutating func dialed(_ address: PeerAddress) {
        dials[address, default: 0] += 1
    }

    /// Counts a failed attempt to reach `address` (and its peer, when known and not connected otherwise).
    mutating func dialFailed(_ address: PeerAddress, site: SiteID?, reason: String) {
        addressFailures[address] = ((addressFailures[address]?.count ?? 0) + 1, reason)
        guard let site = site ?? sites[address], peers[site]?.isConnected == false else { return }
        peers[site]?.consecutiveFailures += 1
        peers[site]?.lastError = reason
    }

    /// Records when `address` (and its peer) is dialled next: `nil` once it is healthy again.
    mutating func retry(_ address: PeerAddress, site: SiteID?, in delay: UInt64?) {
        if let known = site ?? sites[address] { peers[known]?.retryDelayMilliseconds = delay }
        retries[address] = delay
    }

    // MARK: - Connections

    /// Learns that `site` answers at the dialled `address`.
    mutating func learnSite(_ site: SiteID, at address: PeerAddress) {
        sites[address] = site
    }

    /// Records an established connection with `hello`'s node at `address` (as dialled, or as the socket saw
    /// it). Returns the address to remember it at: the one dialled, or its IP with the port it listens on.
    mutating func connected(
        _ hello: Hello,
        address: String,
        dialed: Bool,
        remoteIP: String?
    ) -> PeerAddress? {
        let site = hello.siteID
        var status = peers[site] ?? PeerStatus(siteID: site, name: hello.nodeName, address: address, isConnected: true)
        status.isConnected = true
        status.everConnected = true
        // A failure is cleared by a finished round, not by a handshake: a peer whose rounds keep failing stays
        // "failing" in the status while it reconnects.
        status.name = hello.nodeName
        status.address = address
        // How we learned of it: the origin of the address dialled; for a peer that dialled us, what we knew of it
        // before (found by mDNS, remembered, …), or "inbound" for a stranger.
        if dialed, let parsed = PeerAddress(parsing: address) { status.foundBy = origins[parsed] ?? .static }
        peers[site] = status
        let parsed = PeerAddress(parsing: address)
        let reachable: PeerAddress? =
            dialed
            ? parsed
            : (hello.listenPort == 0 ? nil : parsed.map { PeerAddress(host: $0.host, port: Int(hello.listenPort)) })
        if let reachable { peers[site]?.listeningAddress = reachable.description }
        if dialed, let parsed { addresses[site, default: []].insert(parsed) }
        if let reachable, let remoteIP {
            addresses[site, default: []].insert(PeerAddress(host: remoteIP, port: reachable.port))
        }
        return reachable
    }

    /// Records that the last connection with `site` closed.
    mutating func disconnected(_ site: SiteID) {
        peers[site]?.isConnected = false
    }

    /// Records a failed round or refused connection with `site`. A refusal by the peer is over once the peer
    /// acknowledges our changes; one of ours once our pull finishes (the other direction may work all along).
    mutating func failed(_ site: SiteID, reason: String, refusedByPeer: Bool) {
        if refusedByPeer { refusedBy.insert(site) } else { refusedBy.remove(site) }
        peers[site]?.consecutiveFailures += 1
        peers[site]?.lastError = reason
    }

    /// Records a round that failed here while the connection stays up.
    mutating func roundFailed(_ site: SiteID, reason: String) {
        peers[site]?.roundsFailed += 1
        peers[site]?.lastError = reason
    }

    /// Records how far a catch-up from `site` got, with its recent rate (``CatchUpProgress/recentRate``): over the
    /// reports of the last few seconds, so an ETA follows a catch-up whose pace changes, and not before the reports
    /// span a second (the wait for the first batch and the first batches' pace say little of the rest).
    mutating func progress(_ site: SiteID, _ progress: CatchUpProgress) {
        var progress = progress
        if let last = peers[site]?.catchUp, progress.milliseconds >= last.milliseconds,
            progress.changes >= last.changes
        {
            progress.reports = last.reports
        }
        progress.reports.append(CatchUpProgress.Report(milliseconds: progress.milliseconds, changes: progress.changes))
        let window = CatchUpProgress.windowMilliseconds
        let windowStart = progress.milliseconds > window ? progress.milliseconds - window : 0
        while progress.reports.count > 2, progress.reports[1].milliseconds <= windowStart {
            progress.reports.removeFirst()
        }
        if let first = progress.reports.first, progress.milliseconds - first.milliseconds >= 1_000 {
            progress.recentRate =
                Double(progress.changes - first.changes) * 1_000 / Double(progress.milliseconds - first.milliseconds)
        }
        peers[site]?.catchUp = progress
    }

    /// Records a finished pull from `site` that took `milliseconds`, at wall time `now`. Returns whether a failure
    /// ended with it.
    mutating func roundFinished(_ site: SiteID, milliseconds: UInt64, now: UInt64) -> Bool {
        peers[site]?.catchUp = nil
        peers[site]?.lastSuccessfulSync = now
        let recovered = !refusedBy.contains(site) && failureOver(site)
        peers[site]?.roundsFinished += 1
        peers[site]?.recentRoundMilliseconds.append(milliseconds)
        if let count = peers[site]?.recentRoundMilliseconds.count, count > 1_000 {
            peers[site]?.recentRoundMilliseconds.removeFirst(count - 1_000)
        }
        return recovered
    }

    /// Records what `site` acknowledged holding. Returns whether a failure (its refusal) ended with it.
    mutating func acknowledged(_ site: SiteID, _ ack: Ack) -> Bool {
        let recovered = refusedBy.contains(site) && failureOver(site)
        peers[site]?.versionVector = ack.versionVector
        // No digest means the peer's is not current: forget the old one rather than report a stale match.
        peers[site]?.digest = ack.digest.map { digest in
            digest.map { String($0, radix: 16) }.map { $0.count == 1 ? "0" + $0 : $0 }.joined()
        }
        return recovered
    }

    /// Records that `site` holds at least `vector` (its request or announcement said so). A digest it reported
    /// before is of less than that: it is forgotten, so no comparison takes it for the digest of what it holds now.
    mutating func holds(_ site: SiteID, _ vector: VersionVector) {
        guard let known = peers[site]?.versionVector, vector.advances(known) else { return }
        peers[site]?.versionVector.merge(vector)
        peers[site]?.digest = nil
    }

    /// Records that `site` diverged (same version, different digest), or, with nil, that it no longer is.
    mutating func setDivergence(_ site: SiteID, _ divergence: Divergence?) {
        peers[site]?.divergence = divergence
    }

    /// Clears `site`'s failure; returns whether there was anything to clear (beyond the bookkeeping).
    @discardableResult
    private mutating func failureOver(_ site: SiteID) -> Bool {
        refusedBy.remove(site)
        peers[site]?.consecutiveFailures = 0
        peers[site]?.lastError = nil
        peers[site]?.retryDelayMilliseconds = nil
        return true
    }
}
