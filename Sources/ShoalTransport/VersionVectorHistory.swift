import ShoalCore

/// When this node came to hold what it holds: its version vector sampled over time, so that the age of the oldest
/// change a peer lacks can be read off any vector the peer acknowledged. Plain data: no clock, no I/O (times are
/// passed in).
///
/// A sample is kept only when the vector grew since the last one, at most one per call (the node samples once a
/// second). A change is dated by the first sample that holds it, so an age is exact to the sampling interval. The
/// history is bounded: when it is full, every other sample of its older half is dropped, so recent ages stay exact
/// and older ones get coarser (a dropped sample dates its changes by the next one: an age may read short by the
/// gap between the two, never long).
struct VersionVectorHistory: Sendable {
    /// The samples, oldest first; each vector dominates the one before.
    private(set) var samples: [(milliseconds: UInt64, vector: VersionVector)] = []
    /// The most samples kept.
    let capacity: Int

    /// An empty history of at most `capacity` samples (at least 4).
    init(capacity: Int = 4_096) {
        self.capacity = max(4, capacity)
    }

    /// Records that the node held `vector` at `milliseconds` (monotonic). A vector that did not grow adds nothing.
    mutating func record(_ vector: VersionVector, at milliseconds: UInt64) {
        if let last = samples.last {
            guard !last.vector.dominatesOrEquals(vector) else { return }
            // A vector is never taken back; should one shrink (another store, a test), it still dominates what came
            // before once merged.
            samples.append((milliseconds, vector.merging(last.vector)))
        } else {
            guard !vector.isEmpty else { return }
            samples.append((milliseconds, vector))
        }
        if samples.count > capacity { thin() }
    }

    /// How long ago (at `now`, in milliseconds) this node first held a change that `peer` lacks: 0 when `peer` holds
    /// everything sampled. The oldest sample the peer does not cover dates it (samples only grow, so those covered
    /// come first: a binary search).
    func ageOfOldestLacking(_ peer: VersionVector, now: UInt64) -> UInt64 {
        var low = 0
        var high = samples.count
        while low < high {
            let middle = (low + high) / 2
            if peer.dominatesOrEquals(samples[middle].vector) { low = middle + 1 } else { high = middle }
        }
        guard low < samples.count else { return 0 }
        let since = samples[low].milliseconds
        return now > since ? now - since : 0
    }

    /// Drops every other sample of the older half (never the oldest, so ages of long-lacking peers keep growing).
    private mutating func thin() {
        let half = samples.count / 2
        var kept: [(milliseconds: UInt64, vector: VersionVector)] = []
        kept.reserveCapacity(capacity)
        for index in 0..<half where index % 2 == 0 { kept.append(samples[index]) }
        kept.append(contentsOf: samples[half...])
        samples = kept
    }
}
