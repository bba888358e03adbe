import ShoalCore
import ShoalStore

/// What collection did since the node started.
struct CollectionProgress: Sendable {
    /// The last cut collected up to.
    var cut = VersionVector()
    /// Tombstones collected in all.
    var collected = 0
    /// When the last pass that collected something ended (wall milliseconds).
    var lastCollectedAtMs: UInt64?
    /// Fresh states this node took (restored or copied, or collected without while silent).
    var freshStatesTaken = 0
    /// When this node started to listen and dial (wall milliseconds): no member is silent to it before it had a
    /// horizon to hear from them.
    var startedAtMs: UInt64?
}

/// Whether and how far deletes are collected, and who holds collection back (``SyncNode/collectionStatus()``).
public struct CollectionStatus: Sendable, Hashable {
    /// A member whose reports hold collection back.
    public struct Waiting: Sendable, Hashable {
        /// The member, by the site its membership names.
        public var siteID: SiteID
        /// Its name, when known.
        public var name: String?
        /// When it last reported what it holds (wall milliseconds); nil if it never did to this node.
        public var lastReportMs: UInt64?
    }

    /// Whether this node collects tombstones at all (``NodeConfiguration/collectionIntervalMilliseconds``).
    public var enabled = true
    /// Whether the cluster's membership is known (a roster): tombstones are collected only then.
    public var membersKnown: Bool
    /// Per site, up to which transaction every member holds the deletes, with every write made before them here.
    public var cut: VersionVector
    /// Tombstones collected since the node started.
    public var collected: Int
    /// When a pass last collected something (wall milliseconds).
    public var lastCollectedAtMs: UInt64?
    /// Members that lack something this node holds, or never reported: the deletes they lack keep their tombstones.
    public var waitingFor: [Waiting]
    /// Members silent longer than the horizon (``NodeConfiguration/collectionHorizonMilliseconds``): collected
    /// without, they take a fresh state when they come back.
    public var suspended: [Waiting] = []
    /// Fresh states this node took since it started: one per return after it was collected without (or after a
    /// restore or a copy), unless peers collected more without it meanwhile.
    public var freshStatesTaken = 0
    /// Whether deletes every member holds wait for the relay to hold them too (``SyncNode/collectionCut(held:)``).
    public var waitsForRelay = false
}

/// Tombstones collected exactly when every member holds the delete (see ``Store/collectTombstones(upTo:maxRows:)``):
/// the members come from the roster (``setMembers(_:boundSites:)``), what each holds from ``MemberDirectory``.
extension SyncNode {
    /// Sets the cluster's current members, by the sites their memberships name (the security layer calls this with
    /// the roster, and again whenever it changes). Removed members stop counting, and what they reported is forgotten;
    /// a member added counts at once, so collection waits for its first report. `boundSites`: per member, the other
    /// sites it signed that it writes under (its report rows are written under one of them once it moved to a fresh
    /// site).
    public func setMembers(_ memberSites: Set<SiteID>, boundSites: [SiteID: Set<SiteID>] = [:]) {
        let current = memberSites.union([siteID])
        for site in members.entries.keys where !current.contains(site) { members.forget(site) }
        collectionMembers = current
        memberWritingSites = boundSites.filter { current.contains($0.key) }
        let (writing, worker) = (memberWritingSites, worker)
        Task { await worker.setMemberWritingSites(writing) }
        // Members' report rows the database already holds count from now on (see ``foldMemberReports()``).
        if writesMemberReports {
            Task { await self.foldMemberReports() }
        }
    }

    /// Whether deletes are collected here with the members known (a roster, collection on): suspensions exist only
    /// then.
    var collectsAmongMembers: Bool { collectionMembers != nil && configuration.collectionIntervalMilliseconds > 0 }

    /// Whether this node writes and reads members' report rows (``reportHoldingsAsRows()``).
    var writesMemberReports: Bool {
        configuration.collectionIntervalMilliseconds > 0 && configuration.memberReportIntervalMilliseconds > 0
    }

