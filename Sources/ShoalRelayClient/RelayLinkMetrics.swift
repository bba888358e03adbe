import CoreMetrics
import ShoalTransport

/// The relay link's metrics (swift-metrics; docs/metrics.md lists them). A push is one pass that uploads
/// what the relay lacks; a pull is one page asked for (a long-poll that ends with nothing new counts as answered).
/// Success rate, in PromQL: `rate(shoal_node_relay_rounds_total{result="ok"}[5m])` over the sum of both results.
///
/// The relay is also a peer like the others: its rounds (pushes and pulls alike), gap and staleness are recorded under
/// the LAN peers' names with `peer="relay"`, beside the relay's own names.
struct RelayLinkMetrics: Sendable {
    static let rounds = "shoal_node_relay_rounds_total"
    static let pushDuration = "shoal_node_relay_push_duration_seconds"
    static let lacking = "shoal_node_relay_lacking_transactions"
    static let staleness = "shoal_node_relay_staleness_seconds"
    /// The `peer` label the relay has among the node's peers.
    static let peer = [("peer", "relay")]

    private let pushOK = Counter(label: rounds, dimensions: [("operation", "push"), ("result", "ok")])
    private let pushFailed = Counter(label: rounds, dimensions: [("operation", "push"), ("result", "failed")])
    private let pullOK = Counter(label: rounds, dimensions: [("operation", "pull"), ("result", "ok")])
    private let pullFailed = Counter(label: rounds, dimensions: [("operation", "pull"), ("result", "failed")])
    private let peerOK = Counter(label: NodeMetrics.rounds, dimensions: peer + [("result", "ok")])
    private let peerFailed = Counter(label: NodeMetrics.rounds, dimensions: peer + [("result", "failed")])
    /// How long each push that had something to upload took, heads to last answer.
    let pushTime = CoreMetrics.Timer(label: pushDuration)
    /// Changes applied from the relay, beside those applied from each peer (the same metric, `peer="relay"`).
    let applied = Counter(label: "shoal_node_changes_applied_total", dimensions: peer)
    private let lackingGauge = Gauge(label: lacking)
    private let stalenessGauge = Gauge(label: staleness)
    private let peerGap = Gauge(label: NodeMetrics.peerGap, dimensions: peer)
    private let peerStaleness = Gauge(label: NodeMetrics.peerStaleness, dimensions: peer)

    /// A push finished (`ok`) or failed.
    func pushed(ok: Bool) {
        (ok ? pushOK : pushFailed).increment()
        (ok ? peerOK : peerFailed).increment()
    }

    /// A pull's page was answered (`ok`) or the pull failed.
    func pulled(ok: Bool) {
        (ok ? pullOK : pullFailed).increment()
        (ok ? peerOK : peerFailed).increment()
    }

    /// Transactions this node holds and the relay lacks (by its heads as last read), and how long this node has held
    /// the oldest of them, in seconds.
    func sample(lacking: UInt64, stalenessSeconds: Double) {
        lackingGauge.record(lacking)
        stalenessGauge.record(stalenessSeconds)
        peerGap.record(Double(lacking))
        peerStaleness.record(stalenessSeconds)
    }
}
