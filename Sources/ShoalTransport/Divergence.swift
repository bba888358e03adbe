import ShoalCore

/// A peer that holds exactly the changes this node holds (the same version vector) but not the same rows (a different
/// state digest): the two replicas diverged, and syncing cannot mend it, since neither lacks a change. Something
/// changed one of the files behind Shoal's back, or a bug did; `shoal verify --peer` lists the rows that differ.
public struct Divergence: Sendable, Hashable {
    /// When it was first seen (wall milliseconds since the Unix epoch).
    public var since: UInt64
    /// The version vector both hold, at the last comparison.
    public var versionVector: VersionVector
    /// This node's digest at the last comparison (hex).
    public var localDigest: String
    /// The peer's digest at the last comparison (hex).
    public var peerDigest: String
    /// How many comparisons in a row found it.
    public var comparisons: Int
}

/// Compares what each peer acknowledged (its version vector and digest) with what this node holds, and says when a
/// peer diverged and when it converged again. Pure: no I/O, no clock (times are passed in).
///
/// A digest is compared only at equal version vectors. One mismatch is only a suspicion: a digest read a moment
/// before a write it did not see yet (another process's commit not yet noticed) can differ once. Two comparisons in
/// a row that differ make a divergence; one that matches ends it.
struct DivergenceWatch {
    /// What a comparison changed.
    enum Verdict: Equatable {
        /// Nothing to say (versions differ, or nothing changed).
        case none
        /// The peer diverged, just now.
        case diverged(Divergence)
        /// The peer is still diverged (compared again).
        case stillDiverged(Divergence)
        /// The peer converged again.
        case converged
    }

    private var suspected: Set<SiteID> = []
    private(set) var diverged: [SiteID: Divergence] = [:]

    /// Compares `peer`'s acknowledged state with this node's, at wall time `now`.
    mutating func compare(
        peer: SiteID,
        peerVector: VersionVector,
        peerDigest: String,
        localVector: VersionVector,
        localDigest: String,
        now: UInt64
    ) -> Verdict {
        guard peerVector == localVector else { return .none }
        guard peerDigest != localDigest else {
            suspected.remove(peer)
            return diverged.removeValue(forKey: peer) == nil ? .none : .converged
        }
        if var known = diverged[peer] {
            known.versionVector = localVector
            known.localDigest = localDigest
            known.peerDigest = peerDigest
            known.comparisons += 1
            diverged[peer] = known
            return .stillDiverged(known)
        }
        guard suspected.contains(peer) else {
            suspected.insert(peer)
            return .none
        }
        suspected.remove(peer)
        let found = Divergence(
            since: now,
            versionVector: localVector,
            localDigest: localDigest,
            peerDigest: peerDigest,
            comparisons: 2
        )
        diverged[peer] = found
        return .diverged(found)
    }
}