    /// Where collection stands.
    public func collectionStatus() async -> CollectionStatus {
        let held = (try? await worker.versionVector()) ?? VersionVector()
        members.heard(siteID, holds: held, at: configuration.clock.nowMilliseconds(), from: .local)
        let enabled = configuration.collectionIntervalMilliseconds > 0
        guard enabled, collectionMembers != nil else {
            return CollectionStatus(
                enabled: enabled, membersKnown: collectionMembers != nil, cut: VersionVector(),
                collected: collection.collected, lastCollectedAtMs: collection.lastCollectedAtMs, waitingFor: [],
                freshStatesTaken: collection.freshStatesTaken
            )
        }
        let entries = members.entries
        let silent = silentMembers()
        let (cut, waitsForRelay) = collectionCut(held: held, without: silent)
        let described = { (site: SiteID) in
            CollectionStatus.Waiting(siteID: site, name: self.members.names[site], lastReportMs: entries[site]?.reportedAtMs)
        }
        return CollectionStatus(
            membersKnown: true,
            cut: cut,
            collected: collection.collected,
            lastCollectedAtMs: collection.lastCollectedAtMs,
            waitingFor: await membersHoldingBack(held: held).filter { !silent.contains($0) }.map(described),
            suspended: silent.sorted().map(described),
            freshStatesTaken: collection.freshStatesTaken,
            waitsForRelay: waitsForRelay
        )
    }

    /// How far this node may collect, holding `held`, with the members but `silent` (``collectionMembers``): the
    /// members' stable cut (``MemberReports/stableCut(members:own:held:)``), no further than what the relay holds when
    /// this node has a relay link; and whether the relay held it back.
    ///
    /// A delete collected before any member uploaded it never reaches the relay: a member that syncs through the
    /// relay alone and was collected without (``silentMembers()``) then reads the relay's whole state for its fresh
    /// state, finds the collected row named by the change that wrote it and no delete, and keeps it for good. A node
    /// linked to the relay holds such deletes until the relay holds them too. (A LAN-only collector does not wait:
    /// the members with a relay link hold the delete, and upload it.)
    func collectionCut(held: VersionVector, without silent: Set<SiteID>) -> (cut: VersionVector, waitsForRelay: Bool) {
        guard let current = collectionMembers else { return (VersionVector(), false) }
        let cut = members.reports.stableCut(members: current.subtracting(silent), own: registry.localSite, held: held)
        guard configuration.relayLinked || relayLinked || relayStateReader != nil else { return (cut, false) }
        var within: [SiteID: UInt64] = [:]
        for (site, seq) in cut.entries where relayHeads[site] > 0 { within[site] = min(seq, relayHeads[site]) }
        let limited = VersionVector(within)
        return (limited, limited != cut)
    }

    /// The members (but this node) silent longer than the horizon: not connected to this node, and no report of what
    /// they hold reached it for that long (reports of members it does not meet are passed on about once a minute).
    /// Empty without a horizon; a member that never reported to this node is not counted silent (it holds collection
    /// back, as status says).
    ///
    /// Empty too unless the members this node still hears from (itself included) are a majority, or exactly half with
    /// the lowest member among them: two sides of a partition never both collect without each other. Each side would
    /// then pull from the other no more, and neither could take the fresh state that lifts its suspension.
    func silentMembers() -> Set<SiteID> {
        let horizon = configuration.collectionHorizonMilliseconds
        guard horizon > 0, let current = collectionMembers else { return [] }
        let now = configuration.clock.nowMilliseconds()
        let entries = members.entries
        // A node just started (or back) has heard from no one yet: the reports it kept are as old as its absence.
        // It once collected without members online all along, at its first pass, and they took fresh states they
        // did not need.
        guard let started = collection.startedAtMs, now > started, now - started > horizon else { return [] }
        let silent = current.subtracting([registry.localSite, siteID]).filter { site in
            guard !directory.isConnected(site), let reported = entries[site]?.reportedAtMs else { return false }
            return now > reported && now - reported > horizon
        }
        // This node counts once, by its membership (its writing site may be a fresh one).
        let all = current.subtracting([siteID]).union([registry.localSite])
        let heard = all.subtracting(silent)
        let quorum = heard.count * 2 > all.count || heard.count * 2 == all.count && all.min().map(heard.contains) == true
        return quorum ? silent : []
    }

