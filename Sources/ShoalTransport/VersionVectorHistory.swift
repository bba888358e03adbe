import ShoalCore

/// When this node came to hold what it holds: for each site, when its sequence numbers grew here, so that the age of
/// the oldest change a peer lacks can be read off any version vector the peer acknowledged. Plain data: no clock, no
/// I/O (times are passed in).
///
/// The node records its version vector once a second; a site gets a step only when its number grew since the last
/// one. A change is dated by the first step that covers it, so an age is exact to the recording interval. Each site's
/// steps are bounded: when they are full, every other step of the older half is dropped, so recent ages stay exact
/// and older ones get coarser (a dropped step dates its changes by the next one: an age may read short by the gap
/// between the two, never long). Memory follows the sites that change, not the length of the vector.
struct VersionVectorHistory: Sendable {
    /// One site's growth: when (monotonic milliseconds) the node first held up to `seq`.
    struct Step: Sendable, Hashable {
        var milliseconds: UInt64
        var seq: UInt64
    }

    /// Each site's steps, oldest first; `seq` only grows.
    private(set) var steps: [SiteID: [Step]] = [:]
    /// The most steps kept per site.
    let capacity: Int

    /// An empty history of at most `capacity` steps per site (at least 4).
    init(capacity: Int = 1_024) {
        self.capacity = max(4, capacity)
    }

    /// Records that the node held `vector` at `milliseconds` (monotonic). Sites that did not grow add nothing.
    mutating func record(_ vector: VersionVector, at milliseconds: UInt64) {
        for (site, seq) in vector.entries where seq > (steps[site]?.last?.seq ?? 0) {
            steps[site, default: []].append(Step(milliseconds: milliseconds, seq: seq))
            if steps[site]!.count > capacity { thin(site) }
        }
    }

    /// How long ago (at `now`, in milliseconds) this node first held a change that a holder of `peer` lacks: 0 when
    /// `peer` holds everything recorded. For each site the peer is behind on, the first step beyond what it holds
    /// dates that site's oldest lacking change (a binary search); the oldest of those is the answer.
    func ageOfOldestLacking(_ peer: VersionVector, now: UInt64) -> UInt64 {
        var oldest: UInt64?
        for (site, timeline) in steps {
            let held = peer[site]
            guard let last = timeline.last, last.seq > held else { continue }
            var low = 0
            var high = timeline.count - 1
            while low < high {
                let middle = (low + high) / 2
                if timeline[middle].seq > held { high = middle } else { low = middle + 1 }
            }
            oldest = min(oldest ?? .max, timeline[low].milliseconds)
        }
        guard let oldest else { return 0 }
        return now > oldest ? now - oldest : 0
    }

    /// Drops every other step of `site`'s older half (never its first, so a long-lacking peer's age keeps growing).
    private mutating func thin(_ site: SiteID) {
        guard let timeline = steps[site] else { return }
        let half = timeline.count / 2
        var kept: [Step] = []
        kept.reserveCapacity(capacity)
        for index in 0..<half where index % 2 == 0 { kept.append(timeline[index]) }
        kept.append(contentsOf: timeline[half...])
        steps[site] = kept
    }
}
