import ShoalCore

/// What one look at a peer's rows did for a database awaiting its fresh state.
public struct FreshStateReport: Sendable, Hashable {
    /// Rows the peer deleted and collected while this database was away: removed here.
    public var removed = 0
    /// Rows the peer deleted and collected, which this database wrote to since it lost history (writes no peer has
    /// seen): removed here, and each of those writes put in the conflict log.
    public var orphaned = 0
    /// Rows this database began since it lost history, not knowing yet how far peers had collected tombstones in
    /// their table: written again as lives above that floor (``Store/causalLengthFloor(_:)``), as a row new to this
    /// database is, so that every node keeps them, whether it still holds a tombstone of the key or collected it.
    public var lifted = 0
    /// Whether the look was put off because an answer to a peer was being read: nothing was done, try again.
    public var deferred = false

    /// A report of a look that did nothing yet.
    public init() {}
}

/// A database that lost part of its history takes a fresh state from a peer before its own writes leave it.
///
/// Tombstones are collected once every member holds the delete (see ``collectTombstones(upTo:maxRows:)``), and a
/// member is counted as holding what it showed it held. A database restored from an older copy, or a file copied from
/// another node, holds less than that: it may hold rows alive that its peers deleted and collected since. Syncing
/// cannot tell it so, since no tombstone is left to send: it claims the delete's transaction (its peer sends it, with
/// nothing of the collected row in it) and keeps the row. And what it writes to such a row would bring a part of it
/// back on every peer (a peer that collected the row takes the write as a row new to it).
///
/// So such a database is marked when it moves to its fresh site (``IdentityChange``). Until it took its fresh state
/// its answers leave out its own writes (``deltaCursor(since:)``: neither sent nor claimed), and once it holds all a
/// peer holds, it lists the rows in which it differs from that peer (an inspection, as `shoal verify --peer`), and
/// takes the peer's word for the rows alive here that the peer does not hold
/// (``takeFreshState(table:keys:peerVector:)``):
/// - every write of the row is one the peer holds: the peer holds all of it and not the row, so it deleted the row,
///   by a delete that was stable since (it was collected). The row goes here too, as a collected delete;
/// - the row's life is one the peer holds, but this database wrote to it since it lost history (writes the peer lacks):
///   the row was collected all the same while it was away, and those writes are orphaned. The row goes, and each write
///   is put in the conflict log (`shoal conflicts`), so nothing goes silently;
/// - a row whose life began here since (an insert the peer has not seen) stays, and travels as usual.
/// Then its own writes are sent again. Rows the two both hold with other values are left to the merge rules.
extension Store {
    /// The `shoal_meta` key that marks a database awaiting its fresh state.
    static let freshStateKey = "fresh_state"
    /// The `shoal_meta` key of what this database held of other sites before it lost history (``freshStateFloor()``).
    static let freshStateFloorKey = "fresh_state_floor"

    /// The floor ``freshStateFloor()`` reads, from the record beside the file: what it held of every site but those
    /// this file wrote as (`own`, and every site the record says it sent or a peer showed held), as stored.
    static func freshStateFloorText(_ record: SentRecord, own: Set<SiteID>) -> String {
        let own = own.union(record.sent.keys).union(record.held.keys)
        return vectorText(VersionVector(record.holds.filter { !own.contains($0.key) }))
    }

    /// What this database held of the other sites before it lost history, as the record beside the file says (empty
    /// without one): a peer it takes its fresh state from must hold at least that, or it may be as stale as this
    /// database (another restored copy) and not know of the deletes collected meanwhile.
    public func freshStateFloor() throws(ShoalError) -> VersionVector {
        guard case .text(let text) = try connection.scalar(
            "SELECT value FROM shoal_meta WHERE key = ?", [.text(Self.freshStateFloorKey)]
        ) else { return VersionVector() }
        return Self.vector(fromText: text)
    }

