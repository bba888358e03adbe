import Foundation
import ServiceLifecycle
import Shoal
import Synchronization
import UnixSignals

/// What `shoal serve` shows of a running node: the status file `shoal status` reads (written when asked for), and a
/// line on stderr for each thing a person wants to know (a peer came or went, changes synced, the relay's state).
/// One `Service` beside the node in the serve's service group; it stops with it.
final class ServeReporter: Service, Sendable {
    private let node: ShoalNode
    private let database: String
    private let listenHost: String
    private let plaintextCluster: String?
    private let listenedFlag = Atomic<Bool>(false)

    /// At most one "synced" line per peer this often (seconds): what synced meanwhile is summed into the next one.
    static let syncedLineInterval: TimeInterval = 5

    /// Whether the node said where it listens (a failure before that is a failure to listen).
    var listened: Bool { listenedFlag.load(ordering: .relaxed) }

    init(node: ShoalNode, database: String, listenHost: String, plaintextCluster: String?) {
        self.node = node
        self.database = database
        self.listenHost = listenHost
        self.plaintextCluster = plaintextCluster
    }

    func run() async throws {
        let statusFile = StatusFile(path: LiveStatus.path(forDatabase: database))
        defer { statusFile.remove() }
        try? await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.writeStatus(to: statusFile) }
                group.addTask { await self.reportNodeEvents() }
            }
        }
    }

    /// Writes the status file when the node starts, and again each time a reader asks for it (``LiveStatus/read(
    /// forDatabase:)`` sends SIGUSR1 to the process that serves): status is served on demand, so an idle node
    /// writes nothing to disk and wakes for nothing.
    private func writeStatus(to statusFile: StatusFile) async {
        let sync = node.node
        let security = node.security
        var requests = await UnixSignalsSequence(trapping: .sigusr1).makeAsyncIterator()
        repeat {
            var status = LiveStatus(
                node: sync.siteID,
                pendingLocalChanges: await sync.pendingLocalChanges(),
                digest: try? await sync.refreshDigest(waiting: false),
                peers: await sync.peerStatuses(),
                unreached: await sync.unreachedPeers()
            )
            status.clockAheadOfPeersMs = await sync.clockAheadOfPeers()
            status.members = await sync.memberStatuses().map(LiveStatus.Member.init)
            let collection = await sync.collectionStatus()
            let roster = security?.trust.roster
            let described = { (member: CollectionStatus.Waiting) in
                LiveStatus.Collection.Waiting(
                    site: member.siteID.hex,
                    name: member.name?.printable(),
                    node: roster?.members.values.first { $0.siteID == member.siteID }?.nodeID.description,
                    lastReportMs: member.lastReportMs
                )
            }
            status.collection = LiveStatus.Collection(
                enabled: collection.enabled,
                membersKnown: collection.membersKnown,
                collected: collection.collected,
                lastCollectedAtMs: collection.lastCollectedAtMs,
                waitingFor: collection.waitingFor.map(described),
                suspended: collection.suspended.map(described),
                freshStatesTaken: collection.freshStatesTaken,
                waitsForRelay: collection.waitsForRelay
            )
            status.writeLock = node.store.writeLockHolds
            for index in status.peers.indices {
                guard let site = SiteID(hex: status.peers[index].site) else { continue }
                status.peers[index].lacking = await sync.lacking(by: .peer(site))
            }
            status.security = security == nil ? "insecure-plaintext" : "tls"
            status.cluster = plaintextCluster
            status.relay = node.relay?.status
            status.nodeID = security?.keyFile.identity.nodeID.description
            status.pending = security?.trust.pendingDevices.map { device in
                LiveStatus.PendingDevice(
                    node: device.nodeID.description,
                    name: device.name,
                    site: device.siteID?.hex,
                    address: device.address,
                    attempts: device.attempts,
                    lastSeenMs: device.lastSeenMilliseconds,
                    publicKey: Data(device.publicKeyDER).base64EncodedString()
                )
            }
            statusFile.write(status)
        } while await requests.next() != nil && !Task.isCancelled
    }

    private func reportNodeEvents() async {
        let plaintextOption = plaintextCluster.map { " --insecure-plaintext --cluster \($0)" } ?? ""
        let terminal = isatty(STDERR_FILENO) != 0
        var lastProgressLine = Date.distantPast
        // Per peer: when its last "synced" line was written, and what synced since (an app writing many small
        // transactions would otherwise write a line per transaction on every peer).
        var lastSyncedLine: [SiteID: Date] = [:]
        var syncedSince: [SiteID: (changes: Int, rounds: Int)] = [:]
        for await event in node.events {
            switch event {
            case .catchUpProgress(let peer, let changes, let remaining, let milliseconds):
                let rate = milliseconds > 0 ? Double(changes) * 1000 / Double(milliseconds) : 0
                let eta = rate > 0 ? " ETA \(Int((Double(remaining) / rate).rounded(.up))) s" : ""
                let line =
                    "catching up from \(peer.hex.prefix(8)): \(changes) changes, \(Int(rate)) changes/s,"
                    + " about \(remaining) to go\(eta)"
                if terminal {
                    FileHandle.standardError.write(Data("\r\u{1B}[2K\(line)".utf8))
                } else if Date().timeIntervalSince(lastProgressLine) >= 5 {
                    lastProgressLine = Date()
                    log(line)
                }
            case .listening(let port):
                listenedFlag.store(true, ordering: .relaxed)
                // Written in one call, unbuffered, so a script reading the pipe sees it at once.
                FileHandle.standardOutput.write(Data("listening on \(PeerAddress(host: listenHost, port: port))\n".utf8))
            case .peerConnected(let site, let name, let peerAddress):
                log("peer connected: \(name.printable()) \(site.hex.prefix(8)) at \(peerAddress)")
            case .peerDisconnected(let site, let reason):
                log("peer disconnected: \(site.hex.prefix(8)): \(reason)")
            case .roundFinished(let peer, let applied) where applied > 0:
                var since = syncedSince[peer] ?? (0, 0)
                since = (since.changes + applied, since.rounds + 1)
                guard Date().timeIntervalSince(lastSyncedLine[peer] ?? .distantPast) >= Self.syncedLineInterval else {
                    syncedSince[peer] = since
                    break
                }
                lastSyncedLine[peer] = Date()
                syncedSince[peer] = nil
                if terminal { FileHandle.standardError.write(Data("\r\u{1B}[2K".utf8)) }
                let rounds = since.rounds > 1 ? " in \(since.rounds) rounds" : ""
                log("synced \(since.changes) changes from \(peer.hex.prefix(8))\(rounds)")
            case .connectionFailed(let peerAddress, let reason):
                log("connection to \(peerAddress) failed: \(reason)")
            case .inboundConnectionFailed(let peerAddress, let reason):
                log("connection from \(peerAddress) failed: \(reason)")
            case .roundFinished:
                break
            case .peerDiscovered(let site, let peerAddress):
                log("found \(site.hex.prefix(8)) at \(peerAddress) by mDNS")
            case .discoveryUnavailable(let reason):
                log("mDNS discovery is off: \(reason).")
            case .discoveryAvailable(let interface):
                log("mDNS discovery is on (announced and browsing on \(interface ?? "every interface"))")
            case .peerDiverged(let site, let name, let peerAddress, _):
                let peer = "\(name.isEmpty ? "" : name.printable() + " ")\(site.hex.prefix(8))"
                log(
                    "ERROR: diverged from \(peer): it holds the same changes as this node but different rows "
                        + "(different digests at the same version), and syncing between these two will not mend it; run `shoal "
                        + "verify --db \(database) --peer \(peerAddress ?? "HOST:PORT")"
                        + "\(plaintextOption)` to list the rows that differ"
                )
            case .peerConverged(let site, let name):
                let peer = "\(name.isEmpty ? "" : name.printable() + " ")\(site.hex.prefix(8))"
                log("converged again with \(peer): equal digests at the same version")
            case .relay(let event):
                report(event)
            }
        }
    }

    private func report(_ event: RelayEvent) {
        let url = node.relay?.status.url ?? "the relay"
        switch event {
        case .reachable: log("relay \(url) reachable")
        case .failed(let reason): log(reason)
        case .unauthorized(let reason):
            let hint = reason.contains("unknown token") || reason.contains("was revoked")
                ? ": give the node a token of its cluster (shoal relay token create) and restart it" : ""
            log(reason + hint)
        case .applied(let changes): log("synced \(changes) changes from the relay")
        case .uploaded: break
        case .snapshotted: log("uploaded a snapshot to the relay")
        case .epoch(let epoch, let rotatedHere):
            log(
                rotatedHere
                    ? "rotated the relay key to epoch \(epoch): removed nodes can no longer read what is sealed from now on, nor use the relay"
                    : "the relay key moved to epoch \(epoch) (another member rotated it after a removal)"
            )
        }
    }

    private func log(_ line: String) {
        FileHandle.standardError.write(Data("shoal: \(line)\n".utf8))
    }
}
