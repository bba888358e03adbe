import Logging
import NIOCore
import NIOPosix
import ShoalCore
import ShoalStore
import ShoalProtocol

/// How a ``SyncNode`` runs.
public struct NodeConfiguration: Sendable {
    /// The SQLite file the node runs on; it must exist already (`shoal init` makes it).
    public var databasePath: String
    /// Nodes of different clusters refuse each other. Until peers authenticate, this is the only gate.
    public var clusterID = "default"
    /// The name the node gives itself in hellos (nil: the name stored in the database, else "shoal") and in its
    /// mDNS announcement (nil: "shoal").
    public var nodeName: String?
    /// The address the node listens on: loopback by default, `0.0.0.0` for every interface.
    public var listenHost = "127.0.0.1"
    /// 0 picks a free port.
    public var listenPort = 0
    /// Peers given by address (`--peer`): dialled from the start, with backoff, for as long as the node runs.
    public var staticPeers: [PeerAddress] = []
    /// Where peers come from besides ``staticPeers`` and the remembered ones: mDNS (ShoalDiscovery's
    /// `MDNSPeerSource`, which its `mdns` switch adds), later the relay. The node follows each for as long as it
    /// runs and dials what it finds.
    public var peerSources: [any PeerSource] = []
    /// Remember peers' addresses in the database and dial them again after a restart.
    public var rememberPeers = true
    /// Rounds also run this often with every peer (±20% jitter), besides after every local commit.
    public var roundIntervalMilliseconds: UInt64 = 2_000
    /// How often the node drops overwritten entries from its change log (``Store/compactLog(maxEntries:)``), a
    /// slice of 5,000 entries at a time, one slice a second until the end of the log; 0 turns it off.
    public var compactionIntervalMilliseconds: UInt64 = 60_000
    /// How often the node looks whether every member now holds more of the deletes it keeps tombstones for, and
    /// collects those (see ``SyncNode/setMembers(_:)``); 0 (the default of this low-level configuration): never.
    /// `shoal serve` and ``ShoalNode`` set ``defaultCollectionIntervalMilliseconds`` unless told not to collect. A
    /// look that finds nothing new costs no disk access.
    public var collectionIntervalMilliseconds: UInt64 = 0
    /// The interval `shoal serve` and ``ShoalNode`` set (unless `--no-collect-deletes`).
    public static let defaultCollectionIntervalMilliseconds: UInt64 = 2_000
    /// How long a member may stay silent (no report of what it holds reached this node) before this node collects
    /// tombstones without it (`shoal serve --gc-horizon`); 0, the default, waits for every member however long. A
    /// member collected without is suspended: it takes a fresh state when it comes back (see `Store+Suspension.swift`).
    public var collectionHorizonMilliseconds: UInt64 = 0
    /// With collection on and its members known (a roster), a node writes what it holds as a replicated row (see
    /// `Store+MemberReports.swift`) at most this often, and only after commits other than such reports: so members
    /// that reach each other only through the relay learn what each holds. 0 turns it off.
    public var memberReportIntervalMilliseconds: UInt64 = 10_000
    /// Whether a relay link runs beside the node (``ShoalNode`` sets it): from its start, the node collects no delete
    /// the relay is not known to hold (see ``SyncNode/collectionCut(held:without:)``), even before the link first
    /// reached the relay.
    public var relayLinked = false
    /// How often the node updates the metrics it samples rather than counts (queue depth, each peer's staleness and
    /// gap, connected peers: see ``SyncNode``); 0 turns that off. Cheap: no database access.
    public var metricsIntervalMilliseconds: UInt64 = 1_000
    /// How often the node looks for commits made by other processes where it cannot watch the database's files
    /// (on Linux it is woken by each write to them instead, and looks once a second besides).
    public var localChangePollMilliseconds: UInt64 = 20
    /// On Linux, how often the node looks for other processes' commits besides being woken by writes to the
    /// database's files: a safety net (a watch that could not be set, a write-ahead log that came later).
    public var commitSafetyLookMilliseconds: UInt64 = 1_000
    /// A change batch holds at most this many changes.
    public var maxChangesPerBatch = 5_000
    /// Batches are also cut by size: about this many encoded bytes at most (a single larger row goes alone).
    public var maxBytesPerBatch = WireProtocol.defaultBatchBytes
    /// Values whose encoding is longer than this travel in pieces of ``pieceBytes`` (protocol version 2); the
    /// session's ``SyncSession/Configuration/inlineValueLimit``.
    public var inlineValueLimit: Int {
        get { session.inlineValueLimit }
        set { session.inlineValueLimit = newValue }
    }
    /// The size of each piece of a value that travels in pieces; the session's
    /// ``SyncSession/Configuration/pieceBytes``.
    public var pieceBytes: Int {
        get { session.pieceBytes }
        set { session.pieceBytes = newValue }
    }
    /// Established connections (after the handshake) the node keeps at most.
    public var maximumConnections = 64
    /// Inbound connections still handshaking (not yet past hello) the node holds at most, in a pool of their
    /// own; each is closed at the handshake deadline (``SyncSession/Configuration/handshakeTimeout``).
    public var maximumPendingConnections = 32
    /// Of those, how many may come from one remote IP address: a client holding silent sockets keeps no
    /// other address out.
    public var maximumPendingPerAddress = 4
    /// The largest frame sent or accepted; the session's ``SyncSession/Configuration/maximumFrameLength``, also
    /// used by the default channel setup.
    public var maximumFrameLength: Int {
        get { session.maximumFrameLength }
        set { session.maximumFrameLength = newValue }
    }
    /// Reconnection backoff after failures: from the first delay, doubling to the cap, with jitter.
    public var backoffInitialMilliseconds: UInt64 = 100
    /// The longest delay between reconnection attempts.
    public var backoffMaximumMilliseconds: UInt64 = 30_000
    /// The anti-entropy session's time limits and sizes.
    public var session = SyncSession.Configuration()
    /// Whether links to a peer on a loopback address are compressed too (``SyncSession/Configuration/compression``):
    /// their bytes never leave the machine, so by default they are not (compressing them costs CPU and saves nothing);
    /// tests and benchmarks that stand in for a LAN on one machine turn it on.
    public var compressesLoopback = false
    /// How the node's store opens and writes.
    public var storeOptions = StoreOptions()
    /// The one clock the node reads: the store's HLC, the sessions' timeouts, the reports. The same value as
    /// ``StoreOptions/clock``.
    public var clock: any WallClock {
        get { storeOptions.clock }
        set { storeOptions.clock = newValue }
    }
    /// How each connection's pipeline is built: TLS with the roster check (ShoalSecurity's `NodeSecurity` sets
    /// it). `nil` is plain framing (``FramingChannelSetup``) at ``maximumFrameLength``, which the node takes only
    /// with ``insecurePlaintext``.
    public var channelSetup: (any ChannelSetup)?
    /// Run with no channel setup: peers neither authenticated nor encrypted, the cluster id the only gate. Off by
    /// default: a node without a channel setup refuses to start unless this says so, and logs a warning when it
    /// starts.
    public var insecurePlaintext = false
    /// Who may sync and who may join, once the channel setup authenticated a peer (ShoalSecurity's roster check);
    /// `nil` lets every peer with a matching hello sync, and refuses joins.
    public var peerAuthorizer: (any PeerAuthorizer)?
    /// What mDNS announces instead of the cluster id (ShoalSecurity sets a hint keyed by the cluster secret); nil: a
    /// hash of ``clusterID``, which hides the id but anyone who knows it can recognise.
    public var clusterHint: String?
    /// The node id to announce (ShoalSecurity sets it).
    public var nodeID: NodeID?
    /// The event loops the node's sockets run on.
    public var eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton
    /// Where the node logs (info and below; never row payloads).
    public var logger = Logger(label: "shoal.node")

