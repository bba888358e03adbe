import Logging
import ShoalCore
import ShoalStore

/// A database that lost history (restored from an older copy, or copied from another node's file) takes a fresh
/// state from a peer before its own writes leave it (see `Store+FreshState.swift`): once it holds all a peer holds
/// (the peer's acknowledgement shows a vector this node's covers), the rows in which the two differ are listed as
/// `shoal verify --peer` lists them, on a connection of their own, and the rows the peer deleted and collected while
/// this database was away go here too. Then its own writes are sent again.
extension SyncNode {
    /// Rows listed in one look at a peer; more than that takes another look.
    static let freshStateRows = 100_000

    /// Asks for a look at `peer` if this database awaits its fresh state, holds all the peer acknowledged holding, and
    /// the peer holds all this database held before it lost history (``Store/freshStateFloor()``: a peer that holds
    /// less may be another stale copy, that knows nothing of what was collected meanwhile).
    func offerFreshState(peer: SiteID, peerVector: VersionVector, localVector: VersionVector) {
        guard awaitingFreshState, let address = freshStateAddress(peer, peerVector: peerVector, local: localVector)
        else { return }
        freshStateSource.yield(address)
    }

    /// Where to look at `peer` for the fresh state, if it can give it: this node holds all it holds, and it holds
    /// the floor.
    private func freshStateAddress(_ peer: SiteID, peerVector: VersionVector, local: VersionVector) -> PeerAddress? {
        // Not a member suspended itself (and not yet back): holding every cut, it may still hold alive what was
        // collected without it. Two members back at once took their fresh states from each other, and collected rows
        // came back.
        guard mayPull(from: peer) else { return nil }
        guard local.dominatesOrEquals(withinFences(peerVector)), peerVector.dominatesOrEquals(freshStateFloor) else {
            return nil
        }
        return directory.status(of: peer)?.listeningAddress.flatMap(PeerAddress.init(parsing:))
    }

