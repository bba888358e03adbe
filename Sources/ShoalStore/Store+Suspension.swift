import ShoalCore

/// A member suspended for collection: a node with a horizon (`shoal serve --gc-horizon`) collected tombstones without
/// waiting for it, since it was silent longer than the horizon.
public struct Suspension: Sendable, Hashable {
    /// The member, by the site its membership names.
    public var site: SiteID
    /// The node that collected without it.
    public var by: SiteID
    /// How far that node collected without it: a fresh state the member takes must cover this.
    public var cut: VersionVector

    /// A suspension of `site` by `by`, who collected up to `cut` without it.
    public init(site: SiteID, by: SiteID, cut: VersionVector) {
        self.site = site
        self.by = by
        self.cut = cut
    }
}

/// Members suspended for collection, and how they come back.
///
/// A node with a horizon collects tombstones without the members silent longer than it. Such a member may still hold
/// rows alive that were deleted and collected meanwhile, and writes to them no peer has seen: a node lacking the
/// tombstone would take them as rows new to it. So before the first pass that leaves a member out, the collector
/// records it in the replicated table ``suspendedTable`` (one row per member and collector, with the cut it collected
/// up to), which reaches every node ahead of the collection's effects. Then:
/// - no node pulls from a suspended member (``SyncNode`` checks each round) until it showed that it took a fresh state
///   covering every such cut; it may pull from them meanwhile, and others answer it;
/// - the member, once it holds a row naming it, awaits a fresh state (its own writes wait, as a restored copy's do),
///   takes it from a peer that holds the cuts (`Store+FreshState.swift`: rows collected meanwhile go, its writes to
///   them go to the conflict log), tells its peers, deletes the rows naming it, and records what that fresh state
///   covered in a row of its own (`site` = `by` = itself, ``freshStatesTaken()``). That row reaches collectors it has
///   no link to: each lifts its suspension once the row covers its own record. Without it, a collector the member
///   never met again wrote its notice back whenever the member deleted it, and (seeing the member silent) moved its
///   cut past the member's own deletion, so the member took one fresh state after another.
extension Store {
    /// The replicated table of suspensions: `(site, by)` → the cut `by` collected up to without `site`, as text
    /// (`hex:seq,…`).
    public static let suspendedTable = "shoal_suspended"
    /// The `shoal_meta` key of what the last fresh state this database took covers (the peer's vector then).
    static let freshStateCoversKey = "fresh_state_covers"

    /// Creates and replicates ``suspendedTable`` inside the caller's write transaction, if it is missing.
    func prepareSuspendedTableInTransaction() throws(ShoalError) {
        try prepareInternalTableInTransaction(
            Self.suspendedTable,
            columns: "site BLOB NOT NULL, by BLOB NOT NULL, cut TEXT NOT NULL DEFAULT '', PRIMARY KEY(site, by)"
        )
    }

    /// A version vector as stored in text (`hex:seq,…`, by site).
    static func vectorText(_ vector: VersionVector) -> String {
        vector.entries.sorted { $0.key < $1.key }.map { "\($0.key.hex):\($0.value)" }.joined(separator: ",")
    }

    /// The version vector `text` (``vectorText(_:)``) holds; what is not an entry is passed over.
    static func vector(fromText text: String) -> VersionVector {
        var entries: [SiteID: UInt64] = [:]
        for item in text.split(separator: ",") {
            let parts = item.split(separator: ":")
            guard parts.count == 2, let site = SiteID(hex: String(parts[0])), let seq = UInt64(parts[1]) else {
                continue
            }
            entries[site] = max(entries[site] ?? 0, seq)
        }
        return VersionVector(entries)
    }

