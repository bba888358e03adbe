import ShoalCore

/// Fences: the line past which a site's changes are refused, whatever path they come by (a peer, the relay, an
/// offline stream).
///
/// A node removed from the cluster keeps its file and the cluster's secret; what it writes after its removal must
/// never count. The membership layer (ShoalSecurity, which checks the roster's signatures) decides each removed
/// node's line from the cut its removals carry and installs it here; the store only enforces it: an apply leaves out
/// every change of a fenced site beyond its fence, and claims that site no further (``Store/apply(_:claim:since:received:)``).
extension Store {
    /// The fence of every fenced site: its changes beyond the seq are refused.
    public func fences() throws(ShoalError) -> [SiteID: UInt64] {
        try seqsBySite("SELECT site, seq FROM shoal_fences")
    }

    /// The rows of `query`, a site id and a seq each, as a map.
    private func seqsBySite(_ query: String) throws(ShoalError) -> [SiteID: UInt64] {
        var seqs: [SiteID: UInt64] = [:]
        for row in try connection.rows(query) {
            guard case .blob(let bytes) = row[0], let site = SiteID(bytes: bytes), case .integer(let seq) = row[1] else {
                continue
            }
            seqs[site] = UInt64(bitPattern: seq)
        }
        return seqs
    }

    /// What this database can send: its version vector, with each fenced site taken up to what is logged of it
    /// within its fence.
    ///
    /// A removed node's transactions up to its fence are all there will ever be of it, and a member may hold one it
    /// cannot claim: the range it came in was cut off (the relay lost its storage before the rest came, the link
    /// broke), and the removed node can no longer send it again. Kept unsendable, it would stay on this member
    /// alone. Answers and uploads therefore send it (with what the member holds of it) and claim it; the member's
    /// own claim stays where its holdings prove, so a member that holds more of it still sends it here.
    public func servableVector() throws(ShoalError) -> VersionVector {
        try inReadSnapshot { () throws(ShoalError) in try readServableVector() }
    }

    func readServableVector() throws(ShoalError) -> VersionVector {
        var vector = try versionVector()
        let fences = try fences()
        guard !fences.isEmpty else { return vector }
        let gaps = try fenceGaps()
        let logged = try statement("SELECT max(seq) FROM shoal_log WHERE site = ? AND seq <= ?")
        for (site, fence) in fences where vector[site] < fence {
            guard let index = sites.existingIndex(of: site) else { continue }
            try logged.bind([.integer(Int64(index)), .integer(Int64(bitPattern: fence))])
            if try logged.step(), case .integer(let seq) = logged.column(0) {
                vector.advance(site, to: min(UInt64(seq), gaps[site] ?? .max))
            }
            logged.reset()
        }
        return vector
    }

    /// The table of ``fenceGaps()``.
    static let fenceGapsTable =
        "CREATE TABLE IF NOT EXISTS shoal_fence_gaps(site BLOB PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID"

    /// Removed members' sites some of whose changes a fence left out of an apply, each with what this database could
    /// send of it before: what it holds of such a site beyond that may lack what its transactions within the fence
    /// lost to the ones beyond (a sender sends only what still has an effect), so it is neither sent as if whole
    /// (``servableVector()``) nor proven by changes of earlier batches (``applyInTransaction(_:claim:since:carried:completing:replaying:)``).
    /// Such holdings come from a range the removed member itself cut past its fence, or from a member whose fence was
    /// higher for a while. (A file of an older build opened read-only has no such table: it has none.)
    func fenceGaps() throws(ShoalError) -> [SiteID: UInt64] {
        let exists = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'shoal_fence_gaps'"
        guard case .integer(1) = try connection.scalar(exists) else { return [:] }
        return try seqsBySite("SELECT site, seq FROM shoal_fence_gaps")
    }

    /// Notes `sites` as fence gaps (``fenceGaps()``), inside the apply's transaction and before any of its changes is
    /// merged: what could be sent of each until now stays sendable. (The table is made when the store opens.)
    func noteFenceGaps(_ sites: some Sequence<SiteID>) throws(ShoalError) {
        let servable = try readServableVector()
        let upsert = try statement(
            "INSERT INTO shoal_fence_gaps(site, seq) VALUES (?, ?) ON CONFLICT(site) DO UPDATE SET seq = min(seq, excluded.seq)"
        )
        for site in sites {
            try upsert.bind([.blob(site.bytes), .integer(Int64(bitPattern: servable[site]))])
            try upsert.run()
        }
    }

