import ShoalCore
import ShoalStore

/// Members that reach each other only through the relay learn what each holds from report rows (see
/// `Store+MemberReports.swift`): each such node writes its own, and folds the others' into ``MemberDirectory``.
extension SyncNode {
    /// Writes this node's report row at most every ``NodeConfiguration/memberReportIntervalMilliseconds``, while its
    /// members are known, and only after a commit other than members' reports (so reports never answer reports, and an
    /// idle cluster writes nothing); folds the rows other members wrote whenever they change. Every member writes
    /// one, not only those with a relay link: a LAN peer of a node that uses the relay reaches relay-only members so.
    /// With a horizon (``NodeConfiguration/collectionHorizonMilliseconds``) and a relay link, a node also writes one at
    /// least every third of the horizon, idle or not: a member that meets the others only through the relay is not
    /// silent to them while it is there.
    func reportHoldingsAsRows() async throws {
        let commits = await worker.commits()
        let watching = Task {
            for await commit in commits { await self.noteForMemberReports(commit) }
        }
        defer { watching.cancel() }
        await foldMemberReports()
        // What this node's last report said it held (its row, written before a restart too).
        var reported = try? await worker.memberReports().first { $0.site == registry.localSite }?.versionVector
        memberReportDue = reported == nil
        let clock = configuration.clock
        let refresh = configuration.collectionHorizonMilliseconds / 3
        var lastWritten = clock.monotonicMilliseconds()
        while !Task.isCancelled {
            try await Task.sleep(for: .milliseconds(configuration.memberReportIntervalMilliseconds))
            let stale = refresh > 0 && relayLinked && clock.monotonicMilliseconds() &- lastWritten >= refresh
            guard memberReportDue || stale, collectsAmongMembers else { continue }
            memberReportDue = false
            do {
                let held = try await worker.versionVector()
                // Only Shoal's own rows came since the last report (others' reports and floors, a digest folded by
                // another process): nothing a collection waits for. Each report once answered such a commit, and
                // a process folding digests beside the nodes (the chaos harness, `shoal digest` in a loop) kept every
                // node writing one at every interval, for good.
                if !stale, let reported, try await !worker.movesBeyondInternalWrites(from: reported, to: held) {
                    continue
                }
                lastWritten = clock.monotonicMilliseconds()
                let written = try await worker.writeMemberReport(
                    site: registry.localSite,
                    name: configuration.nodeName,
                    holds: held,
                    atMs: configuration.clock.nowMilliseconds()
                )
                // An app's transaction is open on the node's connection: the next interval writes it.
                if written { reported = held } else { memberReportDue = true }
            } catch {
                configuration.logger.warning("could not write this member's report", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Whether `commit` calls for a new report of this node's (anything but members' reports came), and folds the
    /// report rows it brought.
    func noteForMemberReports(_ commit: StoreCommit) async {
        let reportsOnly: Set<String> = [Store.memberReportsTable]
        if let tables = commit.tables, tables.contains(Store.memberReportsTable), commit.origin != .local {
            await foldMemberReports()
        }
        if let tables = commit.tables, tables.isSubset(of: reportsOnly) { return }
        memberReportDue = true
    }

    /// Records each other member's report row not folded yet in ``members`` (as of when it was written, never later
    /// than now), and wakes collection when one holds more than known. Only a current member's row, written by that
    /// member itself (as the site its membership names, or one it signed that it writes under, having moved to a
    /// fresh site): a row another node wrote (an app writing the table on its own file, say) is passed over.
    func foldMemberReports() async {
        guard let reports = try? await worker.memberReports(), let current = collectionMembers else { return }
        let now = configuration.clock.nowMilliseconds()
        var moved = false
        for report in reports
        where report.site != registry.localSite && report.site != siteID && current.contains(report.site)
            && (report.writtenBy == report.site
                || report.writtenBy.map { memberWritingSites[report.site]?.contains($0) == true } == true)
        {
            guard foldedMemberReports[report.site] != report.reportedAtMs else { continue }
            foldedMemberReports[report.site] = report.reportedAtMs
            if let name = report.name, members.names[report.site] == nil { members.named(report.site, name) }
            let at = min(report.reportedAtMs, now)
            if members.heard(report.site, holds: report.versionVector, at: at, from: .replicated) { moved = true }
        }
        if moved { collectionWaker.yield() }
    }
}
