import ShoalCore

/// What one pass of ``Store/compactLog(maxEntries:)`` did.
public struct CompactionReport: Sendable, Hashable, CustomStringConvertible {
    /// Change-log entries (one per transaction and table) looked at.
    public var examined = 0
    /// Entries removed: every row they list has been overwritten since.
    public var removed = 0
    /// Row keys dropped from entries that still list others.
    public var keysDropped = 0
    /// Whether the pass reached the end of the log (the next one starts again from its beginning).
    public var reachedEnd = false
    /// Whether the pass was put off because an answer to a peer was being read (``Store/deltaCursor(since:)``):
    /// dropping an entry it has yet to reach could make it claim a transaction without sending what overwrote it.
    public var deferred = false

    /// A report of a pass that did nothing yet.
    public init() {}

    /// One line for the log.
    public var description: String {
        "examined \(examined) log entries: removed \(removed), dropped \(keysDropped) overwritten rows from others"
    }
}

extension Store {
    /// Drops from the change log what no peer can ever be sent again: the rows a transaction touched whose
    /// every effect has been overwritten since (by a later write, a delete, or a later counter total).
    ///
    /// A delta sends, for each logged row, only the columns whose current clock belongs to that transaction
    /// (see ``RowState/holds(_:)``); an entry with no such row sends nothing, so removing it changes no answer.
    /// The newest entry of each site stays: this node's next sequence number and clock come from its own.
    /// Each call looks at up to `maxEntries` entries in one short write transaction, continuing where the
    /// previous call stopped, so a node can compact a large log a slice at a time without holding up writers.
    @discardableResult
    public func compactLog(maxEntries: Int = 5_000) throws(ShoalError) -> CompactionReport {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "compact the change log outside of any open transaction")
        }
        guard openCursors.count == 0 else {
            var report = CompactionReport()
            report.reachedEnd = true
            report.deferred = true
            return report
        }
        try refreshSchema()
        let tablesByID = Dictionary(uniqueKeysWithValues: capture.tables.map { ($0.id, $0) })
        try beginWriting()
        do throws(ShoalError) {
            // Inside the transaction: another process may have added sites that the log entries name.
            try refreshSites()
            try stampForeignWrites()
            var report = CompactionReport()
            // Resumed inside an entry a slice left half examined (`compactionResume`), or after the last one examined.
            let resume = compactionResume
            let start =
                resume.map { (site: $0.site, seq: $0.seq, table: $0.table, part: $0.part) } ?? compactionPosition
                ?? (site: Int64.min, seq: Int64.min, table: Int64.min, part: Int64.min)
            let select = try statement(
                "SELECT site, seq, tbl, part, keys FROM shoal_log WHERE (site, seq, tbl, part) "
                    + "\(resume == nil ? ">" : ">=") (?, ?, ?, ?) ORDER BY site, seq, tbl, part LIMIT ?"
            )
            try select.bind([
                .integer(start.site), .integer(start.seq), .integer(start.table), .integer(start.part),
                .integer(Int64(maxEntries)),
            ])
            var entries: [(site: Int64, seq: Int64, table: Int64, part: Int64, keys: [UInt8])] = []
            while try select.step() {
                entries.append(
                    (
                        select.columnInt64(0), select.columnInt64(1), select.columnInt64(2), select.columnInt64(3),
                        select.columnBytes(4)
                    )
                )
            }
            select.reset()
            let newest = try statement("SELECT max(seq) FROM shoal_log WHERE site = ?")
            let remove = try statement("DELETE FROM shoal_log WHERE site = ? AND seq = ? AND tbl = ? AND part = ?")
            let rewrite = try statement(
                "UPDATE shoal_log SET keys = ? WHERE site = ? AND seq = ? AND tbl = ? AND part = ?"
            )
            var newestBySite: [Int64: Int64] = [:]
            // Rows looked at in this slice: a transaction of a million rows is one entry, examined over many slices.
            var rowsLooked = 0
            var stoppedInside: (site: Int64, seq: Int64, table: Int64, part: Int64, offset: Int)?
            entries: for entry in entries {
                report.examined += 1
                guard let table = tablesByID[entry.table] else { continue }
                if newestBySite[entry.site] == nil {
                    try newest.bind([.integer(entry.site)])
                    if try newest.step() { newestBySite[entry.site] = newest.columnInt64(0) }
                    newest.reset()
                }
                if newestBySite[entry.site] == entry.seq { continue }
                let dot = Dot(site: try sites.site(at: UInt64(entry.site)), seq: UInt64(bitPattern: entry.seq))
                let resumeAt =
                    resume.flatMap { resume in
                        (resume.site, resume.seq, resume.table, resume.part)
                            == (entry.site, entry.seq, entry.table, entry.part)
                            ? min(resume.offset, entry.keys.count) : nil
                    } ?? 0
                var kept = Array(entry.keys[0..<resumeAt])
                var dropped = 0
                var reader = ByteReader(Array(entry.keys[resumeAt...]))
                while !reader.isAtEnd, rowsLooked < Self.compactionRowsPerSlice {
                    let start = reader.offset
                    let key = try Self.readLogKey(&reader, table: table)
                    rowsLooked += 1
                    if try loadState(table: table, key: key)?.holds(dot) == true {
                        kept.append(contentsOf: entry.keys[(resumeAt + start)..<(resumeAt + reader.offset)])
                    } else {
                        dropped += 1
                    }
                }
                if !reader.isAtEnd {
                    // The slice's budget ran out inside this entry: the rest of its rows stay, looked at next time.
                    stoppedInside = (entry.site, entry.seq, entry.table, entry.part, kept.count)
                    kept.append(contentsOf: entry.keys[(resumeAt + reader.offset)...])
                }
                let identity: [SQLValue] = [
                    .integer(entry.site), .integer(entry.seq), .integer(entry.table), .integer(entry.part),
                ]
                if kept.isEmpty {
                    try remove.bind(identity)
                    try remove.run()
                    report.removed += 1
                } else if dropped > 0 {
                    try rewrite.bind([.blob(kept)] + identity)
                    try rewrite.run()
                    report.keysDropped += dropped
                }
                if stoppedInside != nil { break entries }
            }
            try connection.exec("COMMIT")
            compactionResume = stoppedInside
            if let stoppedInside {
                report.reachedEnd = false
                compactionPosition = (stoppedInside.site, stoppedInside.seq, stoppedInside.table, stoppedInside.part)
            } else {
                report.reachedEnd = entries.count < maxEntries
                compactionPosition =
                    report.reachedEnd ? nil : entries.last.map { ($0.site, $0.seq, $0.table, $0.part) }
            }
            return report
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }
}
