import Synchronization

/// Wakes pulls waiting on a cluster when an upload to it stores something.
///
/// Each cluster has a generation, bumped by every such upload; a pull reads it before looking for change sets and,
/// finding none, waits until it moves (or its time runs out), so an upload between the look and the wait is never
/// missed.
actor RelayNotifier {
    private var generations: [String: UInt64] = [:]
    private var waiters: [String: [UInt64: CheckedContinuation<Void, Never>]] = [:]
    private var nextWaiter: UInt64 = 0
    private var shuttingDown = false

    /// Answers every waiting pull now, and every later one at once: the relay is stopping.
    func shutDown() {
        shuttingDown = true
        for cluster in waiters.values { for waiter in cluster.values { waiter.resume() } }
        waiters = [:]
    }

    func generation(_ cluster: String) -> UInt64 { generations[cluster, default: 0] }

    /// How many pulls wait on `cluster` now (what tests wait on).
    func waiting(_ cluster: String) -> Int { waiters[cluster]?.count ?? 0 }

    /// Moves `cluster`'s generation on and wakes its waiting pulls; `nil`: every cluster's.
    func bump(_ cluster: String?) {
        guard let cluster else {
            for cluster in Set(waiters.keys).union(generations.keys) { bump(cluster) }
            return
        }
        generations[cluster, default: 0] += 1
        for waiter in waiters.removeValue(forKey: cluster)?.values ?? [:].values { waiter.resume() }
    }

    /// Returns once the cluster's generation is past `generation`, or after `duration`; false (at once) when the relay
    /// is stopping.
    @discardableResult
    func wait(_ cluster: String, after generation: UInt64, for duration: Duration) async -> Bool {
        guard !shuttingDown else { return false }
        guard generations[cluster, default: 0] == generation else { return true }
        nextWaiter += 1
        let id = nextWaiter
        await withCheckedContinuation { continuation in
            waiters[cluster, default: [:]][id] = continuation
            Task {
                try? await Task.sleep(for: duration)
                self.expire(cluster, id)
            }
        }
        return !shuttingDown
    }

    private func expire(_ cluster: String, _ id: UInt64) {
        waiters[cluster]?.removeValue(forKey: id)?.resume()
        if waiters[cluster]?.isEmpty == true { waiters[cluster] = nil }
    }
}

/// A token bucket per token: `perSecond` requests a second on average, bursts of twice as many.
final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    private let perSecond: Double
    private let buckets = Mutex<[String: Bucket]>([:])

    init(perSecond: Int) {
        self.perSecond = Double(max(1, perSecond))
    }

    /// `nil` when the request may go ahead; otherwise the seconds to wait.
    func admit(_ key: String) -> Int? {
        let now = ContinuousClock.now
        let capacity = perSecond * 2
        return buckets.withLock { buckets in
            var bucket = buckets[key] ?? Bucket(tokens: capacity, updated: now)
            let elapsed = now - bucket.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(capacity, bucket.tokens + seconds * perSecond)
            bucket.updated = now
            defer { buckets[key] = bucket }
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                return nil
            }
            return max(1, Int(((1 - bucket.tokens) / perSecond).rounded(.up)))
        }
    }
}
