import CoreMetrics

/// The relay link's metrics (swift-metrics; docs/metrics.md lists them). A push is one pass that uploads
/// what the relay lacks; a pull is one page asked for (a long-poll that ends with nothing new counts as answered).
/// Success rate, in PromQL: `rate(shoal_node_relay_rounds_total{result="ok"}[5m])` over the sum of both results.
struct RelayLinkMetrics: Sendable {
    static let rounds = "shoal_node_relay_rounds_total"
    static let pushDuration = "shoal_node_relay_push_duration_seconds"
    static let lacking = "shoal_node_relay_lacking_transactions"
    static let staleness = "shoal_node_relay_staleness_seconds"

    let pushOK = Counter(label: rounds, dimensions: [("operation", "push"), ("result", "ok")])
    let pushFailed = Counter(label: rounds, dimensions: [("operation", "push"), ("result", "failed")])
    let pullOK = Counter(label: rounds, dimensions: [("operation", "pull"), ("result", "ok")])
    let pullFailed = Counter(label: rounds, dimensions: [("operation", "pull"), ("result", "failed")])
    /// How long each push that had something to upload took, heads to last answer.
    let pushTime = CoreMetrics.Timer(label: pushDuration)
    /// Changes applied from the relay, beside those applied from each peer (the same metric, `peer="relay"`).
    let applied = Counter(label: "shoal_node_changes_applied_total", dimensions: [("peer", "relay")])
    /// Transactions this node holds and the relay lacks, by the relay's heads as last read.
    let lackingGauge = Gauge(label: lacking)
    /// How long this node has held the oldest change the relay lacks.
    let stalenessGauge = Gauge(label: staleness)
}