    /// The defaults, for the database at `databasePath`.
    public init(databasePath: String) {
        self.databasePath = databasePath
    }
}

extension NodeConfiguration {
    /// The hint of a cluster known only by its id (plaintext mode): 16 hex digits of a hash of it.
    public static func plainHint(_ clusterID: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in "shoal-cluster-hint:\(clusterID)".utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return String(hash, radix: 16)
    }
}

/// What a node reports as it runs.
public enum NodeEvent: Sendable, Hashable {
    /// The node accepts connections on `port` (the one picked when ``NodeConfiguration/listenPort`` is 0).
    case listening(port: Int)
    /// A connection with a peer finished its handshake: its site, its name and the address it is connected at.
    /// Not said at each reconnection while the same failure keeps repeating.
    case peerConnected(SiteID, name: String, address: String)
    /// The connection with a peer closed, and why.
    case peerDisconnected(SiteID, reason: String)
    /// A pull from `peer` finished; `applied` changes took effect.
    case roundFinished(peer: SiteID, applied: Int)
    /// A pull spanning several batches is under way: `changes` applied so far, in `milliseconds`; the
    /// sender estimates `remaining` more.
    case catchUpProgress(peer: SiteID, changes: Int, remaining: UInt64, milliseconds: UInt64)
    /// mDNS found a peer of this cluster. Both sides dial what they find (a node that returns reconnects as soon
    /// as it sees the ones that stayed); of two connections between a pair, both keep the one dialled by the
    /// smaller site id.
    case peerDiscovered(SiteID, address: String)
    /// mDNS cannot work; the node goes on with static peers, and tries again now and then (with backoff, up to
    /// every 30 s). Said once, with the fix, until discovery works again.
    case discoveryUnavailable(String)
    /// mDNS discovery runs: the node is announced (on `interface`, or on every interface when nil) and browses.
    /// Said when it starts, and again when it comes back after being unavailable.
    case discoveryAvailable(interface: String?)
    /// A connection failed before or during the handshake.
    case connectionFailed(address: String, reason: String)
    /// A connection from `address` (the remote IP) failed or was refused before its handshake ended; repeats
    /// from one address are reported once, then with a count at the 10th, 100th, 1000th.
    case inboundConnectionFailed(address: String, reason: String)
    /// A peer holds the same changes as this node (the same version vector) but not the same rows (a different
    /// digest), seen in two comparisons in a row: the replicas diverged, and no sync mends it. Said once (the node
    /// logs it at error level, then again with a count); ``peerConverged(_:)`` says when it is over.
    case peerDiverged(SiteID, name: String, address: String?, Divergence)
    /// A diverged peer holds the same rows as this node again (equal digests at equal versions).
    case peerConverged(SiteID, name: String)
    /// What the node's relay link did (it reached the relay, applied changes from it, uploaded, failed, moved to a
    /// new key epoch): the relay is reported like a peer.
    case relay(RelayEvent)
}

