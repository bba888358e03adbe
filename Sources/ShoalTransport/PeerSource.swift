import Logging
import ShoalStore
import ShoalCore

/// What a peer source knows about the node it finds peers for.
public struct PeerSourceContext: Sendable {
    /// The node's site id (a source skips the node itself).
    public var siteID: SiteID
    /// The node's cluster (a source reports only peers of the same cluster, where it can tell).
    public var clusterID: String
    /// What the node announces instead of its cluster id: nodes of one cluster announce the same hint, and only
    /// they can make it (``NodeConfiguration/clusterHint``).
    public var clusterHint: String
    /// The node id to announce, when the node has a key.
    public var nodeID: String?
    /// The node's name, as it advertises itself.
    public var nodeName: String
    /// The address the node listens on.
    public var listenHost: String
    /// The port the node listens on (bound already).
    public var listeningPort: Int
    /// Where the source logs (debug and below).
    public var logger: Logger

    /// A context for a node.
    public init(
        siteID: SiteID,
        clusterID: String,
        clusterHint: String,
        nodeID: String? = nil,
        nodeName: String,
        listenHost: String,
        listeningPort: Int,
        logger: Logger
    ) {
        self.siteID = siteID
        self.clusterID = clusterID
        self.clusterHint = clusterHint
        self.nodeID = nodeID
        self.nodeName = nodeName
        self.listenHost = listenHost
        self.listeningPort = listeningPort
        self.logger = logger
    }
}

/// A peer a source found: where to dial it, and what else is known.
public struct PeerCandidate: Sendable, Hashable {
    /// The peer's site id, when the source knows it (a configured address does not).
    public var siteID: SiteID?
    /// Its name, when the source knows it (else empty).
    public var name: String
    /// Where to dial it.
    public var address: PeerAddress
    /// Other addresses it is known at (listed in the status, not dialled).
    public var otherAddresses: [PeerAddress]
    /// How it was found.
    public var origin: PeerOrigin

    /// A candidate found at `address`.
    public init(
        siteID: SiteID?,
        name: String = "",
        address: PeerAddress,
        otherAddresses: [PeerAddress] = [],
        origin: PeerOrigin
    ) {
        self.siteID = siteID
        self.name = name
        self.address = address
        self.otherAddresses = otherAddresses
        self.origin = origin
    }
}

/// What a peer source reports.
public enum PeerSighting: Sendable, Hashable {
    /// A peer to dial (again, when it reappears: a fresh dialer starts at once).
    case found(PeerCandidate)
    /// The peer left (its connection, if any, notices by itself; its dialer keeps trying with backoff).
    case lost(SiteID)
    /// The source works: for mDNS, announced and browsing on `interface` (nil: every interface).
    case available(interface: String?)
    /// The source cannot work for now, and why, in plain words with the fix; it retries with backoff.
    case unavailable(String)
}

/// Somewhere peers come from: the configuration, the database's memory of earlier runs, mDNS, later the relay.
///
/// The node follows every source it is given for as long as it runs and dials what they find; sources know
/// nothing of connections. A source runs until the task iterating its sightings is cancelled.
public protocol PeerSource: Sendable {
    /// The peers this source finds for the node described by `context`, as they are found.
    func sightings(_ context: PeerSourceContext) -> AsyncStream<PeerSighting>
}

/// Peers given by address in the configuration (`--peer host:port`): found once, at start.
public struct StaticPeerSource: PeerSource {
    /// The addresses.
    public var addresses: [PeerAddress]

    /// A source of these addresses.
    public init(_ addresses: [PeerAddress]) {
        self.addresses = addresses
    }

    /// Each address once, as a peer whose site is not known yet.
    public func sightings(_ context: PeerSourceContext) -> AsyncStream<PeerSighting> {
        AsyncStream { continuation in
            for address in addresses {
                continuation.yield(.found(PeerCandidate(siteID: nil, address: address, origin: .static)))
            }
            // Nothing more will come, but the source lasts as long as the node: finishing is fine, since the node
            // keeps dialling what was found.
            continuation.finish()
        }
    }
}

/// Peers the node connected to in earlier runs, as the database remembers them: found once, at start.
struct RememberedPeerSource: PeerSource {
    /// The remembered peers.
    var peers: [KnownPeer]

    func sightings(_ context: PeerSourceContext) -> AsyncStream<PeerSighting> {
        AsyncStream { continuation in
            for known in peers where known.siteID != context.siteID {
                let address = PeerAddress(host: known.host, port: known.port)
                continuation.yield(.found(PeerCandidate(siteID: known.siteID, address: address, origin: .remembered)))
            }
            continuation.finish()
        }
    }
}
