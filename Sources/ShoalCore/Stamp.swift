/// The clock of one write: when (HLC), where (site) and which transaction (seq).
///
/// Stamps order by `(hlc, site, seq)`, a total order, so every node picks the same last writer.
public struct Stamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// When the write was made.
    public var hlc: HLC
    /// The site that made it.
    public var site: SiteID
    /// The writing site's transaction sequence number.
    public var seq: UInt64

    /// The stamp of a write made at `hlc` by `site` in its transaction `seq`.
    public init(hlc: HLC, site: SiteID, seq: UInt64) {
        self.hlc = hlc
        self.site = site
        self.seq = seq
    }

    /// The transaction this write belongs to.
    public var dot: Dot { Dot(site: site, seq: seq) }

    /// `hlc@site8:seq`.
    public var description: String { "\(hlc)@\(site.hex.prefix(8)):\(seq)" }

    /// The total order of writes: by clock, then site, then sequence number.
    public static func < (lhs: Stamp, rhs: Stamp) -> Bool {
        (lhs.hlc, lhs.site, lhs.seq) < (rhs.hlc, rhs.site, rhs.seq)
    }
}

/// One site's contribution to a PN-counter column: everything it added and subtracted, as of its `seq`.
public struct CounterEntry: Hashable, Sendable {
    /// Everything the site added, in all.
    public var increments: UInt64
    /// Everything the site subtracted, in all (as a positive number).
    public var decrements: UInt64
    /// The site's transaction that last changed the entry.
    public var seq: UInt64
    /// The clock of the site's latest change to this entry (for the conflict log and the digest).
    public var hlc: HLC

    /// One site's counter contribution as of its transaction `seq` made at `hlc`.
    public init(increments: UInt64, decrements: UInt64, seq: UInt64, hlc: HLC) {
        self.increments = increments
        self.decrements = decrements
        self.seq = seq
        self.hlc = hlc
    }

    /// The entry's net contribution.
    public var net: Int64 { Int64(bitPattern: increments &- decrements) }
}
