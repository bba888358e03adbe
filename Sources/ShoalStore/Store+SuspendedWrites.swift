import ShoalCore

/// A suspended member's writes made while it was away, which may touch rows collected meanwhile (see
/// `Store+Suspension.swift`).
///
/// No node pulls from a suspended member, but such writes can still travel: the member uploaded them to the relay
/// before it knew it was suspended (its pull came back empty, or the collector's notice was not uploaded yet), and a
/// node that took them (holding the rows' tombstones, so harmlessly) passes them on. A node that collected the rows,
/// or caught up from one that had, holds nothing of them and would take such a write for a row new to it: the row came
/// back. So every node leaves those writes out where they could do that, and the member writes again what of them
/// must live:
/// - **Where they are left out.** A member's transaction's changes to one row, in a range written while it was
///   suspended (after the cut of it a notice naming it holds; up to where it settled, as its record says), to a row of
///   an app's table this database holds no metadata of, that no other change of the same apply touches, when they
///   update a value this database holds the write of (it held the row, and collected it, or caught up from a node that
///   had); or, counters alone, when the row's causal length is at or below the table's floor and this database holds
///   all the collector held. They count as held (beaten), and are claimed. A row the member began meanwhile is kept; so
///   is every write at a node that lacks the row for want of its first write (a newcomer catching up).
/// - **What the member does.** Its fresh state counts its own updates since the cut as not held by the peer, which may
///   claim them having left them out: a row it updated whose life the peer holds, and the row not, was collected (its
///   writes go to the conflict log). When it settles, each row whose life began with its writes since the cut, below
///   the floor, is written again as a new life above it (one transaction, with the settling: a node that collected a
///   key and one that keeps its tombstone must agree on the row), and its record says which of its seqs were written
///   while suspended, so that a node never told of the notice (one that caught up later, through the relay) leaves out
///   the same writes when they arrive from a range uploaded back then. A collector writing its notice again keeps the
///   member's own entry of the cut where it was: past it, the writes were made while suspended.
extension Store {
    /// The `shoal_meta` key of the seq of this database's own site after which its writes were made while suspended
    /// (the lowest cut of it a notice naming it holds), from when it learns it was suspended until it settles.
    static let suspendedWritesAfterKey = "suspended_writes_after"
    /// Shoal's own replicated tables and the roster: their rows are neither left out nor written again.
    static let notAppTables = internalReplicatedTables.union([rosterTable])

    /// A member's transactions written while it was suspended: seqs `after + 1 ... through` of `site`.
    struct SuspendedWrites: Hashable, Sendable {
        var site: SiteID
        var after: UInt64
        var through: UInt64
        /// What the collector held when it collected without the member (a notice's cut), or what the member's
        /// fresh state covered (its record's): a node that holds it holds every delete collected without the member.
        /// Not in ``text``, nor compared.
        var cut = VersionVector()

        static func == (lhs: Self, rhs: Self) -> Bool {
            lhs.site == rhs.site && lhs.after == rhs.after && lhs.through == rhs.through
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(site)
            hasher.combine(after)
            hasher.combine(through)
        }

        func contains(_ seq: UInt64) -> Bool { seq > after && seq <= through }

        /// As a member's record of its fresh state carries it, after the vector: `~HEX:AFTER:THROUGH` (three fields,
        /// which a vector's reader passes over).
        var text: String { "~\(site.hex):\(after):\(through)" }

        init(site: SiteID, after: UInt64, through: UInt64, cut: VersionVector = VersionVector()) {
            (self.site, self.after, self.through, self.cut) = (site, after, through, cut)
        }

        init?(text: Substring) {
            guard text.hasPrefix("~") else { return nil }
            let fields = text.dropFirst().split(separator: ":")
            guard fields.count == 3, let site = SiteID(hex: String(fields[0])), let after = UInt64(fields[1]),
                let through = UInt64(fields[2]), through > after
            else { return nil }
            self.init(site: site, after: after, through: through)
        }
    }

    /// The ranges written while suspended that a member's record (`text`: ``vectorText(_:)``, then these) carries.
    static func suspendedWrites(inRecord text: String) -> [SuspendedWrites] {
        text.split(separator: ",").compactMap(SuspendedWrites.init(text:))
    }

