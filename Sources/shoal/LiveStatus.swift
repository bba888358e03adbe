import Foundation
import Shoal

/// What a running `shoal serve` publishes beside its database, every 250 ms, for `shoal status`.
struct LiveStatus: Codable {
    struct Peer: Codable {
        var site: String
        var name: String
        var address: String
        var connected: Bool
        var lastSuccessfulSyncMs: UInt64?
        var consecutiveFailures: Int
        var roundsFinished: Int
        var roundsFailed: Int
        var roundP50Ms: UInt64?
        var roundP99Ms: UInt64?
        var versionVector: [String: UInt64]
        /// The state digest the peer last reported.
        var digest: String? = nil
        /// How the peer was found: static, mdns, remembered or inbound.
        var foundBy: String = "inbound"
        /// Every address the peer is known at.
        var addresses: [String] = []
        /// Why the last attempt to reach it failed, until one succeeds.
        var lastError: String? = nil
        /// Whether a connection with it was ever made (peers found by mDNS are listed before that).
        var everConnected = true
        /// Since when (wall milliseconds) the peer holds the same changes as this node but different rows: an
        /// error (the replicas diverged); nil while it does not.
        var divergedSinceMs: UInt64? = nil
        /// An address the peer listens at (for `shoal verify --peer`), when known.
        var listeningAddress: String? = nil
        /// While catching up from the peer: changes applied so far in the round, estimated left, rate, seconds left.
        var catchUpChanges: Int? = nil
        var catchUpBytes: Int? = nil
        var catchUpBytesPerSecond: Double? = nil
        var catchUpRemaining: UInt64? = nil
        var catchUpRate: Double? = nil
        var catchUpSecondsLeft: Double? = nil
        /// How many of this node's own transactions the peer has not acknowledged holding.
        var lacking: UInt64? = nil
    }

    /// A member of the cluster, and what it was last known to hold.
    struct Member: Codable {
        var site: String
        var name: String?
        var versionVector: [String: UInt64]
        /// When it said so (wall milliseconds).
        var reportedAtMs: UInt64
        /// `direct`, `relayed` (passed on by `via`), `report` (its own report row) or `local`.
        var source: String
        var via: String?

        init(_ member: MemberStatus) {
            site = member.siteID.hex
            name = member.name?.printable()
            versionVector = Dictionary(
                uniqueKeysWithValues: member.versionVector.entries.map { ($0.key.hex, $0.value) }
            )
            reportedAtMs = member.reportedAtMs
            source = member.source
            via = member.via?.hex
        }
    }

    /// Deletes collected once every member holds them (``SyncNode/collectionStatus()``).
    struct Collection: Codable {
        /// A member that lacks something this node holds, or never reported: the deletes it lacks wait for it.
        struct Waiting: Codable {
            var site: String
            var name: String?
            /// Its node id (for `shoal trust remove`), from the roster.
            var node: String?
            /// When it last reported what it holds (wall milliseconds); nil if it never did to this node.
            var lastReportMs: UInt64?
        }

        /// Whether the node collects tombstones at all (not with `shoal serve --no-collect-deletes`).
        var enabled: Bool? = nil
        /// Whether the cluster's membership is known (a roster): tombstones are collected only then.
        var membersKnown: Bool
        /// Tombstones collected since the node started.
        var collected: Int
        var lastCollectedAtMs: UInt64?
        var waitingFor: [Waiting]
        /// Members silent longer than the horizon (`--gc-horizon`), collected without: they take a fresh state when
        /// they come back.
        var suspended: [Waiting]? = nil
        /// Fresh states this node took since it started (after a restore or a copy, or collected without).
        var freshStatesTaken: Int? = nil
        /// Whether deletes every member holds wait for the relay to hold them too (this node has a relay link).
        var waitsForRelay: Bool? = nil
    }

    /// A device that connected with a key the roster does not hold.
    struct PendingDevice: Codable {
        var node: String
        var name: String
        var site: String?
        var address: String
        var attempts: Int
        var lastSeenMs: UInt64
        /// Its public key (base64), which `shoal trust add` puts on the roster.
        var publicKey: String
    }

    var node: String
    /// This node's id (the hash of its key), when it runs with TLS.
    var nodeID: String? = nil
    /// Whether peer links are TLS ("tls") or plaintext ("insecure-plaintext").
    var security: String? = nil
    /// The cluster id, for a plaintext node (with TLS, the key file holds it).
    var cluster: String? = nil
    /// Devices waiting to be accepted.
    var pending: [PendingDevice]? = nil
    /// The relay, when the node uses one.
    var relay: RelayStatus? = nil
    var writtenAtMs: UInt64
    /// The process serving the database, so a reader can tell a running node whose status is late from one
    /// that is gone.
    var pid: Int32? = nil
    /// Local transactions no peer has acknowledged holding yet.
    var pendingLocalChanges: UInt64
    /// This node's digest as last computed (nil while stale).
    var digest: String?
    /// How far this machine's clock runs ahead of its peers' (beyond the drift bound, so writes are stamped with
    /// their time); nil while it does not.
    var clockAheadOfPeersMs: UInt64? = nil
    /// How long the node held SQLite's write lock, transaction by transaction, since it started.
    var writeLock: WriteLockHolds? = nil
    var peers: [Peer]
    /// Every member this node heard of (itself included), and what each was last known to hold.
    var members: [Member]? = nil
    /// Where the collection of tombstones stands.
    var collection: Collection? = nil