    /// Records, in one transaction, that this node collects without `sites` up to `cut`: in its own record (which
    /// only ``readmit(_:covering:)`` lifts) and, as a write of this node, in ``suspendedTable`` (a row already
    /// covering it is left alone; one deleted meanwhile is written again). Returns the sites whose row was written.
    @discardableResult
    public func suspend(_ sites: Set<SiteID>, cut: VersionVector) throws(ShoalError) -> [SiteID] {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "record a suspension outside of any open transaction")
        }
        guard !sites.isEmpty else { return [] }
        let recorded = try suspensions().filter { $0.by == siteID }
        let own = try ownSuspensions()
        let taken = try freshStatesTaken()
        try refreshSites()
        var due: [(SiteID, VersionVector)] = []
        for site in sites.sorted() {
            var merged = own[site] ?? VersionVector()
            merged.merge(cut)
            // The member's own entry stays where this node first collected without it: past it, its writes were made
            // while suspended (``suspendedWriteRanges(arriving:)``). This node claims those it left out, and a cut
            // moved past them would hide them from the member's fresh state.
            // So do its entries of the sites it signed that it writes under (``memberWritingSites``).
            let writing = (memberWritingSites[site] ?? []).union([site])
            if let first = own[site] ?? recorded.first(where: { $0.site == site })?.cut {
                let pinned = Dictionary(uniqueKeysWithValues: writing.map { ($0, first[$0]) })
                merged = VersionVector(merged.entries.merging(pinned) { _, pinned in pinned })
            }
            // What the member was told already: this node's notice; else its own record; else what the member's last
            // fresh state covered. A cut that moved beyond it only by Shoal's own rows, or by the member's own writes
            // (it holds those), collected nothing the member may hold alive: no notice with a cut that moves at every
            // pass, for as long as the member is silent to this node. (A notice deleted while this node's own record
            // stands is written again as it was.)
            let notice = recorded.first { $0.site == site }?.cut
            if let told = notice ?? own[site] ?? taken[site],
                try !movesBeyondInternalWrites(from: told, to: merged, ignoring: writing)
            {
                if notice == nil, let record = own[site] { due.append((site, record)) }
                continue
            }
            due.append((site, merged))
        }
        guard !due.isEmpty else { return [] }
        try writingOwnChanges { () throws(ShoalError) in
            try prepareSuspendedTableInTransaction()
            for (site, merged) in due {
                try connection.rows(
                    "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
                    [.text(Self.suspensionKeyPrefix + site.hex), .text(Self.vectorText(merged))]
                )
                try connection.rows(
                    "INSERT OR REPLACE INTO \(Self.suspendedTable)(site, by, cut) VALUES (?, ?, ?)",
                    [.blob(site.bytes), .blob(siteID.bytes), .text(Self.vectorText(merged))]
                )
                capture.statementSucceeded()
            }
        }
        return due.map(\.0)
    }

    /// Whether `to` holds, beyond `from`, a transaction that wrote a table other than Shoal's own replicated ones
    /// (``internalReplicatedTables``). A cut that moved only by such writes (suspension notices and members' reports,
    /// this one's and other collectors') collected no delete more: recording it again would write another notice,
    /// which moves the next cut, at every pass of every collector.
    /// Entries of `ignoring` (a member's own writes) are passed over.
    func movesBeyondInternalWrites(
        from: VersionVector,
        to: VersionVector,
        ignoring: Set<SiteID> = []
    ) throws(ShoalError) -> Bool {
        let internalIDs = Self.internalReplicatedTables.compactMap { capture.tableNumbers[$0] }.map { capture.tables[$0].id }
        let select = try statement(
            "SELECT 1 FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ? AND tbl NOT IN ("
                + (internalIDs.isEmpty ? "NULL" : internalIDs.map(String.init).joined(separator: ", ")) + ") LIMIT 1"
        )
        for (site, seq) in to.entries where seq > from[site] && !ignoring.contains(site) {
            guard let index = sites.existingIndex(of: site) else { return true }
            try select.bind([.integer(Int64(index)), .integer(Int64(from[site])), .integer(Int64(seq))])
            let found = try select.step()
            select.reset()
            if found { return true }
        }
        return false
    }

    /// Runs `body` in a write transaction of its own, whose captured statements are changes of this node.
    func writingOwnChanges(_ body: () throws(ShoalError) -> Void) throws(ShoalError) {
        try beginWriting()
        do throws(ShoalError) {
            try body()
            try flushCaptured()
            try connection.exec("COMMIT")
            transactionStamp = nil
        } catch {
            abandonWrite()
            throw error
        }
    }

    /// The `shoal_meta` key prefix of this node's own record of the members it collects without (by site, in hex).
    static let suspensionKeyPrefix = "suspension_"

    /// The members this node collects without, as its own record says, with how far it collected without them: it
    /// does not pull from them until they showed a fresh state covering that.
    public func ownSuspensions() throws(ShoalError) -> [SiteID: VersionVector] {
        var result: [SiteID: VersionVector] = [:]
        for row in try connection.rows(
            "SELECT key, value FROM shoal_meta WHERE key LIKE 'suspension\\_%' ESCAPE '\\'"
        ) {
            guard case .text(let key) = row[0], case .text(let cut) = row[1],
                let site = SiteID(hex: String(key.dropFirst(Self.suspensionKeyPrefix.count)))
            else { continue }
            result[site] = Self.vector(fromText: cut)
        }
        return result
    }

    /// Lifts this node's own suspension of `site` if `covers` (the vector of the fresh state it took) covers how far
    /// this node collected without it. Returns whether it was lifted.
    @discardableResult
    public func readmit(_ site: SiteID, covering covers: VersionVector) throws(ShoalError) -> Bool {
        guard let cut = try ownSuspensions()[site], covers.dominatesOrEquals(cut, ignoring: [site]) else {
            return false
        }
        try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text(Self.suspensionKeyPrefix + site.hex)])
        return true
    }

    /// Every suspension this database holds (in ``suspendedTable``), but the members' records of their fresh states.
    public func suspensions() throws(ShoalError) -> [Suspension] {
        try suspendedRows().filter { $0.site != $0.by }
    }

    /// What the last fresh state each member took after a suspension covered, as its own row in ``suspendedTable``
    /// says (`site` = `by`): a collector lifts its suspension of the member once this covers its own record, even with
    /// no link to it.
    public func freshStatesTaken() throws(ShoalError) -> [SiteID: VersionVector] {
        var taken: [SiteID: VersionVector] = [:]
        for row in try suspendedRows() where row.site == row.by { taken[row.site] = row.cut }
        return taken
    }

    /// Every row of ``suspendedTable``.
    private func suspendedRows() throws(ShoalError) -> [Suspension] {
        try refreshSchema()
        return try suspendedRowTexts().map { Suspension(site: $0.site, by: $0.by, cut: Self.vector(fromText: $0.text)) }
    }

    /// Every row of ``suspendedTable`` as stored: the member, the collector, and the cut as text (a member's own
    /// record carries, after the vector, the ranges it wrote while suspended: `Store+SuspendedWrites.swift`).
    func suspendedRowTexts() throws(ShoalError) -> [(site: SiteID, by: SiteID, text: String)] {
        guard capture.tableNumbers[Self.suspendedTable] != nil else { return [] }
        let select = try statement("SELECT site, by, cut FROM \(Self.suspendedTable)")
        defer { select.reset() }
        var rows: [(site: SiteID, by: SiteID, text: String)] = []
        while try select.step() {
            guard case .blob(let site) = select.column(0), let site = SiteID(bytes: site),
                case .blob(let by) = select.column(1), let by = SiteID(bytes: by),
                case .text(let text) = select.column(2)
            else { continue }
            rows.append((site, by, text))
        }
        return rows
    }

    /// What the last fresh state this database took covers (empty if it took none).
    public func freshStateCovers() throws(ShoalError) -> VersionVector {
        guard case .text(let text) = try connection.scalar(
            "SELECT value FROM shoal_meta WHERE key = ?", [.text(Self.freshStateCoversKey)]
        ) else { return VersionVector() }
        return Self.vector(fromText: text)
    }

    /// The suspensions naming this database (by its site or its membership's) that its last fresh state does not
    /// cover.
    public func unsettledSuspensions() throws(ShoalError) -> [Suspension] {
        let own: Set<SiteID> = [siteID, identitySiteID]
        let covers = try freshStateCovers()
        return try suspensions().filter {
            own.contains($0.site) && !covers.dominatesOrEquals($0.cut, ignoring: own)
        }
    }

    /// Marks this database as awaiting a fresh state that covers the suspensions naming it (``unsettledSuspensions()``),
    /// if any; its floor takes their cuts (also while it awaits one already). Returns whether it awaits one now.
    @discardableResult
    public func awaitFreshStateIfSuspended() throws(ShoalError) -> Bool {
        let unsettled = try unsettledSuspensions()
        let awaiting = try awaitsFreshState()
        guard !unsettled.isEmpty else { return awaiting }
        // A peer holding the cuts holds every delete collected without this node, collected or as a tombstone.
        var floor = try freshStateFloor()
        for suspension in unsettled { floor.merge(suspension.cut) }
        let own: Set<SiteID> = [siteID, identitySiteID]
        floor = VersionVector(floor.entries.filter { !own.contains($0.key) })
        // Its writes past the lowest cut of it were made while suspended (``ownSuspendedWritesAfter()``).
        try noteOwnSuspendedWrites(after: unsettled.map { $0.cut[siteID] }.min() ?? 0)
        try connection.rows(
            "INSERT OR IGNORE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.freshStateKey), .integer(Int64(clamping: options.clock.nowMilliseconds()))]
        )
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.freshStateFloorKey), .text(Self.vectorText(floor))]
        )
        // (Awaiting already, the floor takes the notices that came since: one fresh state covers them all.)
        if !awaiting {
            options.logger.warning(
                """
                a peer collected deleted rows without this node, silent longer than its horizon: this node takes a \
                fresh state before its own writes leave it (rows collected meanwhile go, and its writes to them go \
                to the conflict log)
                """,
                metadata: ["by": "\(unsettled.map { $0.by.hex.prefix(8) })"]
            )
        }
        return true
    }

    /// Deletes, as a write of this node, the notices naming another member that the member's own record of its fresh
    /// state (``freshStatesTaken()``) covers: that member deleted them itself when it settled, but this node may hold
    /// one alive that others collected meanwhile (it was away, and silent to a collector that moved no cut past what
    /// the member's record covers). Held alive, such a notice made this node's digest differ from its peers' at equal
    /// vectors. Returns how many.
    @discardableResult
    public func dropSettledNotices() throws(ShoalError) -> Int {
        guard connection.isAutocommit, !capture.hasUncommittedWork, try !awaitsFreshState() else { return 0 }
        let own: Set<SiteID> = [siteID, identitySiteID]
        let taken = try freshStatesTaken()
        let settled = try suspensions().filter { notice in
            guard !own.contains(notice.site), let covers = taken[notice.site] else { return false }
            return covers.dominatesOrEquals(notice.cut, ignoring: [notice.site])
        }
        guard !settled.isEmpty else { return 0 }
        try writingOwnChanges { () throws(ShoalError) in try deleteNotices(settled) }
        return settled.count
    }

    /// Deletes `notices` from ``suspendedTable``, inside the caller's write of this node.
    private func deleteNotices(_ notices: [Suspension]) throws(ShoalError) {
        for notice in notices {
            try connection.rows(
                "DELETE FROM \(Self.suspendedTable) WHERE site = ? AND by = ?",
                [.blob(notice.site.bytes), .blob(notice.by.bytes)]
            )
            capture.statementSucceeded()
        }
    }

    /// Deletes, as a write of this node, the suspensions naming it that its last fresh state covers, and records what
    /// that covered in its own row (``freshStatesTaken()``), for the collectors it has no link to. Returns how many
    /// it deleted.
    @discardableResult
    public func settleSuspensions() throws(ShoalError) -> Int {
        guard connection.isAutocommit, !capture.hasUncommittedWork, try !awaitsFreshState() else { return 0 }
        let own: Set<SiteID> = [siteID, identitySiteID]
        let covers = try freshStateCovers()
        let settled = try suspensions().filter {
            own.contains($0.site) && covers.dominatesOrEquals($0.cut, ignoring: own)
        }
        guard !settled.isEmpty else { return 0 }
        let records = Dictionary(
            try suspendedRowTexts().filter { $0.site == $0.by }.map { ($0.site, $0.text) }
        ) { first, _ in first }
        // Its writes since the lowest cut of it, up to here, were made while suspended (see
        // `Store+SuspendedWrites.swift`): the lives they began below a floor are written again above it, in this
        // transaction, and its record says which writes they were.
        let through = try versionVector()[siteID]
        let after = try ownSuspendedWritesAfter() ?? settled.map { $0.cut[siteID] }.min() ?? through
        let written = SuspendedWrites(site: siteID, after: after, through: through)
        var lifted = 0
        try writingOwnChanges { () throws(ShoalError) in
            lifted = try liftOwnSuspendedLives(after: after, through: through)
            try deleteNotices(settled)
            for site in Set(settled.map(\.site)).sorted() {
                var carried = Self.suspendedWrites(inRecord: records[site] ?? "")
                if through > after, !carried.contains(written) { carried.append(written) }
                let text = ([Self.vectorText(covers)] + carried.map(\.text)).filter { !$0.isEmpty }
                    .joined(separator: ",")
                guard text != records[site] else { continue }
                try connection.rows(
                    "INSERT OR REPLACE INTO \(Self.suspendedTable)(site, by, cut) VALUES (?, ?, ?)",
                    [.blob(site.bytes), .blob(site.bytes), .text(text)]
                )
                capture.statementSucceeded()
            }
            try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text(Self.suspendedWritesAfterKey)])
        }
        if lifted > 0 {
            options.logger.notice(
                """
                rows this node began while suspended for collection were written again above the tombstones peers \
                collected in their table meanwhile, so that every node keeps them
                """,
                metadata: ["rows": "\(lifted)"]
            )
        }
        return settled.count
    }
}
