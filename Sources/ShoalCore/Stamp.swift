/// The clock of one write: when (HLC), where (site) and which transaction (seq).
///
/// Stamps order by `(hlc, site, seq)`, a total order, so every node picks the same last writer.
public struct Stamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var hlc: HLC
    public var site: SiteID
    public var seq: UInt64

    public init(hlc: HLC, site: SiteID, seq: UInt64) {
        self.hlc = hlc
        self.site = site
        self.seq = seq
    }

    /// The transaction this write belongs to.
    public var dot: Dot { Dot(site: site, seq: seq) }

    public var description: String { "\(hlc)@\(site.hex.prefix(8)):\(seq)" }

    public static func < (lhs: Stamp, rhs: Stamp) -> Bool {
        (lhs.hlc, lhs.site, lhs.seq) < (rhs.hlc, rhs.site, rhs.seq)
    }
}

/// One site's contribution to a PN-counter column: everything it added and subtracted, as of its `seq`.
public struct CounterEntry: Hashable, Sendable {
    public var increments: UInt64
    public var decrements: UInt64
    public var seq: UInt64
    /// The clock of the site's latest change to this entry (for the conflict log and the digest).
    public var hlc: HLC

    public init(increments: UInt64, decrements: UInt64, seq: UInt64, hlc: HLC) {
        self.increments = increments
        self.decrements = decrements
        self.seq = seq
        self.hlc = hlc
    }

    /// The entry's net contribution.
    public var net: Int64 { Int64(bitPattern: increments &- decrements) }
}