    static func path(forDatabase database: String) -> String { database + ".shoal-status.json" }

    init(
        node: SiteID,
        pendingLocalChanges: UInt64,
        digest: StateDigest?,
        peers: [PeerStatus],
        unreached: [UnreachedPeer] = []
    ) {
        self.node = node.hex
        self.pendingLocalChanges = pendingLocalChanges
        self.digest = digest?.hex
        self.writtenAtMs = SystemWallClock().nowMilliseconds()
        self.pid = getpid()
        self.peers = peers.map { peer in
            let sorted = peer.recentRoundMilliseconds.sorted()
            func percentile(_ fraction: Double) -> UInt64? {
                sorted.isEmpty ? nil : sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
            }
            return Peer(
                site: peer.siteID.hex,
                name: peer.name.printable(),
                address: peer.address,
                connected: peer.isConnected,
                lastSuccessfulSyncMs: peer.lastSuccessfulSync,
                consecutiveFailures: peer.consecutiveFailures,
                roundsFinished: peer.roundsFinished,
                roundsFailed: peer.roundsFailed,
                roundP50Ms: percentile(0.5),
                roundP99Ms: percentile(0.99),
                versionVector: Dictionary(
                    uniqueKeysWithValues: peer.versionVector.entries.map { ($0.key.hex, $0.value) }
                ),
                digest: peer.digest,
                foundBy: peer.foundBy.rawValue,
                addresses: peer.addresses,
                lastError: peer.lastError,
                everConnected: peer.everConnected,
                divergedSinceMs: peer.divergence?.since,
                listeningAddress: peer.listeningAddress,
                catchUpChanges: peer.catchUp?.changes,
                catchUpBytes: peer.catchUp?.bytes,
                catchUpBytesPerSecond: peer.catchUp?.byteRate,
                catchUpRemaining: peer.catchUp?.remaining,
                catchUpRate: peer.catchUp?.rate,
                catchUpSecondsLeft: peer.catchUp?.secondsLeft
            )
        }
        // Configured peers never reached have no site id yet, but are listed all the same, with why.
        self.peers += unreached.map { peer in
            Peer(
                site: "",
                name: "",
                address: peer.address,
                connected: false,
                lastSuccessfulSyncMs: nil,
                consecutiveFailures: peer.consecutiveFailures,
                roundsFinished: 0,
                roundsFailed: 0,
                versionVector: [:],
                foundBy: peer.foundBy.rawValue,
                addresses: [peer.address],
                lastError: peer.lastError ?? (peer.attempts == 0 ? "not dialled yet" : nil),
                everConnected: false
            )
        }
    }

    func write(to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try encoder.encode(self).write(to: URL(fileURLWithPath: path), options: .atomic)
    }

    /// The status of a node running on `database`, fresh: the process serving it is asked to write it now, and
    /// answers within milliseconds; one too busy to answer within 250 ms gives its last status (it is running all
    /// the same). Nil when no node serves the database.
    static func read(forDatabase database: String) -> LiveStatus? {
        guard let stored = load(forDatabase: database), let pid = stored.pid, isServing(pid: pid, database: database)
        else { return nil }
        // Served on demand: the node writes its status when asked (SIGUSR1), within milliseconds; a node too busy
        // to answer in time is still running, and its last status is what there is.
        let asked = SystemWallClock().nowMilliseconds()
        guard kill(pid, SIGUSR1) == 0 else { return stored }
        let deadline = ContinuousClock.now + .milliseconds(250)
        while ContinuousClock.now < deadline {
            if let fresh = load(forDatabase: database), fresh.writtenAtMs >= asked { return fresh }
            usleep(2_000)  // the answer is a file: looked at every 2 ms, for at most the deadline
        }
        return load(forDatabase: database) ?? stored
    }

    /// The status file as it is.
    private static func load(forDatabase database: String) -> LiveStatus? {
        guard let data = FileManager.default.contents(atPath: path(forDatabase: database)) else { return nil }
        return try? JSONDecoder().decode(LiveStatus.self, from: data)
    }

    /// Whether process `pid` is alive and a `shoal serve` of `database` (not another process that got the
    /// number after the node's end).
    static func isServing(pid: Int32, database: String) -> Bool {
        guard kill(pid, 0) == 0 || errno == EPERM,
            let commandLine = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline")
        else { return false }
        let arguments = commandLine.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        guard arguments.contains("serve") else { return false }
        let given =
            zip(arguments, arguments.dropFirst()).first { $0.0 == "--db" }?.1
            ?? arguments.first { $0.hasPrefix("--db=") }.map { String($0.dropFirst(5)) }
        guard let given else { return false }
        // Its path, resolved against the directory that process runs in.
        let directory = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd")) ?? "/"
        let served = URL(fileURLWithPath: given, relativeTo: URL(fileURLWithPath: directory, isDirectory: true))
        return served.standardizedFileURL.resolvingSymlinksInPath().path
            == URL(fileURLWithPath: database).standardizedFileURL.resolvingSymlinksInPath().path
    }
}
