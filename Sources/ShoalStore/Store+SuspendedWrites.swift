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
/// - **Where they are left out.** A change of a member's site in a range written while it was suspended (after the
///   cut a notice naming it holds of it; up to where the member settled, as its record says), to a row of an app's
///   table this database holds no metadata of, at a causal length no higher than the table's floor (the highest any
///   node collected there), and that no other change of the same apply touches. It is counted as held (beaten), and
///   claimed: at worst it was a write to a row collected here, which the delete beat. (A row new to a node that knows
///   the floor starts its life above it, so only a life begun before it is ever left out.)
/// - **What the member does.** Its fresh state counts none of its own writes since the cut as held by the peer, which
///   may claim them having left them out: a row it wrote to whose life the peer holds, and the row not, was collected
///   (its writes go to the conflict log); a row it began meanwhile stays. When it settles, each row whose life began
///   with its writes since the cut, below the floor, is written again as a new life above it (one transaction, with
///   the settling), so that the nodes that left the first life out take this one; and its record says which of its
///   seqs were written while suspended, so that a node never told of the notice (one that caught up later, through the
///   relay) leaves out the same writes when they arrive from a range uploaded back then.
extension Store {
    /// The `shoal_meta` key of the seq of this database's own site after which its writes were made while suspended
    /// (the lowest cut of it a notice naming it holds), from when it learns it was suspended until it settles.
    static let suspendedWritesAfterKey = "suspended_writes_after"

    /// A member's transactions written while it was suspended: seqs `after + 1 ... through` of `site`.
    struct SuspendedWrites: Hashable, Sendable {
        var site: SiteID
        var after: UInt64
        var through: UInt64

        func contains(_ seq: UInt64) -> Bool { seq > after && seq <= through }

        /// As a member's record of its fresh state carries it, after the vector: `~HEX:AFTER:THROUGH` (three fields,
        /// which a vector's reader passes over).
        var text: String { "~\(site.hex):\(after):\(through)" }

