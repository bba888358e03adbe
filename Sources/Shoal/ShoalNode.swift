import Logging
import ServiceLifecycle
import ShoalCore
import ShoalDiscovery
import ShoalRelayClient
import ShoalSecurity
import ShoalStore
import ShoalTransport

/// The node an app holds: one database, synced with its cluster's other nodes over the LAN and through a relay.
///
/// It opens the database and its key (making one when missing: a cluster of one, which devices join with
/// `shoal invite`), and assembles from one ``ShoalNodeOptions`` value the peer links (mutual TLS 1.3 checked against
/// the cluster's roster), the roster watcher, mDNS, static and remembered peers and the relay link. It is one
/// swift-service-lifecycle `Service`: run it in a `ServiceGroup`, which stops it gracefully on SIGTERM or SIGINT;
/// ``run()`` then returns (it throws only when the node fails).
///
/// ```swift
/// let node = try await ShoalNode(options: ShoalNodeOptions(database: "app.db"))
/// let group = ServiceGroup(services: [node], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
/// try await group.run()
/// ```
///
/// The app keeps writing its file with any SQLite driver (the node captures those writes), or through
/// ``store``, the database's one door.
public final class ShoalNode: Service, Sendable {
    /// The sync node: its peers, status and events.
    public let node: SyncNode
    /// Membership: the roster, the node's key, joins. Nil with ``ShoalNodeOptions/insecurePlaintextCluster``.
    public let security: NodeSecurity?
    /// The relay link, when ``ShoalNodeOptions/relay`` names one.
    public let relay: RelayLink?
    /// Whether opening the node made its key (the database had none: it founded a cluster of one).
    public let madeKey: Bool

    /// The database's one door (``SerializedStore``): reads, writes and every commit, whatever made it.
    public var store: SerializedStore { node.store }
    /// What happens on the node's peer links, as it happens.
    public var events: AsyncStream<NodeEvent> { node.events }

    /// A live query on the node's database: its result now, then after every commit that writes a table it reads,
    /// whoever made it (see ``SerializedStore/observe(_:_:)``).
    public func observe(_ sql: String, _ arguments: [SQLValue] = []) -> AsyncThrowingStream<QueryResult, any Error> {
        store.observe(sql, arguments)
    }

    /// The committed change sets of `tables` (nil: all) after `cursor`, waiting for new ones (see
    /// ``SerializedStore/changes(in:after:)``).
    public func changes(in tables: Set<String>? = nil, after cursor: ChangeFeedCursor = ChangeFeedCursor()) -> ChangeFeed {
        store.changes(in: tables, after: cursor)
    }

    /// Opens the database at `options.database` (creating it when missing) and assembles the node; nothing runs
    /// until ``run()``.
    public init(options: ShoalNodeOptions) async throws(ShoalError) {
        var configuration = NodeConfiguration(databasePath: options.database)
        configuration.listenHost = options.listen.host
        configuration.listenPort = options.listen.port
        configuration.nodeName = options.name
        configuration.staticPeers = options.peers
        configuration.mdns = options.mdns
        configuration.rememberPeers = options.rememberPeers
        configuration.roundIntervalMilliseconds = options.roundIntervalMilliseconds
        configuration.compactionIntervalMilliseconds = options.compactionIntervalMilliseconds
        if options.collectDeletes {
            configuration.collectionIntervalMilliseconds = NodeConfiguration.defaultCollectionIntervalMilliseconds
            configuration.collectionHorizonMilliseconds = options.collectionHorizonMilliseconds
            // Reports through the relay follow the pace of rounds: every five of them at most (10 s by default).
            configuration.memberReportIntervalMilliseconds = 5 * max(options.roundIntervalMilliseconds, 1)
        }
        configuration.logger = options.logger
        configuration.session.compression = options.compression
        configuration.compressesLoopback = options.compressesLoopback
        configuration.storeOptions.schemaChanges = options.schemaChanges
        var security: NodeSecurity?
        var madeKey = false
        if let cluster = options.insecurePlaintextCluster {
            configuration.insecurePlaintext = true
            configuration.clusterID = cluster
        } else {
            // A connection of its own for the set-up, closed before the node opens its store.
            let store = try Store(path: options.database)
            if !KeyFile.exists(forDatabase: options.database) {
                try Membership.initialize(
                    databasePath: options.database, store: store, now: SystemWallClock().nowMilliseconds()
                )
                madeKey = true
            }
            let secured = try NodeSecurity(databasePath: options.database, store: store, name: options.name)
            try secured.configure(&configuration)
            security = secured
        }
        options.configure?(&configuration)
        configuration.relayLinked = options.relay != nil
        let node = try await SyncNode(configuration: configuration)
        security?.attach(node)
        self.node = node
        self.security = security
        self.madeKey = madeKey
        self.relay = try options.relay.map { relay throws(ShoalError) in
            try Self.relayLink(
                relay, node: node, security: security, database: options.database, compression: options.compression
            )
        }
    }

    /// Runs the node, its relay link and its roster watcher as children of this task until the service group shuts
    /// down gracefully (then it returns) or one of them fails (then it throws, and the others stop).
    public func run() async throws {
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await self.node.run() }
            if let relay = self.relay {
                group.addTask { try await relay.run() }
            }
            if let security = self.security {
                group.addTask {
                    // The watcher loops until cancelled: a graceful shutdown cancels it.
                    try? await cancelWhenGracefulShutdown { await security.watchRoster() }
                }
            }
        }
    }

    /// The relay link `relay` describes, sealing with the cluster's secret.
    private static func relayLink(
        _ relay: ShoalNodeOptions.Relay,
        node: SyncNode,
        security: NodeSecurity?,
        database: String,
        compression: Bool
    ) throws(ShoalError) -> RelayLink {
        guard let security else {
            throw ShoalError(
                code: .invalidArgument,
                message: "a relay needs the cluster's secret to seal change sets: run without insecure plaintext"
            )
        }
        var logger = Logger(label: "shoal.relay")
        logger.logLevel = .critical
        var configuration = RelayClientConfiguration(
            url: relay.url,
            token: relay.token,
            clusterID: security.keyFile.cluster.idHex,
            clusterSecret: security.keyFile.cluster.secret,
            logger: logger
        )
        configuration.identity = security.keyFile.identity
        let trust = security.trust
        configuration.roster = { trust.roster }
        configuration.keyringPath = RelayKeyring.path(forDatabase: database)
        configuration.caCertificatePath = relay.caCertificatePath
        configuration.otherURLs = relay.otherURLs
        configuration.snapshotMinimumBytes = relay.snapshotMinimumBytes
        configuration.compression = compression
        return try RelayLink(node: node, configuration: configuration)
    }
}
