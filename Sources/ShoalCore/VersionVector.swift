/// A change's identity: the site that made it and that site's transaction sequence number.
public struct Dot: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The site that made the transaction.
    public var site: SiteID
    /// The site's sequence number of the transaction (from 1).
    public var seq: UInt64

    /// The dot of transaction `seq` of `site`.
    public init(site: SiteID, seq: UInt64) {
        self.site = site
        self.seq = seq
    }

    /// `site:seq`.
    public var description: String { "\(site.hex):\(seq)" }

    /// Orders by site, then sequence number (the order changes travel in).
    public static func < (lhs: Dot, rhs: Dot) -> Bool { (lhs.site, lhs.seq) < (rhs.site, rhs.seq) }
}

/// How two version vectors relate.
public enum VersionOrdering: Sendable, Hashable {
    /// Both hold exactly the same changes.
    case equal
    /// The left side holds everything the right side holds, and more.
    case dominates
    /// The right side holds everything the left side holds, and more.
    case dominated
    /// Each side holds something the other lacks.
    case concurrent
}

/// Maps each site to the highest sequence number whose effects a node holds.
public struct VersionVector: Hashable, Sendable, CustomStringConvertible {
    /// The non-zero entries.
    public private(set) var entries: [SiteID: UInt64]

    /// An empty vector: holds nothing.
    public init() {
        self.entries = [:]
    }

    /// A vector with the given entries (zero entries are dropped).
    public init(_ entries: [SiteID: UInt64]) {
        self.entries = entries.filter { $0.value > 0 }
    }

    /// The highest sequence number held for `site` (0 when none).
    public subscript(site: SiteID) -> UInt64 {
        entries[site] ?? 0
    }

    /// Whether nothing is held.
    public var isEmpty: Bool { entries.isEmpty }

    /// The entries in site order.
    public var sorted: [(site: SiteID, seq: UInt64)] {
        entries.sorted { $0.key < $1.key }.map { (site: $0.key, seq: $0.value) }
    }

    /// Whether the change `dot` is held.
    public func covers(_ dot: Dot) -> Bool {
        dot.seq <= self[dot.site]
    }

    /// Raises the entry for `site` to `seq` if it is lower.
    public mutating func advance(_ site: SiteID, to seq: UInt64) {
        if seq > self[site] { entries[site] = seq }
    }

    /// Whether this vector holds a seq of some site beyond what `other` holds.
    public func advances(_ other: VersionVector) -> Bool {
        entries.contains { $0.value > other[$0.key] }
    }

    /// The pointwise maximum with `other`.
    public mutating func merge(_ other: VersionVector) {
        for (site, seq) in other.entries { advance(site, to: seq) }
    }

    /// The pointwise maximum of two vectors.
    public func merging(_ other: VersionVector) -> VersionVector {
        var result = self
        result.merge(other)
        return result
    }

    /// Whether every entry of `other` is held here.
    public func dominatesOrEquals(_ other: VersionVector) -> Bool {
        other.entries.allSatisfy { self[$0.key] >= $0.value }
    }

    /// Whether every entry of `other` is held here, but those of `sites` (a member's own writes, which it holds).
    public func dominatesOrEquals(_ other: VersionVector, ignoring sites: Set<SiteID>) -> Bool {
        other.entries.allSatisfy { sites.contains($0.key) || self[$0.key] >= $0.value }
    }

    /// Compares two vectors.
    public func compare(_ other: VersionVector) -> VersionOrdering {
        let covers = dominatesOrEquals(other)
        let covered = other.dominatesOrEquals(self)
        switch (covers, covered) {
        case (true, true): return .equal
        case (true, false): return .dominates
        case (false, true): return .dominated
        case (false, false): return .concurrent
        }
    }

    /// `{site8:seq, …}`, sorted by site.
    public var description: String {
        "{" + sorted.map { "\($0.site.hex.prefix(8)):\($0.seq)" }.joined(separator: ", ") + "}"
    }
}