    /// The members (but this node) that lack something of `held`, by their last reports this node holds whole, or
    /// never reported: the deletes they lack keep their tombstones. Empty while the members are not known.
    func waitingMembers(held: VersionVector) -> [SiteID] {
        guard configuration.collectionIntervalMilliseconds > 0, let current = collectionMembers else { return [] }
        return current.subtracting([registry.localSite]).sorted().filter { site in
            let usable = members.reports.history[site]?.last { held.dominatesOrEquals($0) }
            return !(usable?.dominatesOrEquals(held) ?? false)
        }
    }

    /// ``waitingMembers(held:)`` less those that lack only Shoal's own rows (members' reports, suspension notices):
    /// a member's report never covers the report this node wrote after it, and those rows hold no delete back.
    func membersHoldingBack(held: VersionVector) async -> [SiteID] {
        var holding: [SiteID] = []
        for site in waitingMembers(held: held) {
            let usable = members.reports.history[site]?.last { held.dominatesOrEquals($0) }
            if let usable, (try? await worker.movesBeyondInternalWrites(from: usable, to: held)) == false { continue }
            holding.append(site)
        }
        return holding
    }

    /// Looks whether the members' reports moved the cut whenever a member is known to hold more, and every interval
    /// regardless, at most five times a second; collects up to it, a slice of at most ``collectionSliceRows`` logged
    /// rows per write transaction (the next slice after whatever waits for the store). A look that finds the cut
    /// where it was costs no store access.
    func collectPeriodically() async throws {
        let (waker, interval) = (collectionWaker, configuration.collectionIntervalMilliseconds)
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(interval))
                waker.yield()
            }
        }
        defer { ticker.cancel() }
        for await _ in collectionWakes {
            guard !Task.isCancelled else { return }
            try await collectOnce()
            // Wakes meanwhile (every report of a round) are one look.
            try await Task.sleep(for: .milliseconds(min(200, interval)))
        }
    }

    /// One look, and the collection it calls for (for tests, too).
    func collectOnce() async throws {
        // A node awaiting its fresh state may hold alive what others collected: it collects nothing until it took it.
        guard collectionMembers != nil, !awaitingFreshState else { return }
        let held = worker.latestVersionVector.withLock { $0 }
        let silent = silentMembers()
        let cut = collectionCut(held: held, without: silent).cut
        guard !cut.entries.isEmpty, cut != collection.cut else { return }
        if !silent.isEmpty {
            // Recorded before the first pass that leaves them out, in a transaction of its own: the notice reaches
            // every node ahead of what the pass removes, and this node pulls from them no more.
            do {
                let known = suspendedSites
                let written = try await worker.suspend(silent, cut: cut).filter { known[$0] == nil }
                if !written.isEmpty {
                    configuration.logger.notice(
                        """
                        collecting deletes without members silent longer than the horizon: they take a fresh state \
                        when they come back (writes of theirs to rows collected meanwhile go to their conflict log)
                        """,
                        metadata: ["members": "\(written.map { self.members.names[$0] ?? String($0.hex.prefix(8)) })"]
                    )
                }
            } catch {
                configuration.logger.warning("could not record a suspension", metadata: ["error": "\(error)"])
                return
            }
            await refreshSuspensions()
        }
        var collected = 0
        while !Task.isCancelled {
            let pass: CollectionReport
            do {
                pass = try await worker.collectTombstones(upTo: cut, maxRows: Self.collectionSliceRows)
            } catch {
                configuration.logger.warning("collecting tombstones failed", metadata: ["error": "\(error)"])
                return
            }
            collected += pass.collected
            // An answer being read: the next look tries again.
            if pass.deferred { break }
            if pass.reachedCut {
                collection.cut = cut
                break
            }
            await Task.yield()
        }
        guard collected > 0 else { return }
        collection.collected += collected
        collection.lastCollectedAtMs = configuration.clock.nowMilliseconds()
        nodeMetrics.tombstonesCollected.increment(by: collected)
        configuration.logger.info(
            "collected tombstones every member holds the delete of",
            metadata: ["tombstones": "\(collected)"]
        )
    }

    /// How many logged rows one collection transaction looks at, at most.
    static let collectionSliceRows = 10_000
}
