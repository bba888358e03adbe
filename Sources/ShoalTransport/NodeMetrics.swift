import CoreMetrics
import ShoalCore
import ShoalProtocol

/// The metrics of one peer, emitted through swift-metrics: whatever backend the process bootstrapped (`shoal serve
/// --metrics` bootstraps Prometheus), none at all otherwise. The handles are made once per peer, so recording is a
/// few atomic operations; docs/metrics.md lists every name.
struct PeerMetrics: Sendable {
    /// The `peer` label: the peer's site id in hex (as `shoal status` lists it), or `other` beyond the node's limit
    /// of labelled peers.
    let label: String
    private let roundsOK: Counter
    private let roundsFailed: Counter
    private let roundDuration: CoreMetrics.Timer
    private let applied: Counter
    private let remaining: Gauge
    private let progress: Gauge
    let staleness: Gauge
    let gap: Gauge
    /// 1 while the peer holds the same changes but different rows (diverged), else 0.
    let diverged: Gauge
    private let changeBytesSent: Counter
    private let changeBytesUncompressed: Counter
    /// The node's tally of change frames sent, to all peers.
    private let traffic: ChangeTrafficCounter

    /// The handles of the peer labelled `label`; the frames sent to it also count in `traffic`.
    init(label: String, traffic: ChangeTrafficCounter = ChangeTrafficCounter()) {
        self.label = label
        self.traffic = traffic
        let peer = [("peer", label)]
        changeBytesSent = Counter(label: NodeMetrics.changeBytesSent, dimensions: peer)
        changeBytesUncompressed = Counter(label: NodeMetrics.changeBytesUncompressed, dimensions: peer)
        roundsOK = Counter(label: NodeMetrics.rounds, dimensions: peer + [("result", "ok")])
        roundsFailed = Counter(label: NodeMetrics.rounds, dimensions: peer + [("result", "failed")])
        roundDuration = CoreMetrics.Timer(label: NodeMetrics.roundDuration, dimensions: peer)
        applied = Counter(label: NodeMetrics.changesApplied, dimensions: peer)
        remaining = Gauge(label: NodeMetrics.catchUpRemaining, dimensions: peer)
        progress = Gauge(label: NodeMetrics.catchUpProgress, dimensions: peer)
        staleness = Gauge(label: NodeMetrics.peerStaleness, dimensions: peer)
        gap = Gauge(label: NodeMetrics.peerGap, dimensions: peer)
        diverged = Gauge(label: NodeMetrics.peerDiverged, dimensions: peer)
    }

    /// A change batch or value piece went to the peer: `frame.payload` on the link, for `frame.uncompressedCount`
    /// bytes of message.
    func sent(_ frame: EncodedMessage) {
        changeBytesSent.increment(by: frame.payload.count)
        changeBytesUncompressed.increment(by: frame.uncompressedCount)
        traffic.add(sent: frame.payload.count, uncompressed: frame.uncompressedCount)
    }

    /// A pull from the peer finished in `milliseconds`: no catch-up is under way any more.
    func roundFinished(milliseconds: UInt64) {
        roundsOK.increment()
        roundDuration.recordMilliseconds(milliseconds)
        remaining.record(0)
        progress.record(1)
    }

    /// A round with the peer failed here, or the peer refused ours.
    func roundFailed() {
        roundsFailed.increment()
    }

    /// `changes` more changes from the peer took effect.
    func applied(_ changes: Int) {
        if changes > 0 { applied.increment(by: changes) }
    }

    /// A pull spanning several batches is under way: `done` applied so far, about `remaining` to go (the sender's
    /// estimate, the same figures `shoal serve` prints as it catches up).
    func catchingUp(done: Int, remaining left: UInt64) {
        remaining.record(Double(left))
        let total = Double(done) + Double(left)
        progress.record(total > 0 ? Double(done) / total : 1)
    }
}

/// The node's own metrics (not per peer), and the names of all of them.
///
/// Labels stay bounded: `peer` is a site id, and at most ``peerLabelLimit`` peers get one of their own (with TLS only
/// roster members ever connect; the limit guards plaintext nodes, where anyone can say any site id); `table` is a
/// replicated table's name, from the local schema.
package struct NodeMetrics: Sendable {
    package static let rounds = "shoal_node_rounds_total"
    static let roundDuration = "shoal_node_round_duration_seconds"
    static let changesApplied = "shoal_node_changes_applied_total"
    static let catchUpRemaining = "shoal_node_catchup_remaining_changes"
    static let catchUpProgress = "shoal_node_catchup_progress_ratio"
    package static let peerStaleness = "shoal_node_peer_staleness_seconds"
    package static let peerGap = "shoal_node_peer_gap_transactions"
    static let conflicts = "shoal_node_conflicts_total"
    static let queueDepth = "shoal_node_queue_depth"
    static let connectedPeers = "shoal_node_peers_connected"
    static let divergedPeers = "shoal_node_diverged_peers"
    static let tombstonesCollected = "shoal_node_tombstones_collected_total"
    static let freshStatesTaken = "shoal_node_fresh_states_taken_total"
    static let collectionWaiting = "shoal_node_collection_waiting_members"
    static let peerDiverged = "shoal_node_peer_diverged"
    static let changeBytesSent = "shoal_node_change_bytes_sent_total"
    static let changeBytesUncompressed = "shoal_node_change_bytes_uncompressed_total"

    /// Peers with a `peer` label of their own; the ones beyond share `other`.
    static let peerLabelLimit = 256

    /// Local transactions no peer has acknowledged holding yet.
    let queue = Gauge(label: NodeMetrics.queueDepth)
    /// Peers with an established connection.
    let connected = Gauge(label: NodeMetrics.connectedPeers)
    /// Peers that hold the same changes but different rows (an error: see `Divergence`).
    let diverged = Gauge(label: NodeMetrics.divergedPeers)
    /// Tombstones collected (every member held their deletes).
    let tombstonesCollected = Counter(label: NodeMetrics.tombstonesCollected)
    /// Fresh states taken (this database was restored or copied, or collected without while silent).
    let freshStatesTaken = Counter(label: NodeMetrics.freshStatesTaken)
    /// Members the collection of deletes waits for (they lack something this node holds, or never reported).
    let collectionWaiting = Gauge(label: NodeMetrics.collectionWaiting)
    /// Change frames sent to every peer, for ``SyncNode/changeTraffic``.
    let traffic: ChangeTrafficCounter
    private var peers: [SiteID: PeerMetrics] = [:]
    private var other: PeerMetrics?

    /// The node's metrics; its peers' change frames count in `traffic` too.
    init(traffic: ChangeTrafficCounter = ChangeTrafficCounter()) {
        self.traffic = traffic
    }

    /// The handles of peer `site`, made at its first use.
    mutating func peer(_ site: SiteID) -> PeerMetrics {
        if let known = peers[site] { return known }
        guard peers.count < Self.peerLabelLimit else {
            if let other { return other }
            let shared = PeerMetrics(label: "other", traffic: traffic)
            other = shared
            return shared
        }
        let made = PeerMetrics(label: site.hex, traffic: traffic)
        peers[site] = made
        return made
    }

    /// Counts conflicts met while applying, by table.
    package static func countConflicts(_ byTable: [String: Int]) {
        for (table, count) in byTable where count > 0 {
            Counter(label: conflicts, dimensions: [("table", table)]).increment(by: count)
        }
    }
}
