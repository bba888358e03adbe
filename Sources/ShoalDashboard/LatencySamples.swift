/// Propagation latencies (milliseconds from a change set's commit at its origin to its apply at another node): the
/// latest ones kept, and their percentiles, computed the same way for the dashboard and for the demo's printed line.
public struct LatencySamples: Sendable {
    private var samples: [Double] = []
    private var next = 0
    /// How many are kept at most (the oldest are replaced).
    public let capacity: Int

    /// No samples yet.
    public init(capacity: Int = 10_000) {
        self.capacity = capacity
    }

    /// How many are kept.
    public var count: Int { samples.count }

    /// Records one.
    public mutating func add(_ milliseconds: Double) {
        if samples.count < capacity {
            samples.append(milliseconds)
        } else {
            samples[next] = milliseconds
            next = (next + 1) % capacity
        }
    }

    /// The nearest-rank percentile (`fraction` 0.5 for p50), or nil without samples.
    public func percentile(_ fraction: Double) -> Double? {
        guard !samples.isEmpty else { return nil }
        let sorted = samples.sorted()
        let rank = Int((fraction * Double(sorted.count)).rounded(.up)) - 1
        return sorted[min(max(rank, 0), sorted.count - 1)]
    }

    /// The figures the page shows.
    public var summary: DashboardState.Latency {
        DashboardState.Latency(samples: count, p50Ms: percentile(0.5), p95Ms: percentile(0.95))
    }
}