    /// Whether any node ever collected a tombstone in a table this database knows of (a floor in ``collectedTable``).
    public func knowsOfCollection() throws(ShoalError) -> Bool {
        guard capture.tableNumbers[Self.collectedTable] != nil else { return false }
        return try connection.scalar("SELECT 1 FROM \(Self.collectedTable) WHERE cl > 0 LIMIT 1") != .null
    }

    /// Whether this database moved to a fresh site after losing history (restored from an older copy, or copied from
    /// another node's file) and has not taken its fresh state from a peer yet: its own writes are held back until then.
    public func awaitsFreshState() throws(ShoalError) -> Bool {
        let select = try statement("SELECT 1 FROM shoal_meta WHERE key = '\(Self.freshStateKey)'")
        defer { select.reset() }
        return try select.step()
    }

    /// Records that this database took its fresh state, covering `covers` (the vector of the peer it took it from):
    /// its own writes are sent again, and the suspensions naming it that `covers` covers are settled
    /// (``settleSuspensions()``).
    public func freshStateTaken(covering covers: VersionVector = VersionVector()) throws(ShoalError) {
        try connection.rows(
            "DELETE FROM shoal_meta WHERE key IN (?, ?)", [.text(Self.freshStateKey), .text(Self.freshStateFloorKey)]
        )
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.freshStateCoversKey), .text(Self.vectorText(covers))]
        )
        // What it held before it lost history no longer counts: what it holds now does.
        recordHolds(resetting: true)
    }

    /// Takes a peer's word, in one transaction, for the rows of `table` under the encoded `keys`
    /// (``SQLValue/encodeKey(_:)``) alive here that a peer holding `peerVector` does not hold (see the extension's
    /// comment). Does nothing unless this database awaits its fresh state.
    public func takeFreshState(
        table name: String,
        keys: [[UInt8]],
        peerVector: VersionVector
    ) throws(ShoalError) -> FreshStateReport {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "take a fresh state outside of any open transaction")
        }
        var report = FreshStateReport()
        guard try awaitsFreshState(), !keys.isEmpty else { return report }
        // Its own updates made while suspended may be claimed by a peer that left them out: none counts as held.
        let suspendedAfter = try ownSuspendedWritesAfter()
        try refreshSchema()
        guard let number = capture.tableNumbers[name] else { return report }
        guard openCursors.count == 0 else {
            // Removing rows an answer may be about to send would make it claim what it does not carry.
            report.deferred = true
            return report
        }
        let table = capture.tables[number]
        try refreshSites()
        try beginWriting()
        capture.isSuspended = true
        let triggersWereOn = suspendAppTriggers()
        defer {
            capture.isSuspended = false
            setTriggers(enabled: triggersWereOn)
        }
        do throws(ShoalError) {
            let delete = try statement(table.deleteRowSQL)
            let dropHeld = try statement("DELETE FROM shoal_held WHERE tbl = ? AND pk = ?")
            let floor = try causalLengthFloor(table.name)
            var pending: [UInt8] = []
            var orphans: [ConflictRecord] = []
            for encoded in keys {
                var reader = ByteReader(encoded)
                var key: [SQLValue] = []
                while !reader.isAtEnd { key.append(try SQLValue.decode(from: &reader)) }
                guard key.count == table.keyColumns.count, let state = try loadState(table: table, key: key),
                    state.isAlive, try dataRowExists(table: table, key: key)
                else { continue }
                var unseen = state.dots.filter { !peerVector.covers($0) }
                if let suspendedAfter { unseen.formUnion(ownUpdatesWhileSuspended(in: state, after: suspendedAfter)) }
                if !unseen.isEmpty {
                    // A life the peer holds: its first (no stamp) when the peer holds a write of it, or one a write
                    // made here overwrote.
                    let lifeIsHeld =
                        state.lengthStamp.map { peerVector.covers($0.dot) }
                        ?? (unseen.count < state.dots.count
                            || state.cells.contains { cell in
                                if case .value(_, let previous?) = cell { peerVector.covers(previous) } else { false }
                            })
                    guard lifeIsHeld else {
                        // A life begun here, below a tombstone a peer may still hold or have collected for the key.
                        if state.causalLength <= floor {
                            try liftAbove(floor, table: number, key: key)
                            report.lifted += 1
                        }
                        continue
                    }
                    let values = try dataValues(table: table, key: key)
                    for (index, cell) in state.cells.enumerated() {
                        let written: Stamp? =
                            switch cell {
                            case .empty: nil
                            case .value(let stamp, _): stamp
                            case .counter(let entries):
                                entries.first { unseen.contains(Dot(site: $0.key, seq: $0.value.seq)) }.map {
                                    Stamp(hlc: $0.value.hlc, site: $0.key, seq: $0.value.seq)
                                }
                            }
                        guard let written, unseen.contains(written.dot) else { continue }
                        orphans.append(
                            ConflictRecord(
                                table: table.name, primaryKey: key, column: table.columns[index],
                                localValue: values[index], localStamp: written, remoteValue: .null,
                                remoteStamp: Stamp(hlc: .zero, site: written.site, seq: 0), winner: .remote
                            )
                        )
                    }
                    report.orphaned += 1
                } else {
                    report.removed += 1
                }
                try delete.bind(key)
                try delete.run()
                try deleteState(table: table, key: key)
                try dropHeld.bind([.text(table.name), .blob(encoded)])
                try dropHeld.run()
                // The fold takes the row's hash out of the digest (it finds no metadata to add back).
                appendLogKey(key, to: &pending)
            }
            if report.lifted > 0 {
                capture.isSuspended = false
                try flushCaptured()
                transactionStamp = nil
            }
            if !pending.isEmpty {
                let note = try statement("INSERT INTO shoal_digest_pending(tbl, keys) VALUES (?, ?)")
                try note.bind([.integer(table.id), .blob(pending)])
                try note.run()
            }
            try record(orphans)
            try connection.exec("COMMIT")
        } catch {
            abandonWrite()
            throw error
        }
        if report.removed > 0 {
            options.logger.notice(
                """
                removed rows a peer deleted while this database was away (restored from an older copy, or \
                copied): the peer holds every write of them and no longer the rows
                """,
                metadata: ["table": "\(table.name.printable())", "rows": "\(report.removed)"]
            )
        }
        if report.lifted > 0 {
            options.logger.notice(
                """
                rows this database began after it lost history were written again above the tombstones peers \
                collected in their table, so that every node keeps them
                """,
                metadata: ["table": "\(table.name.printable())", "rows": "\(report.lifted)"]
            )
        }
        if report.orphaned > 0 {
            options.logger.warning(
                """
                rows this database wrote to after it lost history (restored from an older copy, or copied) were \
                deleted by peers meanwhile: removed, and the writes put in the conflict log (shoal conflicts)
                """,
                metadata: ["table": "\(table.name.printable())", "rows": "\(report.orphaned)"]
            )
        }
        return report
    }

    /// Ends the life begun here of the row under `key` at `floor` (even) and writes it again as a new life, from the
    /// data row as it is (counters from their current values), inside the caller's write transaction: flushed with
    /// the transaction's other captured writes, under one new dot.
    func liftAbove(_ floor: UInt64, table number: Int, key: [SQLValue]) throws(ShoalError) {
        let table = capture.tables[number]
        var ended = RowState(columnCount: table.columns.count)
        ended.causalLength = floor
        try saveState(ended, table: table, key: key)
        var delta = table.noDelta
        if table.hasCounters {
            let values = try dataValues(table: table, key: key)
            for index in table.columns.indices where table.isCounter[index] {
                delta[index] = values[index].integerValue ?? 0
            }
        }
        capture.addExistingRow(table: number, key: key, counterDelta: delta)
    }
}