    /// Per site, its ranges written while suspended, as the notices and members' records held here say, and those
    /// arriving among `changes` (an apply's, so that a snapshot carrying a notice counts it for its other changes).
    func suspendedWriteRanges(arriving changes: [Change] = []) throws(ShoalError) -> [SiteID: [SuspendedWrites]] {
        var rows = try suspendedRowTexts()
        for change in changes where change.table == Self.suspendedTable {
            guard case .column("cut", .text(let text)) = change.payload, change.primaryKey.count == 2,
                case .blob(let site) = change.primaryKey[0], let site = SiteID(bytes: site),
                case .blob(let by) = change.primaryKey[1], let by = SiteID(bytes: by)
            else { continue }
            rows.append((site, by, text))
        }
        guard !rows.isEmpty else { return [:] }
        var ranges: [SiteID: [SuspendedWrites]] = [:]
        var settled: [SiteID: (covers: VersionVector, carried: [SuspendedWrites])] = [:]
        for row in rows where row.site == row.by {
            let covers = Self.vector(fromText: row.text)
            let carried = Self.suspendedWrites(inRecord: row.text).map { range in
                var range = range
                range.cut = covers
                return range
            }
            for range in carried { ranges[range.site, default: []].append(range) }
            if let known = settled[row.site], known.covers.dominatesOrEquals(covers) { continue }
            settled[row.site] = (covers, carried)
        }
        for row in rows where row.site != row.by {
            let cut = Self.vector(fromText: row.text)
            let after = cut[row.site]
            var through = UInt64.max
            // A notice the member's record covers (held alive here after it settled) ends where the member settled
            // the suspension it began.
            if let record = settled[row.site], record.covers.dominatesOrEquals(cut, ignoring: [row.site]) {
                let own = record.carried.filter { $0.site == row.site }
                through = (own.first { $0.after == after } ?? own.max { $0.through < $1.through })?.through ?? after
            }
            if through > after {
                ranges[row.site, default: []].append(
                    SuspendedWrites(site: row.site, after: after, through: through, cut: cut)
                )
            }
            // The member's writes under a fresh site it signed (restored or copied): the notice names it by its
            // membership, its record by the site it writes under.
            for site in memberWritingSites[row.site] ?? [] where site != row.site {
                let after = cut[site]
                var through = UInt64.max
                if let record = settled[row.site], record.covers.dominatesOrEquals(cut, ignoring: [row.site, site]) {
                    let own = record.carried.filter { $0.site == site }
                    through = (own.first { $0.after == after } ?? own.max { $0.through < $1.through })?.through ?? after
                }
                guard through > after else { continue }
                ranges[site, default: []].append(SuspendedWrites(site: site, after: after, through: through, cut: cut))
            }
        }
        return ranges
    }

