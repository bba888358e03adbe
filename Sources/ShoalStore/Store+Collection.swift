import ShoalCore

/// What one pass of ``Store/collectTombstones(upTo:maxRows:)`` did.
public struct CollectionReport: Sendable, Hashable, CustomStringConvertible {
    /// Rows of the change log looked at.
    public var examined = 0
    /// Tombstones removed (with the whole metadata of their rows).
    public var collected = 0
    /// Whether the pass covered everything the cut allows (otherwise call again).
    public var reachedCut = true
    /// Whether the pass was put off because an answer to a peer was being read.
    public var deferred = false

    /// A report of a pass that did nothing yet.
    public init() {}

    /// One line for the log.
    public var description: String {
        "examined \(examined) logged rows: collected \(collected) tombstones"
            + (reachedCut ? "" : " (more to come)") + (deferred ? " (put off: an answer is being read)" : "")
    }
}

/// Tombstones collected exactly when every member holds the delete.
///
/// A deleted row keeps its metadata (its causal length and the delete's stamp) so the delete reaches every node and
/// beats every write made concurrently with it. Once every current member holds the delete, and this node holds
/// every write those members made before they saw it (``MemberReports/stableCut(members:own:held:)`` computes how far
/// that is true, per site), nothing that could need the tombstone can still arrive: a replayed delete or a late
/// concurrent write is a transaction this node already holds, which apply skips. The row's metadata is removed then.
///
/// One thing still needs it: a row inserted again later, anywhere. Its new life must beat the tombstone on nodes that
/// have not collected it yet, though the node inserting it may know nothing of the row (it collected it, or caught up
/// from a node that had). So each node records, per table, the highest causal length it collected, in the replicated
/// table ``collectedTable`` (one row per table and site, only ever raised); a row new to a node starts its life above
/// the highest of them. The floor travels like any change (LAN, relay, streams), ahead of nothing it must precede:
/// a node that catches up from a collector gets the collector's floor in the same answer that leaves the rows out.
extension Store {
    /// The replicated table of causal-length floors: `(tbl, site)` → the highest causal length `site` collected in
    /// table `tbl`.
    public static let collectedTable = "shoal_collected"

    /// Creates and replicates ``collectedTable`` inside the caller's write transaction, if it is missing.
    func prepareCollectedTableInTransaction() throws(ShoalError) {
        try prepareInternalTableInTransaction(
            Self.collectedTable, columns: "tbl TEXT NOT NULL, site BLOB NOT NULL, cl INTEGER NOT NULL DEFAULT 0, "
                + "PRIMARY KEY(tbl, site)"
        )
    }

    /// The causal length a row new to this node starts from in `table` (even: its first life is one more): the
    /// highest any node collected there.
    func causalLengthFloor(_ table: String) throws(ShoalError) -> UInt64 {
        guard capture.tableNumbers[Self.collectedTable] != nil else { return 0 }
        let select = try statement(
            "SELECT max(cl) FROM \(Self.collectedTable) WHERE tbl = ? AND typeof(cl) = 'integer'"
        )
        try select.bind([.text(table)])
        defer { select.reset() }
        guard try select.step(), case .integer(let floor) = select.column(0), floor > 0 else { return 0 }
        // Even, so the row's first life here is odd (alive).
        return UInt64(floor) &+ UInt64(floor) % 2
    }

    /// How far tombstones were collected, per site (its index): every tombstone of a transaction up to there is gone.
    private func collectedUpTo() throws(ShoalError) -> [Int64: Int64] {
        var result: [Int64: Int64] = [:]
        for row in try connection.rows("SELECT key, value FROM shoal_meta WHERE key LIKE 'collected\\_%' ESCAPE '\\'") {
            guard case .text(let key) = row[0], case .integer(let seq) = row[1],
                let index = Int64(key.dropFirst("collected_".count))
            else { continue }
            result[index] = seq
        }
        return result
    }