    /// Takes the fresh state from the peers offered (``offerFreshState(peer:peerVector:localVector:)``), one look at a
    /// time, until one look covered every row that differs, whenever this database awaits one: at start, or once a
    /// peer suspended it for collection (looked for at each tick after the vector moved: ``refreshSuspensions()``).
    func takeFreshStateWhenOffered() async {
        let (source, interval) = (freshStateSource, configuration.roundIntervalMilliseconds)
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(max(interval, 200)))
                source.yield(nil)
            }
        }
        defer { ticker.cancel() }
        // Suspensions exist only where deletes are collected (a roster): elsewhere the store is not read for them.
        var lookedAt: VersionVector?
        for await offered in freshStateSources {
            guard !Task.isCancelled else { return }
            let held = worker.latestVersionVector.withLock { $0 }
            // (What the last fresh state covered was read at start, with the suspensions.)
            if collectsAmongMembers, held != lookedAt {
                lookedAt = held
                await refreshSuspensions()
            }
            guard awaitingFreshState else { continue }
            await readFreshStateFences()
            // A tick: a link that settled sends no acknowledgements, so the peers' last known vectors are looked at.
            guard let address = offered ?? freshStateCandidate() else {
                if await freshStateNeedsNoPeer() {
                    let covers = withinFences(relayHeads)
                    await freshStateTaken(from: "the relay", covering: covers, removed: 0, orphaned: 0)
                } else {
                    await takeFreshStateFromTheRelay()
                }
                continue
            }
            do {
                let report = try await PeerVerifier.verify(
                    configuration: configuration,
                    address: address,
                    limit: Self.freshStateRows
                )
                // The peer moved on meanwhile: a later acknowledgement offers it again.
                let covers = withinFences(report.peerVersionVector)
                guard report.localVersionVector.dominatesOrEquals(covers) else { continue }
                // Only tables the peer replicates: a table it does not lists every row here as missing there.
                let theirs = Set(report.peerTables)
                var keys: [String: [[UInt8]]] = [:]
                for row in report.rows where row.difference == .missingOnPeer && theirs.contains(row.table) {
                    keys[row.table, default: []].append(SQLValue.encodeKey(row.key))
                }
                var taken = FreshStateReport()
                for (table, rows) in keys.sorted(by: { $0.key < $1.key }) {
                    let part = try await worker.takeFreshState(
                        table: table,
                        keys: rows,
                        peerVector: covers
                    )
                    taken.removed += part.removed
                    taken.orphaned += part.orphaned
                    taken.lifted += part.lifted
                    taken.deferred = taken.deferred || part.deferred
                }
                if taken.removed + taken.orphaned + taken.lifted > 0 {
                    _ = try? await refreshDigest(waiting: false)
                    signalChangeWatchers()
                }
                // An answer being read put a table off, or more rows differ than were listed: another look.
                guard !report.truncated, !taken.deferred else {
                    try? await Task.sleep(for: .milliseconds(200))
                    continue
                }
                await freshStateTaken(
                    from: report.peerName,
                    covering: covers,
                    removed: taken.removed,
                    orphaned: taken.orphaned
                )
            } catch {
                configuration.logger.warning(
                    """
                    could not compare rows with a peer to take a fresh state (this database lost history: restored \
                    or copied); its own writes wait, and it tries again at the peer's next acknowledgement
                    """,
                    metadata: ["peer": "\(address)", "error": "\(error)"]
                )
                try? await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// A connected peer this node could take its fresh state from now (see
    /// ``offerFreshState(peer:peerVector:localVector:)``), by what it last acknowledged or announced holding.
    private func freshStateCandidate() -> PeerAddress? {
        let local = worker.latestVersionVector.withLock { $0 }
        return directory.acknowledgedVectors().sorted(by: { $0.site < $1.site }).lazy.filter(\.connected)
            .compactMap { self.freshStateAddress($0.site, peerVector: $0.vector, local: local) }.first
    }

    /// Whether a node that reaches its cluster through the relay alone may take its fresh state without a peer: it
    /// holds all the relay holds, and no node ever collected a tombstone in a table it knows of (a collector's floors
    /// travel through the relay like any change), so nothing it holds was collected elsewhere. (Members heard only
    /// through the relay hold collection back, so a cluster that meets only there never collects.) Never while a
    /// notice names it: a collector wrote it before collecting, and its floors may not have come yet (a member back
    /// took its "fresh state" so, between a collector's notice and its floor, and kept the collected rows).
    private func freshStateNeedsNoPeer() async -> Bool {
        guard !relayHeads.isEmpty, heldWithRelay.dominatesOrEquals(withinFences(relayHeads)),
            relayHeads.dominatesOrEquals(freshStateFloor)
        else { return false }
        guard (try? await worker.unsettledSuspensions())?.isEmpty == true else { return false }
        return (try? await worker.knowsOfCollection()) == false
    }

    /// Takes the fresh state through the relay alone, when no peer can give it: this node holds all the relay holds,
    /// the relay holds all this node got from others and the floor, and a read of the relay's whole state
    /// (``readsRelayState(_:)``) names no row this node holds that the relay's heads cover but no change there names:
    /// such a row was deleted and collected before the relay's snapshot, and goes (a write of this node's to it goes to
    /// the conflict log), as a peer's fresh state would remove it. One read at most every
    /// ``relayStateReadIntervalMilliseconds``.
    func takeFreshStateFromTheRelay() async {
        guard let reader = relayStateReader, relayMayGiveFreshState(heads: relayHeads) else { return }
        let now = configuration.clock.monotonicMilliseconds()
        guard now >= relayStateReadDueMs else { return }
        relayStateReadDueMs = now + Self.relayStateReadIntervalMilliseconds
        do {
            // A row collected without this node is named by its first write in the change log still, and its delete
            // may never have reached the relay (a collector uploaded the delete's transaction without it): only a
            // snapshot taken since, by a node that holds every cut it was collected up to, leaves it out.
            let collectedWithout = withinFences(try await suspensionCuts())
            var state = try await reader(collectedWithout)
            guard state.snapshot.dominatesOrEquals(collectedWithout) else {
                configuration.logger.info(
                    """
                    the relay's snapshot does not cover yet the deletes collected without this node: a peer that holds \
                    them uploads one; looking again shortly
                    """,
                    metadata: ["snapshot": "\(state.snapshot)", "collected up to": "\(collectedWithout)"]
                )
                relayStateReadDueMs = configuration.clock.monotonicMilliseconds() + Self.relaySnapshotWaitMilliseconds
                return
            }
            state.heads = withinFences(state.heads)
            // What the relay held when the read began: this node holds it all (it may hold more since, pulled from
            // the relay meanwhile: rows begun after the read stay, as rows no peer had seen would), and the floor.
            let local = heldWithRelay
            guard local.dominatesOrEquals(state.heads), state.heads.dominatesOrEquals(freshStateFloor) else {
                configuration.logger.info(
                    "the relay's state read for a fresh state is not all this node holds yet; read again shortly",
                    metadata: ["heads": "\(state.heads)", "held": "\(local)"]
                )
                relayStateReadDueMs = configuration.clock.monotonicMilliseconds() + Self.relayStateRereadMilliseconds
                return
            }
            var taken = FreshStateReport()
            let tables = try await worker.read { store throws(ShoalError) in try store.tableDigests().tables.map(\.name) }
            for table in tables {
                let named = state.keys[table] ?? []
                var after: [UInt8]?
                while true {
                    let page = try await worker.read { store throws(ShoalError) in
                        try store.rowHashes(of: table, after: after, limit: Self.freshStateRows)
                    }
                    let unnamed = page.rows.map(\.key).filter { !named.contains($0) }
                    if !unnamed.isEmpty {
                        let part = try await worker.takeFreshState(table: table, keys: unnamed, peerVector: state.heads)
                        taken.removed += part.removed
                        taken.orphaned += part.orphaned
                        taken.lifted += part.lifted
                        // An answer being read put the table off: the next tick tries again.
                        if part.deferred {
                            relayStateReadDueMs = now
                            return
                        }
                    }
                    guard !page.isLast, let last = page.rows.last?.key else { break }
                    after = last
                }
            }
            if taken.removed + taken.orphaned + taken.lifted > 0 {
                _ = try? await refreshDigest(waiting: false)
                signalChangeWatchers()
            }
            await freshStateTaken(
                from: "the relay", covering: state.heads, removed: taken.removed, orphaned: taken.orphaned
            )
        } catch {
            configuration.logger.warning(
                """
                could not take a fresh state through the relay (this database lost history, or peers collected \
                deletes without it); its own writes wait, and it tries again
                """,
                metadata: ["error": "\(error)"]
            )
        }
    }

    /// How long after a read of the relay's whole state that failed the next may start.
    static let relayStateReadIntervalMilliseconds: UInt64 = 30_000
    /// How long after a read whose snapshot did not cover the deletes collected without this node the next may start.
    static let relaySnapshotWaitMilliseconds: UInt64 = 3_000

    /// The cuts of the notices naming this node that it has not settled, merged (its own sites left out): what a
    /// source of its fresh state must hold.
    func suspensionCuts() async throws -> VersionVector {
        let own: Set<SiteID> = [siteID, registry.localSite]
        var cuts = VersionVector()
        for suspension in try await worker.unsettledSuspensions() { cuts.merge(suspension.cut) }
        return VersionVector(cuts.entries.filter { !own.contains($0.key) })
    }

    /// Whether this node should upload a snapshot to the relay, which holds one covering `snapshot`: it awaits no fresh
    /// state itself, and a member is suspended for collection with a cut the snapshot does not cover. That member,
    /// back through the relay alone, reads its fresh state from the snapshot (``takeFreshStateFromTheRelay()``).
    /// `nil`: this node must upload none (it awaits its fresh state: it may hold alive rows collected elsewhere).
    public func relaySnapshotOwed(covering snapshot: VersionVector) -> Bool? {
        guard !awaitingFreshState else { return nil }
        let mine: Set<SiteID> = [siteID, registry.localSite]
        return suspendedSites.contains { !mine.contains($0.key) && !snapshot.dominatesOrEquals($0.value) }
    }
    /// How long after a read this node did not hold all of yet the next may start.
    static let relayStateRereadMilliseconds: UInt64 = 1_000

    /// Whether the relay, holding `heads`, can give this node its fresh state: this node holds all of it, it holds
    /// all this node got from other sites (rows it holds from them are named there, unless collected) and the floor.
    private func relayMayGiveFreshState(heads: VersionVector) -> Bool {
        let local = worker.latestVersionVector.withLock { $0 }
        return relayLinked && !heads.isEmpty && heldWithRelay.dominatesOrEquals(withinFences(heads))
            && heads.dominatesOrEquals(local, ignoring: [siteID, registry.localSite])
            && heads.dominatesOrEquals(freshStateFloor)
    }

    /// What this node holds the effect of: its version vector, and what the relay's ranges brought (``relayBrought``:
    /// a former site of its own, say, whose last transaction was overwritten before any member sent it on, is never
    /// claimed here, and it never writes again).
    var heldWithRelay: VersionVector {
        var held = worker.latestVersionVector.withLock { $0 }
        held.merge(relayBrought)
        return held
    }

    /// Reads the removal fences again for ``withinFences(_:)`` (kept as they were if the read fails).
    func readFreshStateFences() async {
        if let fences = try? await worker.read({ store throws(ShoalError) in try store.fences() }) {
            freshStateFences = fences
        }
    }

    /// `vector` without what this node refuses: each removed member's site taken no further than its fence. Changes
    /// beyond a fence never come in here, so a peer or relay holding some (it has not heard of the removal yet: this
    /// node, awaiting its fresh state, holds back its own roster records, a removal it signed among them) is held in
    /// full once all else it holds is. Compared unfenced, neither side would ever move.
    func withinFences(_ vector: VersionVector) -> VersionVector {
        guard !freshStateFences.isEmpty else { return vector }
        var entries = vector.entries
        for (site, fence) in freshStateFences where entries[site, default: 0] > fence { entries[site] = fence }
        return VersionVector(entries)
    }

    private func freshStateTaken(from source: String, covering covers: VersionVector, removed: Int, orphaned: Int)
        async
    {
        do {
            try await worker.freshStateTaken(covering: covers)
        } catch {
            configuration.logger.warning("could not record the fresh state taken", metadata: ["error": "\(error)"])
            return
        }
        awaitingFreshState = false
        lastFreshStateCovers = covers
        collection.freshStatesTaken += 1
        nodeMetrics.freshStatesTaken.increment()
        await refreshSuspensions()
        configuration.logger.notice(
            """
            took a fresh state (this database lost history, or peers collected deletes without it while it was \
            silent); this node's own writes are sent again
            """,
            metadata: ["from": "\(source)", "removed": "\(removed)", "orphaned": "\(orphaned)"]
        )
        broadcast(.localChange)
        signalChangeWatchers()
    }
}

/// What a relay holds, read whole to take a fresh state through it (``SyncNode/readsRelayState(_:)``).
public struct RelayStateKeys: Sendable {
    /// The relay's heads when the read began; the read covers them.
    public var heads: VersionVector
    /// Per table, the encoded keys (``SQLValue/encodeKey(_:)``) of the rows its changes name, in its snapshot or its
    /// change log.
    public var keys: [String: Set<[UInt8]>]
    /// What the relay's snapshot the read started from covers (empty: it had none).
    public var snapshot: VersionVector

    /// What a read of the relay found.
    public init(heads: VersionVector, keys: [String: Set<[UInt8]>], snapshot: VersionVector = VersionVector()) {
        self.heads = heads
        self.keys = keys
        self.snapshot = snapshot
    }
}

/// Members suspended for collection (see `Store+Suspension.swift`): not pulled from until they took a fresh state; and
/// this node, once suspended, takes one.
extension SyncNode {
    /// Whether this node pulls from `peer`: not from a member suspended for collection until it told this node of a
    /// fresh state covering every cut collected without it.
    func mayPull(from peer: SiteID) -> Bool {
        guard let cut = suspendedSites[peer] else { return true }
        return peerFreshStates[peer]?.dominatesOrEquals(cut, ignoring: [peer]) ?? false
    }

    /// `peer` told this node of the fresh state it took: this node's own suspension of it is lifted if it covers it.
    func connectionPeerTookFreshState(peer: SiteID, _ vector: VersionVector) async {
        peerFreshStates[peer] = (peerFreshStates[peer] ?? VersionVector()).merging(vector)
        if (try? await worker.readmit(peer, covering: vector)) == true {
            configuration.logger.notice(
                "a member this node collected deletes without took a fresh state: it is pulled from again",
                metadata: ["peer": "\(peer.hex.prefix(8))"]
            )
        }
        await refreshSuspensions()
    }

    func freshStateCoverage() -> VersionVector? { lastFreshStateCovers }

    /// A peer answered a pull in full: while this node awaits its fresh state, the peer may give it (a peer that
    /// does not pull from this node, as one that suspended it, sends no acknowledgement to offer it by).
    func connectionAnswered(peer: SiteID, holding vector: VersionVector) {
        guard awaitingFreshState else { return }
        offerFreshState(peer: peer, peerVector: vector, localVector: worker.latestVersionVector.withLock { $0 })
    }

    /// ``refreshSuspensions()`` where deletes are collected (a roster, collection on): the relay link calls it once it
    /// pulled everything the relay held, before it uploads.
    package func lookAtSuspensions() async {
        guard collectsAmongMembers else { return }
        await refreshSuspensions()
    }

    /// Reads the suspensions again: who not to pull from, a notice of this node's deleted while it still collects
    /// without the member (written again), and whether this node itself was suspended (it then awaits a fresh state,
    /// and settles the notices its last fresh state covers).
    func refreshSuspensions() async {
        guard case (let rows, var own, let taken)? = try? await worker.suspensions() else { return }
        // A member's record of its fresh state reaches collectors it has no link to (through any peer).
        for (site, covers) in taken.sorted(by: { $0.key < $1.key }) {
            peerFreshStates[site] = (peerFreshStates[site] ?? VersionVector()).merging(covers)
            guard own[site] != nil, (try? await worker.readmit(site, covering: peerFreshStates[site] ?? covers)) == true
            else { continue }
            own[site] = nil
            configuration.logger.notice(
                "a member this node collected deletes without took a fresh state: it is pulled from again",
                metadata: ["peer": "\(site.hex.prefix(8))"]
            )
        }
        var cuts = own
        for row in rows { cuts[row.site, default: VersionVector()].merge(row.cut) }
        suspendedSites = cuts
        for (site, cut) in own.sorted(by: { $0.key < $1.key })
        where !rows.contains(where: { $0.site == site && $0.by == siteID }) {
            _ = try? await worker.suspend([site], cut: cut)
        }
        let mine: Set<SiteID> = [siteID, registry.localSite]
        if rows.contains(where: { !mine.contains($0.site) && taken[$0.site] != nil }) {
            _ = try? await worker.dropSettledNotices()
        }
        guard rows.contains(where: { mine.contains($0.site) }) else { return }
        // A notice that came while this node awaits its fresh state raises the floor: the fresh state it takes then
        // covers it too (two members back at once each took a second one, from a peer that lacked a later notice).
        let wasAwaiting = awaitingFreshState
        if (try? await worker.awaitFreshStateIfSuspended()) == true {
            awaitingFreshState = true
            freshStateFloor = (try? await worker.freshStateFloor()) ?? VersionVector()
            if !wasAwaiting { broadcast(.periodic) }
        }
        _ = try? await worker.settleSuspensions()
    }
}
