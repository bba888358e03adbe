import Logging
import ShoalCore
import ShoalStore
import ShoalTransport

/// Everything a ``ShoalNode`` is assembled from.
///
/// ```swift
/// var options = ShoalNodeOptions(database: "app.db")
/// options.peers = [PeerAddress(host: "10.0.0.7", port: 7400)]
/// options.relay = .init(url: "https://relay.example.com", token: token)
/// ```
public struct ShoalNodeOptions: Sendable {
    /// A relay to sync through whenever it answers.
    public struct Relay: Sendable {
        /// The relay's URL: `https://HOST:PORT` (`http://` to a loopback address only).
        public var url: String
        /// Other instances of the same relay, tried in turn when one does not answer.
        public var otherURLs: [String] = []
        /// The relay's bearer token for this cluster (`shoal relay token create`).
        public var token: String
        /// A PEM CA (or self-signed certificate) to trust for the relay instead of the system's roots.
        public var caCertificatePath: String?
        /// Upload a snapshot once the change sets the relay's snapshot does not cover outgrow this many bytes.
        public var snapshotMinimumBytes: Int64 = 8 * 1024 * 1024

        /// A relay at `url`, reached with `token`.
        public init(url: String, token: String) {
            self.url = url
            self.token = token
        }
    }

    /// The database file (a node key beside it, `.shoal-key`, is made when missing: a cluster of one).
    public var database: String
    /// Where to listen for peers (port 0: any free port).
    public var listen = PeerAddress(host: "127.0.0.1", port: 0)
    /// The name shown to peers (default: the one stored in the database, or "shoal").
    public var name: String?
    /// Peers to dial.
    public var peers: [PeerAddress] = []
    /// Whether to announce the node and find peers of its cluster by mDNS.
    public var mdns = true
    /// Whether to remember peers and dial those remembered from earlier runs.
    public var rememberPeers = true
    /// A relay to sync through, if any.
    public var relay: Relay?
    /// Milliseconds between periodic rounds.
    public var roundIntervalMilliseconds: UInt64 = 2_000
    /// Milliseconds between change-log compactions (0: never).
    public var compactionIntervalMilliseconds: UInt64 = 60_000
    /// Whether the node collects tombstones once every member of the roster holds their deletes (on by default:
    /// see ``NodeConfiguration/collectionIntervalMilliseconds``).
    public var collectDeletes = true
    /// How long a member may stay silent before tombstones are collected without it (0, the default: wait for every
    /// member however long; see ``NodeConfiguration/collectionHorizonMilliseconds``).
    public var collectionHorizonMilliseconds: UInt64 = 0
    /// Whether change batches are compressed where that pays: on peer links of protocol version 6 and more, and before
    /// they are sealed for the relay (members of builds before compression cannot open compressed change sets).
    public var compression = true
    /// Whether links to peers on this machine (loopback addresses) are compressed as well: off by default, since their
    /// bytes never cross a network; for measuring a LAN's behaviour on one machine.
    public var compressesLoopback = false
    /// How the node follows its peers' schema changes: ``SchemaChangeFollowing/apply`` (the default) runs a peer's new
    /// column or table here in the transaction that brings it; ``SchemaChangeFollowing/manual`` records it and holds
    /// its values until the app makes the same change (its identical `ALTER` is that change, not a conflict).
    public var schemaChanges = SchemaChangeFollowing.apply
    /// No TLS, with this cluster id: peers are neither authenticated nor encrypted (tests of the plaintext path only).
    public var insecurePlaintextCluster: String?
    /// Where the node and its parts log (libraries log at info and below).
    public var logger = Logger(label: "shoal.node")
    /// Anything else of the node's configuration, set last (timeouts, batch sizes, a clock for tests).
    public var configure: (@Sendable (inout NodeConfiguration) -> Void)?

    /// A node on the database at `database`.
    public init(database: String) {
        self.database = database
    }
}