    /// Leaves out of `changes` (an apply's, after those already held) the writes a suspended member made while away
    /// that could bring a collected row back (see the extension's comment); returns how many.
    func leaveOutSuspendedWrites(_ changes: inout [Change]) throws(ShoalError) -> Int {
        guard capture.tableNumbers[Self.suspendedTable] != nil
            || changes.contains(where: { $0.table == Self.suspendedTable })
        else { return 0 }
        let ranges = try suspendedWriteRanges(arriving: changes)
        guard !ranges.isEmpty else { return 0 }
        // A member's transaction's changes to one row, in a range written while suspended.
        var groups: [RowWrite: (indices: [Int], range: SuspendedWrites)] = [:]
        for (index, change) in changes.enumerated() {
            guard let range = ranges[change.stamp.site]?.first(where: { $0.contains(change.stamp.seq) }),
                !Self.notAppTables.contains(change.table), capture.tableNumbers[change.table] != nil
            else { continue }
            groups[RowWrite(dot: change.dot, table: change.table, key: change.primaryKey), default: ([], range)]
                .indices.append(index)
        }
        guard !groups.isEmpty else { return 0 }
        // A row another change of this apply touches gets metadata from it: the write is merged with it.
        let candidates = Set(groups.values.flatMap(\.indices))
        var touched: Set<RowIdentity> = []
        for (index, change) in changes.enumerated() where !candidates.contains(index) {
            touched.insert(RowIdentity(table: change.table, key: change.primaryKey))
        }
        let held = try versionVector()
        let arrivingFloors = Self.arrivingFloors(changes)
        var leftOut: Set<Int> = []
        for (write, group) in groups {
            guard !touched.contains(RowIdentity(table: write.table, key: write.key)),
                let number = capture.tableNumbers[write.table],
                try loadState(table: capture.tables[number], key: write.key) == nil
            else { continue }
            // This database holds nothing of the row. An update of a write it holds: it held the row, and collected
            // it. A row begun by the write (no write overwritten): kept (the member writes it again above the floor
            // when it settles, if it began below). Counters alone say neither: left out where the row's causal length
            // is at or below the floor and this database holds all the collector held, so that a node still catching
            // up, which lacks the row for want of its first write, keeps them.
            var begins = false
            var overwritesHeld = false
            var values = false
            var counters = false
            for index in group.indices {
                switch changes[index].payload {
                case .column:
                    values = true
                    if let previous = changes[index].previous {
                        if held.covers(previous) { overwritesHeld = true }
                    } else {
                        begins = true
                    }
                case .counter: counters = true
                case .row: break
                }
            }
            let out: Bool
            if begins || !counters && !overwritesHeld {
                out = false
            } else if overwritesHeld {
                out = true
            } else if values {
                out = false
            } else {
                let length = changes[group.indices[0]].causalLength
                let floor = max(try causalLengthFloor(write.table), arrivingFloors[write.table] ?? 0)
                out = length <= floor && held.dominatesOrEquals(group.range.cut)
            }
            if out { leftOut.formUnion(group.indices) }
        }
        guard !leftOut.isEmpty else { return 0 }
        var kept: [Change] = []
        kept.reserveCapacity(changes.count - leftOut.count)
        var sites: [SiteID: Int] = [:]
        for (index, change) in changes.enumerated() {
            if leftOut.contains(index) {
                sites[change.stamp.site, default: 0] += 1
            } else {
                kept.append(change)
            }
        }
        changes = kept
        let now = options.clock.nowMilliseconds()
        if suspendedWritesWarnedAt.map({ now < $0 || now - $0 >= Self.fencedWarningInterval }) ?? true {
            suspendedWritesWarnedAt = now
            options.logger.notice(
                """
                left out writes a member made while suspended for collection, to rows this node held and collected \
                (or the node it caught up from did): they would have brought deleted rows back (at most one line a \
                minute)
                """,
                metadata: ["changes": "\(sites.sorted { $0.key < $1.key }.map { "\($0.key.hex.prefix(8)):\($0.value)" })"]
            )
        }
        return leftOut.count
    }

    /// The highest floor per table among `changes` (rows of ``collectedTable`` arriving with them).
    static func arrivingFloors(_ changes: [Change]) -> [String: UInt64] {
        var floors: [String: UInt64] = [:]
        for change in changes where change.table == collectedTable {
            guard case .column("cl", .integer(let floor)) = change.payload, floor > 0,
                case .text(let table) = change.primaryKey.first
            else { continue }
            let even = UInt64(floor) &+ UInt64(floor) % 2
            floors[table] = max(floors[table] ?? 0, even)
        }
        return floors
    }

    /// The seq of this database's own site after which its writes were made while it was suspended, from when it
    /// learned so until it settled (`nil` otherwise).
    public func ownSuspendedWritesAfter() throws(ShoalError) -> UInt64? {
        guard case .integer(let after) = try connection.scalar(
            "SELECT value FROM shoal_meta WHERE key = ?", [.text(Self.suspendedWritesAfterKey)]
        ) else { return nil }
        return UInt64(max(0, after))
    }