/// One peer as the node sees it.
public struct PeerStatus: Sendable, Hashable {
    /// The peer's site id.
    public var siteID: SiteID
    /// The peer's name: from its hello, or as its source gave it before any connection.
    public var name: String
    /// The address of its latest connection, or where it was found (`host:port`).
    public var address: String
    /// Whether a connection with the peer is established now.
    public var isConnected: Bool
    /// Milliseconds since the Unix epoch, of the last pull that finished.
    public var lastSuccessfulSync: UInt64?
    /// Failures since the last finished pull from it (or its last acknowledgement, after it refused us).
    public var consecutiveFailures: Int
    /// Pulls from the peer that finished.
    public var roundsFinished: Int
    /// Pulls from the peer that failed while the connection stayed up.
    public var roundsFailed: Int
    /// Durations of recent pulls, in milliseconds (most recent last, bounded).
    public var recentRoundMilliseconds: [UInt64]
    /// What the peer last acknowledged holding.
    public var versionVector: VersionVector
    /// The state digest the peer last reported (with an acknowledgement), hex.
    public var digest: String?
    /// How the node learned of the peer. For a peer it dialled: how it learned the address dialled (an address
    /// mDNS advertises counts as ``PeerOrigin/mdns``, whatever else gave it). For a peer that dialled it: what it
    /// knew of the peer before (found by mDNS, remembered, …), or ``PeerOrigin/inbound`` for a stranger.
    public var foundBy: PeerOrigin = .inbound
    /// Every address the peer is known at, sorted: advertised by mDNS, given with `--peer`, remembered, and the
    /// IP address (with its listening port) of each connection made with it.
    public var addresses: [String] = []
    /// Why the last attempt to reach the peer failed, until a connection succeeds.
    public var lastError: String?
    /// Whether a connection with the peer was ever established (a peer found by mDNS or remembered is listed
    /// before that).
    public var everConnected = false
    /// While the peer is failing: how long until the node dials it again (milliseconds, with jitter).
    public var retryDelayMilliseconds: UInt64?
    /// Set while the peer holds the same changes as this node but a different digest (an error: see
    /// ``Divergence``); cleared when a later comparison at equal versions finds equal digests.
    public var divergence: Divergence?
    /// An address the peer listens at, for `shoal verify --peer` (nil when none is known: a peer that dialled in and
    /// listens nowhere).
    public var listeningAddress: String?
    /// While a round brings many changes from the peer (a catch-up): how far it got.
    public var catchUp: CatchUpProgress?
}

