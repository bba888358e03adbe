/// What each member of the cluster reported holding, and so which deletes every member has: the rule by which a
/// tombstone can be collected exactly when it is stable, with no time horizon (the collection itself, and how the
/// reports travel, are still to come).
///
/// A delete whose dot is `(s, q)` is stable once `q ≤ stableCut(…)[s]`. Then every current member reported holding
/// the delete, and this node holds everything each member held when it first so reported. Any update made
/// concurrently with the delete (by a member that had not seen it) was in its maker's report, so it is merged here
/// already, and none can arrive later. A tombstone and a row's metadata are then no longer needed to keep a late
/// update from bringing the row back.
public struct MemberReports: Sendable, Hashable {
    /// How many reports are kept per member. The oldest go first: the rule may then wait longer, it never errs (a
    /// later report holds more, so this node must hold more before it counts).
    public static let historyLimit = 16

    /// Per member (the site it writes as), its reports in the order they came, each holding at least the one before.
    public private(set) var history: [SiteID: [VersionVector]] = [:]

    /// No reports yet.
    public init() {}

    /// Records that `member` reported holding `vector`. Reports only grow: one that adds nothing to the last is
    /// dropped, and one that lacks part of it is merged with it (a report from an older path arrived late). But what
    /// the member itself (`direct`) says it holds of its own site is taken as said: one that lost history (restored
    /// from an older copy) no longer holds writes it reported and never sent, which no node will ever hold; merged
    /// in, they would leave every later report of it out of the stable cut for good. (A lower own entry only lowers
    /// the cut.)
    public mutating func record(_ vector: VersionVector, from member: SiteID, direct: Bool = false) {
        var reports = history[member] ?? []
        var report = vector
        if let last = reports.last {
            guard report.advances(last) else { return }
            report.merge(last)
            if direct { report = VersionVector(report.entries.merging([member: vector[member]]) { $1 }) }
        }
        reports.append(report)
        if reports.count > Self.historyLimit { reports.removeFirst(reports.count - Self.historyLimit) }
        history[member] = reports
    }

    /// Forgets a member (removed from the roster: its changes beyond its removal are refused anyway).
    public mutating func forget(_ member: SiteID) {
        history[member] = nil
    }

    /// Per site, up to which seq its deletes are stable: the pointwise minimum, over `members`, of each member's latest
    /// report that `held` (this node's version vector) covers whole. This node (`own`) counts with `held` itself. A
    /// member with no such report holds everything back: the cut is empty.
    public func stableCut(members: Set<SiteID>, own: SiteID, held: VersionVector) -> VersionVector {
        var cut: VersionVector?
        for member in members {
            let report: VersionVector?
            if member == own {
                report = held
            } else {
                report = history[member]?.last { held.dominatesOrEquals($0) }
            }
            guard let report else { return VersionVector() }
            cut = cut.map { Self.minimum($0, report) } ?? report
        }
        return cut ?? VersionVector()
    }

    /// The pointwise minimum of two vectors (a site one of them lacks is at 0).
    static func minimum(_ a: VersionVector, _ b: VersionVector) -> VersionVector {
        var entries: [SiteID: UInt64] = [:]
        for (site, seq) in a.entries where b[site] > 0 { entries[site] = min(seq, b[site]) }
        return VersionVector(entries)
    }
}