    /// Fences each site of `cuts` at the highest of its cut, its fence so far and what this database holds of it (a
    /// fence never leaves out what is already here); all in one transaction, so no apply slips in between. Returns,
    /// for each site of which this database holds more than its cut, what it holds: the membership layer signs that
    /// as a cut of its own, so every member draws the same line. This database's own site is never fenced.
    @discardableResult
    public func raiseFences(_ cuts: [SiteID: UInt64]) throws(ShoalError) -> [SiteID: UInt64] {
        let cuts = cuts.filter { $0.key != siteID }
        guard !cuts.isEmpty else { return [:] }
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "raise fences outside of any open transaction")
        }
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            let beyond = try raiseFencesInTransaction(cuts)
            try connection.exec("COMMIT")
            return beyond
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// ``raiseFences(_:)`` inside the transaction open on this connection.
    func raiseFencesInTransaction(_ cuts: [SiteID: UInt64]) throws(ShoalError) -> [SiteID: UInt64] {
        let cuts = cuts.filter { $0.key != siteID }
        guard !cuts.isEmpty else { return [:] }
        try refreshSites()
        let existing = try fences()
        let claims = try versionVector()
        let logged = try statement("SELECT max(seq) FROM shoal_log WHERE site = ?")
        let upsert = try statement(
            "INSERT INTO shoal_fences(site, seq) VALUES (?, ?) ON CONFLICT(site) DO UPDATE SET seq = max(seq, excluded.seq)"
        )
        var beyond: [SiteID: UInt64] = [:]
        for (site, cut) in cuts {
            // What is here of the site: what was claimed, and any change of it applied without its claim.
            var held = claims[site]
            if let index = sites.existingIndex(of: site) {
                try logged.bind([.integer(Int64(index))])
                if try logged.step(), case .integer(let seq) = logged.column(0) { held = max(held, UInt64(seq)) }
                logged.reset()
            }
            if held > cut { beyond[site] = held }
            let fence = max(cut, held, existing[site] ?? 0)
            guard fence != existing[site] else { continue }
            try upsert.bind([.blob(site.bytes), .integer(Int64(bitPattern: fence))])
            try upsert.run()
        }
        return beyond
    }

    /// When `changes` bring roster records and a ``fenceGate`` is installed: asks the gate for the fences the roster
    /// requires with those records counted, and raises them before anything of `changes` is merged (inside the
    /// apply's transaction), so that a removed node's changes that travel with the record binding their site to it,
    /// or with its removal, are fenced already: its line is what this database held before them.
    func gateFences(_ changes: [Change]) throws(ShoalError) {
        guard let fenceGate else { return }
        let arriving = changes.compactMap { change -> [UInt8]? in
            guard change.table == Self.rosterTable, case .column("record", .blob(let record)) = change.payload else {
                return nil
            }
            return record
        }
        guard !arriving.isEmpty else { return }
        let held = try hasRoster()
            ? try connection.rows(
                "SELECT record FROM \(Self.rosterTable) WHERE typeof(record) = 'blob' "
                    + "UNION SELECT record FROM shoal_roster_seen"
            ).compactMap { row -> [UInt8]? in if case .blob(let bytes) = row.first { bytes } else { nil } }
            : []
        let cuts = fenceGate(held + arriving)
        if !cuts.isEmpty { _ = try raiseFencesInTransaction(cuts) }
    }

    /// How often changes refused for a site are logged, at most (milliseconds).
    static let fencedWarningInterval: UInt64 = 60_000

    /// Leaves out every change of a fenced site beyond its fence; returns what is kept, and how many were left out
    /// per site. What is left out is not claimed (a claim is taken only as far as the changes applied prove it).
    func setAsideFenced(_ changes: [Change]) throws(ShoalError) -> (kept: [Change], fenced: [SiteID: Int]) {
        let fences = try fences()
        guard !fences.isEmpty else { return (changes, [:]) }
        var fenced: [SiteID: Int] = [:]
        let kept = changes.filter { change in
            guard let fence = fences[change.stamp.site], change.stamp.seq > fence else { return true }
            fenced[change.stamp.site, default: 0] += 1
            return false
        }
        let now = options.clock.nowMilliseconds()
        for (site, count) in fenced {
            let last = fencedWarnings[site]
            let refused = (last?.refused ?? 0) + count
            guard let last, now >= last.loggedAt, now - last.loggedAt < Self.fencedWarningInterval else {
                options.logger.warning(
                    "refused changes a removed member made after its removal (at most one line a minute per member)",
                    metadata: ["site": "\(site.hex)", "changes": "\(refused)", "fence": "\(fences[site] ?? 0)"]
                )
                fencedWarnings[site] = (now, 0)
                continue
            }
            fencedWarnings[site] = (last.loggedAt, refused)
        }
        return (kept, fenced)
    }
}