/// How far a catch-up from a peer got: the changes applied and bytes received so far in the round, how many changes the
/// peer estimates are left, and for how long it has run.
public struct CatchUpProgress: Sendable, Hashable {
    /// Changes applied so far in this round.
    public var changes: Int
    /// Bytes received so far in this round: the frames of its change batches as they came (compressed or not, TLS
    /// records' overhead not counted) and the values that travel apart in pieces.
    public var bytes: Int
    /// Changes the peer estimates are left to send.
    public var remaining: UInt64
    /// Milliseconds since the round began.
    public var milliseconds: UInt64
    /// Changes applied per second over the reports of the last ``windowMilliseconds`` (0 until the reports span a
    /// second).
    public var recentRate: Double = 0
    /// One report of the round: when (milliseconds since it began) and how many changes were applied by then.
    struct Report: Sendable, Hashable {
        var milliseconds: UInt64
        var changes: Int
    }
    /// The reports of the last ``windowMilliseconds``, for ``recentRate``.
    var reports: [Report] = []

    /// How far back ``recentRate`` looks.
    public static let windowMilliseconds: UInt64 = 3_000

    /// A catch-up's progress as its round reports it (``recentRate`` is the peer directory's).
    public init(changes: Int, bytes: Int = 0, remaining: UInt64, milliseconds: UInt64) {
        self.changes = changes
        self.bytes = bytes
        self.remaining = remaining
        self.milliseconds = milliseconds
    }

    /// Changes applied per second so far.
    public var rate: Double { milliseconds > 0 ? Double(changes) * 1_000 / Double(milliseconds) : 0 }
    /// Bytes received per second so far.
    public var byteRate: Double { milliseconds > 0 ? Double(bytes) * 1_000 / Double(milliseconds) : 0 }
    /// Seconds left at the recent rate (nil before there is one).
    public var secondsLeft: Double? { recentRate > 0 ? Double(remaining) / recentRate : nil }
}

/// A configured peer (`--peer`) the node has never reached, so its site id is not known yet.
public struct UnreachedPeer: Sendable, Hashable {
    /// The configured address (`host:port`).
    public var address: String
    /// How the node learned of the address (``PeerOrigin/static``).
    public var foundBy: PeerOrigin
    /// How many times it was dialled.
    public var attempts: Int
    /// Failed attempts in a row.
    public var consecutiveFailures: Int
    /// Why the last attempt failed.
    public var lastError: String?
    /// How long until the next attempt (milliseconds).
    public var retryDelayMilliseconds: UInt64?
}

extension PeerStatus {
    /// A peer with nothing recorded about it yet.
    init(siteID: SiteID, name: String, address: String, isConnected: Bool) {
        self.init(
            siteID: siteID,
            name: name,
            address: address,
            isConnected: isConnected,
            lastSuccessfulSync: nil,
            consecutiveFailures: 0,
            roundsFinished: 0,
            roundsFailed: 0,
            recentRoundMilliseconds: [],
            versionVector: VersionVector()
        )
    }
}