    /// Lowers ``ownSuspendedWritesAfter()`` to `after` (or sets it).
    func noteOwnSuspendedWrites(after: UInt64) throws(ShoalError) {
        if let known = try ownSuspendedWritesAfter(), known <= after { return }
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.suspendedWritesAfterKey), .integer(Int64(clamping: after))]
        )
    }

    /// The writes of this database made while it was suspended (after `after`) that a peer may have left out and
    /// still claim, in `state`: its updates of a value it held, and its counter entries (see
    /// ``leaveOutSuspendedWrites(_:)``).
    func ownUpdatesWhileSuspended(in state: RowState, after: UInt64) -> Set<Dot> {
        func written(_ stamp: Stamp) -> Bool { stamp.site == siteID && stamp.seq > after }
        // A row this database began meanwhile was kept wherever it went: none of its writes was left out.
        if let life = state.lengthStamp, written(life) { return [] }
        let begun = state.cells.contains { cell in
            if case .value(let stamp, nil) = cell { written(stamp) } else { false }
        }
        if begun { return [] }
        var dots: Set<Dot> = []
        for cell in state.cells {
            switch cell {
            case .value(let stamp, .some) where stamp.site == siteID && stamp.seq > after: dots.insert(stamp.dot)
            case .counter(let entries):
                if let own = entries[siteID], own.seq > after { dots.insert(Dot(site: siteID, seq: own.seq)) }
            default: break
            }
        }
        return dots
    }

    /// Writes again, as new lives above their table's floor, the rows alive whose life began with this database's own
    /// writes `after + 1 ... through` (made while suspended) below that floor, inside the caller's write of this node
    /// (see the extension's comment). Returns how many.
    func liftOwnSuspendedLives(after: UInt64, through: UInt64) throws(ShoalError) -> Int {
        guard through > after else { return 0 }
        try refreshSites()
        let select = try statement(
            "SELECT DISTINCT tbl, keys FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ?"
        )
        try select.bind([.integer(ownSiteIndex), .integer(Int64(clamping: after)), .integer(Int64(clamping: through))])
        var logged: [(table: Int64, keys: [UInt8])] = []
        while try select.step() {
            guard case .integer(let table) = select.column(0), case .blob(let keys) = select.column(1) else { continue }
            logged.append((table, keys))
        }
        select.reset()
        let numbers = Dictionary(uniqueKeysWithValues: capture.tables.indices.map { (capture.tables[$0].id, $0) })
        func written(_ dot: Dot) -> Bool { dot.site == siteID && dot.seq > after && dot.seq <= through }
        var seen: Set<RowIdentity> = []
        var lifted = 0
        for (tableID, keys) in logged {
            guard let number = numbers[tableID] else { continue }
            let table = capture.tables[number]
            guard !Self.notAppTables.contains(table.name) else { continue }
            let floor = try causalLengthFloor(table.name)
            guard floor > 0 else { continue }
            var reader = ByteReader(keys)
            while !reader.isAtEnd {
                let key = try Self.readLogKey(&reader, table: table)
                guard seen.insert(RowIdentity(table: table.name, key: key)).inserted,
                    let state = try loadState(table: table, key: key), state.isAlive, state.causalLength <= floor
                else { continue }
                // Its life began with a write of those: the life's own stamp, or (a first life) a cell those wrote
                // first, or (counters alone) every counter entry one of those.
                let begun: Bool
                if let life = state.lengthStamp {
                    begun = written(life.dot)
                } else if state.cells.contains(where: { if case .value = $0 { true } else { false } }) {
                    begun = state.cells.contains { cell in
                        if case .value(let stamp, nil) = cell { written(stamp.dot) } else { false }
                    }
                } else {
                    let entries = state.cells.flatMap { cell -> [Dot] in
                        guard case .counter(let entries) = cell else { return [] }
                        return entries.map { Dot(site: $0.key, seq: $0.value.seq) }
                    }
                    begun = !entries.isEmpty && entries.allSatisfy(written)
                }
                guard begun, try dataRowExists(table: table, key: key) else { continue }
                try liftAbove(floor, table: number, key: key)
                lifted += 1
            }
        }
        return lifted
    }
}

/// A row of a table, by name and key.
private struct RowIdentity: Hashable {
    var table: String
    var key: [SQLValue]
}

/// One transaction's changes to one row.
private struct RowWrite: Hashable {
    var dot: Dot
    var table: String
    var key: [SQLValue]
}
