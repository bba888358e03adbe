import ShoalCore
import ShoalProtocol

/// What every member of the cluster was last known to hold, when, and who said so: from its own requests,
/// acknowledgements and announcements on a link with it, from what peers pass on about members this node does not
/// meet (``WireMessage/members(_:)``), and from this node itself. Pure: the node feeds it, with the wall clock's time.
///
/// A member's entry moves on only when a report holds more than it, or as much but more recently (a quiet member that
/// still answers stays fresh). Every report is also kept in ``reports``, the history the collection rule of
/// ``MemberReports`` reads.
struct MemberDirectory: Sendable {
    /// Where an entry came from.
    enum Source: Hashable, Sendable {
        /// The member itself, on a link with this node.
        case direct
        /// Passed on by this peer.
        case peer(SiteID)
        /// This node.
        case local
        /// The member's own report, written as a replicated row (``Store/memberReportsTable``): through the relay,
        /// or from a peer that holds it.
        case replicated
    }

    /// One member's last known state.
    struct Entry: Hashable, Sendable {
        /// What it held.
        var versionVector: VersionVector
        /// When it said so (this node's wall clock, milliseconds).
        var reportedAtMs: UInt64
        /// Who told this node.
        var source: Source
    }

    /// When and from whom each member's latest report came; what it holds is the last of its ``reports``.
    private var heardFrom: [SiteID: (reportedAtMs: UInt64, source: Source)] = [:]
    /// Members' names: as they said in their hellos, or as peers passed them on.
    private(set) var names: [SiteID: String] = [:]
    /// Every report, for the collection rule: each member's last is what it is known to hold.
    private(set) var reports = MemberReports()
    /// Moves on whenever a member is known to hold more (not when an entry only becomes fresher): a link passes the
    /// entries on when it changed since it last did.
    private(set) var generation = 0

    /// Per member (the site it writes as), its last known state.
    var entries: [SiteID: Entry] {
        var entries: [SiteID: Entry] = [:]
        for (site, heard) in heardFrom {
            guard let vector = reports.history[site]?.last else { continue }
            entries[site] = Entry(versionVector: vector, reportedAtMs: heard.reportedAtMs, source: heard.source)
        }
        return entries
    }

    /// Records that `site` held `vector` at `reportedAtMs`, as `source` says. Returns whether it holds more than known.
    @discardableResult
    mutating func heard(_ site: SiteID, holds vector: VersionVector, at reportedAtMs: UInt64, from source: Source)
        -> Bool
    {
        let known = reports.history[site]?.last
        let direct = if case .direct = source { true } else { false }
        reports.record(vector, from: site, direct: direct)
        guard let known, let last = heardFrom[site] else {
            heardFrom[site] = (reportedAtMs, source)
            generation += 1
            return true
        }
        if vector.advances(known) {
            heardFrom[site] = (max(reportedAtMs, last.reportedAtMs), source)
            generation += 1
            return true
        }
        // Nothing new: a more recent report of the same keeps the member fresh. A direct word beats a passed-on one;
        // a passed-on one replaces another only when it is fresher by more than the milliseconds each hop adds
        // (ages do not count the time on the wire), so a report going round a loop of peers does not change hands.
        if vector == known, reportedAtMs > last.reportedAtMs {
            let fresher = reportedAtMs > last.reportedAtMs + Self.hopAllowanceMilliseconds
            let replaces = source == .direct || (last.source != .direct && fresher)
            heardFrom[site] = (reportedAtMs, replaces ? source : last.source)
        }
        return false
    }

    /// Records that `site` was heard from directly at `milliseconds` without a new report: its link was up until then
    /// (an idle link carries no reports, and a member whose link just closed is not silent since its last one).
    mutating func heardDirectly(_ site: SiteID, at milliseconds: UInt64) {
        guard let last = heardFrom[site], milliseconds > last.reportedAtMs else { return }
        heardFrom[site] = (milliseconds, .direct)
    }

    /// Forgets `site` (a member removed from the roster).
    mutating func forget(_ site: SiteID) {
        guard heardFrom.removeValue(forKey: site) != nil else { return }
        reports.forget(site)
        generation += 1
    }

    /// Records `site`'s name as it said it (a hello), over any passed on.
    mutating func named(_ site: SiteID, _ name: String) {
        guard !name.isEmpty else { return }
        names[site] = name
    }

    /// How much fresher a passed-on report must be to replace another as the source.
    static let hopAllowanceMilliseconds: UInt64 = 1_000

    /// The entries to pass on to `peer` at `now`: every member's but the peer's own and those the peer passed on
    /// (it knows them better), with its age and name.
    func gossip(for peer: SiteID, now: UInt64) -> [MemberGossip] {
        let passed = entries.filter { $0.key != peer && $0.value.source != .peer(peer) }.sorted { $0.key < $1.key }
        return passed.prefix(MemberGossip.maximumCount).map {
            MemberGossip(
                site: $0.key,
                name: names[$0.key] ?? "",
                ageMilliseconds: now &- min(now, $0.value.reportedAtMs),
                versionVector: $0.value.versionVector
            )
        }
    }

    /// Records what `peer` passed on at `now`, except what it says of `own` (this node knows its own state).
    mutating func passedOn(_ gossip: [MemberGossip], by peer: SiteID, own: SiteID, now: UInt64) {
        for report in gossip where report.site != own {
            if names[report.site] == nil, !report.name.isEmpty { names[report.site] = report.name }
            let source: Source = report.site == peer ? .direct : .peer(peer)
            heard(report.site, holds: report.versionVector, at: now &- min(now, report.ageMilliseconds), from: source)
        }
    }
}

/// What a member of the cluster was last known to hold (``SyncNode/memberStatuses()``).
public struct MemberStatus: Sendable, Hashable {
    /// The member, by the site it writes as.
    public var siteID: SiteID
    /// Its name, when this node met it or the peer that told.
    public var name: String?
    /// What it held.
    public var versionVector: VersionVector
    /// When it said so (this node's wall clock, milliseconds).
    public var reportedAtMs: UInt64
    /// `direct` (on a link with it), `relayed` (passed on by ``via``), `report` (its own report, written as a
    /// replicated row: through the relay, or from a peer that holds it) or `local` (this node).
    public var source: String
    /// The peer that passed it on, for `relayed`.
    public var via: SiteID?
}

extension MemberDirectory {
    /// Every entry, for status, with its name where known.
    func statuses() -> [MemberStatus] {
        entries.sorted { $0.key < $1.key }.map { site, entry in
            let (source, via): (String, SiteID?) =
                switch entry.source {
                case .direct: ("direct", nil)
                case .local: ("local", nil)
                case .replicated: ("report", nil)
                case .peer(let peer): ("relayed", peer)
                }
            return MemberStatus(
                siteID: site,
                name: names[site],
                versionVector: entry.versionVector,
                reportedAtMs: entry.reportedAtMs,
                source: source,
                via: via
            )
        }
    }
}