        init(site: SiteID, after: UInt64, through: UInt64) {
            (self.site, self.after, self.through) = (site, after, through)
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
        var rows: [(site: SiteID, by: SiteID, text: String)] = []
        if capture.tableNumbers[Self.suspendedTable] != nil {
            let select = try statement("SELECT site, by, cut FROM \(Self.suspendedTable)")
            defer { select.reset() }
            while try select.step() {
                guard case .blob(let site) = select.column(0), let site = SiteID(bytes: site),
                    case .blob(let by) = select.column(1), let by = SiteID(bytes: by),
                    case .text(let text) = select.column(2)
                else { continue }
                rows.append((site, by, text))
            }
        }
        for change in changes where change.table == Self.suspendedTable {
            guard case .column("cut", .text(let text)) = change.payload, change.primaryKey.count == 2,
                case .blob(let site) = change.primaryKey[0], let site = SiteID(bytes: site),
                case .blob(let by) = change.primaryKey[1], let by = SiteID(bytes: by)
            else { continue }
            rows.append((site, by, text))
        }
        guard !rows.isEmpty else { return [:] }
        var ranges: [SiteID: [SuspendedWrites]] = [:]
        var settled: [SiteID: (covers: VersionVector, through: UInt64)] = [:]
        for row in rows where row.site == row.by {
            let carried = Self.suspendedWrites(inRecord: row.text)
            for range in carried { ranges[range.site, default: []].append(range) }
            let covers = Self.vector(fromText: row.text)
            let through = carried.filter { $0.site == row.site }.map(\.through).max() ?? 0
            if let known = settled[row.site], known.covers.dominatesOrEquals(covers) { continue }
            settled[row.site] = (covers, through)
        }
        for row in rows where row.site != row.by {
            let cut = Self.vector(fromText: row.text)
            var through = UInt64.max
            // A notice the member's record covers (held alive here after it settled) ends where the member settled.
            if let record = settled[row.site], record.covers.dominatesOrEquals(cut, ignoring: [row.site]) {
                through = record.through
            }
            guard through > cut[row.site] else { continue }
            ranges[row.site, default: []].append(SuspendedWrites(site: row.site, after: cut[row.site], through: through))
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
        let internalTables = Self.internalReplicatedTables.union([Self.rosterTable])
        var floors: [String: UInt64] = [:]
        var candidates: [Int] = []
        for (index, change) in changes.enumerated() {
            guard let site = ranges[change.stamp.site], site.contains(where: { $0.contains(change.stamp.seq) }),
                !internalTables.contains(change.table), capture.tableNumbers[change.table] != nil
            else { continue }
            let floor: UInt64
            if let known = floors[change.table] {
                floor = known
            } else {
                floor = try causalLengthFloor(change.table)
                floors[change.table] = floor
            }
            if change.causalLength <= floor { candidates.append(index) }
        }
        guard !candidates.isEmpty else { return 0 }
        // A row another change of this apply touches gets metadata from it: the write is merged with it.
        let candidateSet = Set(candidates)
        var touched: Set<RowIdentity> = []
        for (index, change) in changes.enumerated() where !candidateSet.contains(index) {
            touched.insert(RowIdentity(table: change.table, key: change.primaryKey))
        }
        var leftOut: Set<Int> = []
        for index in candidates {
            let change = changes[index]
            guard !touched.contains(RowIdentity(table: change.table, key: change.primaryKey)),
                let number = capture.tableNumbers[change.table],
                try loadState(table: capture.tables[number], key: change.primaryKey) == nil
            else { continue }
            leftOut.insert(index)
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
                left out writes a member made while suspended for collection, to rows this node holds nothing of \
                (collected here, or by the node it caught up from): they would have brought deleted rows back; the \
                member writes again what of them lives (at most one line a minute)
                """,
                metadata: ["changes": "\(sites.sorted { $0.key < $1.key }.map { "\($0.key.hex.prefix(8)):\($0.value)" })"]
            )
        }
        return leftOut.count
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

    /// `peerVector` with this database's own site taken down to ``ownSuspendedWritesAfter()``: a peer that left out
    /// its writes since then still claims them, but holds nothing of them.
    func withoutOwnSuspendedWrites(_ peerVector: VersionVector) throws(ShoalError) -> VersionVector {
        guard let after = try ownSuspendedWritesAfter(), peerVector[siteID] > after else { return peerVector }
        return VersionVector(peerVector.entries.merging([siteID: after]) { min($0, $1) })
    }

    /// Writes again, as new lives above their table's floor, the rows alive whose life began with this database's own
    /// writes `after + 1 ... through` (made while suspended) below that floor, inside the caller's write of this node
    /// (see the extension's comment). Returns how many.
    func liftOwnSuspendedLives(after: UInt64, through: UInt64) throws(ShoalError) -> Int {
        guard through > after else { return 0 }
        try refreshSites()
        let internalTables = Self.internalReplicatedTables.union([Self.rosterTable])
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
            guard !internalTables.contains(table.name) else { continue }
            let floor = try causalLengthFloor(table.name)
            guard floor > 0 else { continue }
            var reader = ByteReader(keys)
            while !reader.isAtEnd {
                let key = try Self.readLogKey(&reader, table: table)
                guard seen.insert(RowIdentity(table: table.name, key: key)).inserted,
                    let state = try loadState(table: table, key: key), state.isAlive, state.causalLength <= floor
                else { continue }
                // Its life began with a write of those: the life's own stamp, or (a first life) a cell those wrote
                // first; counters alone cannot tell, and count as begun there.
                let begun: Bool
                if let life = state.lengthStamp {
                    begun = written(life.dot)
                } else {
                    let values = state.cells.contains { if case .value = $0 { true } else { false } }
                    begun = state.cells.contains { cell in
                        switch cell {
                        case .value(let stamp, let previous): previous == nil && written(stamp.dot)
                        case .counter(let entries):
                            !values && entries.contains { written(Dot(site: $0.key, seq: $0.value.seq)) }
                        case .empty: false
                        }
                    }
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
