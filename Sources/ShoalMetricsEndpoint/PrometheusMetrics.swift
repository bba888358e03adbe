import CoreMetrics
import Prometheus

/// The registry a process's metrics are collected in. Libraries emit through swift-metrics and never see it; the
/// process (`shoal serve --metrics`, `shoal relay serve --metrics`) bootstraps swift-metrics with it once, before it
/// makes anything that emits, and serves its text.
public enum PrometheusMetrics {
    /// The buckets of every duration histogram: from a millisecond (an idle round on loopback) to five minutes (a
    /// large catch-up, a relay's long-poll of 25 s).
    public static let durationBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2_500), .seconds(5),
        .seconds(10), .seconds(30), .seconds(60), .seconds(300),
    ]

    /// Makes a registry and bootstraps swift-metrics with it: call once per process, first thing.
    public static func bootstrap() -> PrometheusCollectorRegistry {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = durationBuckets
        MetricsSystem.bootstrap(factory)
        return registry
    }

    /// The content type of the text exposition format the registry writes.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"
}