    /// Removes the tombstones of transactions up to `cut` (per site), looking at up to `maxRows` logged rows, in one
    /// short write transaction; the next call goes on where this one stopped. The tables' floors
    /// (``collectedTable``) rise in the same transaction, as a change of this node.
    ///
    /// `cut` must be stable: every member holds those transactions, and this node holds every write any member made
    /// before it saw them (see ``MemberReports/stableCut(members:own:held:)``). Not while an answer to a peer is being
    /// read.
    @discardableResult
    public func collectTombstones(upTo cut: VersionVector, maxRows: Int = 10_000) throws(ShoalError)
        -> CollectionReport
    {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "collect tombstones outside of any open transaction")
        }
        var report = CollectionReport()
        guard openCursors.count == 0 else {
            report.deferred = true
            report.reachedCut = false
            return report
        }
        try refreshSchema()
        try refreshSites()
        let done = try collectedUpTo()
        // Only what the cut moved past since the last pass: nothing to do costs no write transaction.
        let due = cut.entries.compactMap { site, seq -> (index: Int64, seq: Int64)? in
            guard let index = sites.existingIndex(of: site) else { return nil }
            let upTo = Int64(clamping: seq)
            return upTo > (done[Int64(index)] ?? 0) ? (Int64(index), upTo) : nil
        }.sorted { $0.index < $1.index }
        guard !due.isEmpty else { return report }
        let tablesByID = Dictionary(uniqueKeysWithValues: capture.tables.map { ($0.id, $0) })
        try beginWriting()
        do throws(ShoalError) {
            try stampForeignWrites()
            // At most one more entry than the budget can look at (each lists a row at least).
            let select = try statement(
                "SELECT seq, tbl, part, keys FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ? "
                    + "ORDER BY seq, tbl, part LIMIT ?"
            )
            let dropHeld = try statement("DELETE FROM shoal_held WHERE tbl = ? AND pk = ? AND cl <= ?")
            // Per table, the collected rows' keys (as the change log lists them), for the digest's fold.
            var pending: [Int64: [UInt8]] = [:]
            var floors: [String: UInt64] = [:]
            var reached: [Int64: Int64] = [:]
            sites: for (index, upTo) in due {
                let site = try sites.site(at: UInt64(index))
                let from = done[index] ?? 0
                try select.bind([.integer(index), .integer(from), .integer(upTo), .integer(Int64(maxRows) + 1)])
                var entries: [(seq: Int64, table: Int64, part: Int64, keys: [UInt8])] = []
                while try select.step() {
                    entries.append(
                        (select.columnInt64(0), select.columnInt64(1), select.columnInt64(2), select.columnBytes(3))
                    )
                }
                select.reset()
                let complete = entries.count <= maxRows
                // Where the last pass stopped inside this range (in memory: after a restart, the range is looked at
                // again from its mark, which only costs time).
                let resume = collectionResume.flatMap { $0.site == index && $0.seq > from ? $0 : nil }
                for entry in entries {
                    var offset = 0
                    if let resume {
                        let here = (entry.seq, entry.table, entry.part)
                        let there = (resume.seq, resume.table, resume.part)
                        if here < there { continue }
                        if here == there { offset = min(resume.offset, entry.keys.count) }
                    }
                    guard let table = tablesByID[entry.table] else { continue }
                    let dot = Dot(site: site, seq: UInt64(entry.seq))
                    var reader = ByteReader(Array(entry.keys[offset...]))
                    while !reader.isAtEnd {
                        if report.examined >= maxRows {
                            // The budget ran out inside this transaction: the mark stays before it.
                            collectionResume = (index, entry.seq, entry.table, entry.part, offset + reader.offset)
                            reached[index] = entry.seq - 1
                            report.reachedCut = false
                            break sites
                        }
                        let key = try Self.readLogKey(&reader, table: table)
                        report.examined += 1
                        guard let state = try loadState(table: table, key: key), !state.isAlive,
                            state.lengthStamp?.dot == dot, try !dataRowExists(table: table, key: key)
                        else { continue }
                        // Its hash in the digest is left alone: a tombstone has none once folded, and a row
                        // deleted since the last fold still has its live hash there, which the fold takes out (it
                        // finds no metadata now: no hash to add back). The fold is told of the row here: compaction
                        // may drop the delete's log entry (it holds nothing now) before the fold reads it.
                        appendLogKey(key, to: &pending[table.id, default: []])
                        try deleteState(table: table, key: key)
                        // Values held for a column this node lacks yet, which the delete beat: they go with it, or a
                        // replay once the column is added would bring the row back.
                        try dropHeld.bind([
                            .text(table.name), .blob(SQLValue.encodeKey(key)),
                            .integer(Int64(clamping: state.causalLength)),
                        ])
                        try dropHeld.run()
                        floors[table.name] = max(floors[table.name] ?? 0, state.causalLength)
                        report.collected += 1
                    }
                }
                collectionResume = nil
                if complete {
                    reached[index] = upTo
                } else {
                    // More entries than were read: the last one's transaction may go on past them.
                    reached[index] = (entries.last?.seq ?? from + 1) - 1
                    report.reachedCut = false
                    break sites
                }
            }
            let notePending = try statement("INSERT INTO shoal_digest_pending(tbl, keys) VALUES (?, ?)")
            for (table, keys) in pending {
                try notePending.bind([.integer(table), .blob(keys)])
                try notePending.run()
            }
            for (index, seq) in reached {
                try connection.rows(
                    "INSERT INTO shoal_meta(key, value) VALUES (?, ?) "
                        + "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
                    [.text("collected_\(index)"), .integer(seq)]
                )
            }
            try raiseFloors(floors)
            try flushCaptured()
            try connection.exec("COMMIT")
            transactionStamp = nil
            return report
        } catch {
            abandonWrite()
            throw error
        }
    }

    /// Moves the collection marks of the sites of `changes` back before them: held changes merged now log
    /// transactions a pass may have gone past while they were held (inside the caller's write transaction).
    func reopenCollection(for changes: [Change]) throws(ShoalError) {
        var earliest: [SiteID: UInt64] = [:]
        for change in changes {
            earliest[change.stamp.site] = min(earliest[change.stamp.site] ?? .max, change.stamp.seq)
        }
        for (site, seq) in earliest {
            guard let index = sites.existingIndex(of: site) else { continue }
            try connection.rows(
                "UPDATE shoal_meta SET value = min(value, ?) WHERE key = ?",
                [.integer(Int64(clamping: seq) - 1), .text("collected_\(index)")]
            )
        }
    }

    /// Looks at the whole change log again at the next pass: tombstones of any transaction may be back (a table
    /// replicated again with the metadata it kept aside).
    func reopenCollection() throws(ShoalError) {
        try connection.rows("DELETE FROM shoal_meta WHERE key LIKE 'collected\\_%' ESCAPE '\\'")
        collectionResume = nil
    }

    /// Raises this node's floors (``collectedTable``) to `floors` where they are lower (inside the caller's write
    /// transaction: a change of this node).
    private func raiseFloors(_ floors: [String: UInt64]) throws(ShoalError) {
        guard !floors.isEmpty else { return }
        try prepareCollectedTableInTransaction()
        for (table, floor) in floors.sorted(by: { $0.key < $1.key }) {
            let current = try connection.scalar(
                "SELECT cl FROM \(Self.collectedTable) WHERE tbl = ? AND site = ?", [.text(table), .blob(siteID.bytes)]
            ).integerValue ?? 0
            guard Int64(clamping: floor) > current else { continue }
            try connection.rows(
                "INSERT OR REPLACE INTO \(Self.collectedTable)(tbl, site, cl) VALUES (?, ?, ?)",
                [.text(table), .blob(siteID.bytes), .integer(Int64(clamping: floor))]
            )
            // A write of this node like any other: captured, and stamped at the flush.
            capture.statementSucceeded()
        }
    }

    /// Gives free pages back to the file system, `maxPages` at most in one short write transaction, when the file
    /// vacuums incrementally (files Shoal creates do; see ``vacuum()``); returns how many. Collected tombstones and a
    /// compacted log free pages that SQLite reuses for new rows anyway: this also shrinks the file.
    @discardableResult
    public func reclaimFreePages(maxPages: Int = 4_096) throws(ShoalError) -> Int {
        guard connection.isAutocommit, !capture.hasUncommittedWork else { return 0 }
        guard try connection.scalar("PRAGMA auto_vacuum").integerValue == 2 else { return 0 }
        let free = Int(try connection.scalar("PRAGMA freelist_count").integerValue ?? 0)
        guard free > 0 else { return 0 }
        let pages = min(free, maxPages)
        try connection.exec("PRAGMA incremental_vacuum(\(pages))")
        return pages
    }

    /// Rewrites the whole file, and makes it vacuum incrementally from now on (a file an app created before Shoal
    /// does not): its free pages go back to the file system. It needs as much free disk as the file's size, and
    /// holds the write lock while it runs (other connections wait, a running node included).
    public func vacuum() throws(ShoalError) {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "vacuum outside of any open transaction")
        }
        try connection.exec("PRAGMA auto_vacuum = INCREMENTAL")
        try connection.exec("VACUUM")
    }

    /// Removes a row's metadata.
    func deleteState(table: ReplicatedTable, key: [SQLValue]) throws(ShoalError) {
        let delete = try statement("DELETE FROM \(table.clockTable) WHERE \(table.clockKeyPredicate)")
        try delete.bind(key)
        try delete.run()
        openCursors.touch(table: table.id, key: key)
    }
}
