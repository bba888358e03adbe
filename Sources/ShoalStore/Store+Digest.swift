import ShoalCore

#if canImport(Glibc)
import Glibc
#endif

/// Row counts of one replicated table.
public struct TableStatus: Sendable, Hashable {
    /// The table's name.
    public var name: String
    /// Rows alive.
    public var rows: Int
    /// Deleted rows whose tombstones are kept.
    public var tombstones: Int
    /// The columns that merge as counters (``Store/replicate(table:counters:)``), in table order.
    public var counterColumns: [String]
    /// The bytes of the table's row metadata (its clock table's pages, from SQLite's `dbstat`; nil where SQLite was
    /// built without it). The change log, shared by every table, is not counted.
    public var metadataBytes: Int64?
}

/// A summary of a store.
public struct StoreStatus: Sendable, Hashable {
    /// The store's site id: who stamps its local changes.
    public var siteID: SiteID
    /// The name stored in the database, if any (``StoreOptions/nodeName``).
    public var nodeName: String?
    /// Every change the store holds, by site.
    public var versionVector: VersionVector
    /// Row counts of each replicated table.
    public var tables: [TableStatus]
    /// Replicated tables another tool changed or dropped, with what changed and what to do.
    public var pausedTables: [PausedTable]
    /// How many entries the conflict log holds (``StoreOptions/conflictLogLimit`` at most).
    public var conflicts: Int
    /// The digest of every replicated row with its clocks (``Store/digest()``): equal on stores in the same state.
    public var digest: StateDigest
    /// Set when the database moved to a fresh site (its file was restored from an older copy, or copied): what
    /// happened, in plain words.
    public var identityChange: IdentityChange?
    /// Whether the database lost history and awaits its fresh state from a peer: its own writes wait until then (see
    /// ``Store/awaitsFreshState()``).
    public var awaitsFreshState = false
    /// How many schema changes this node holds (see ``Store/schemaTable``): its schema position.
    public var schemaChanges = 0
    /// Schema changes recorded but not made here yet (`table.column`, or a table's name): a peer's change this node
    /// follows by hand, or one SQLite refused.
    public var schemaPending: [String] = []
    /// Columns added with different definitions, where this node's lost (see ``SchemaConflict``).
    public var schemaConflicts: [SchemaConflict] = []
    /// Changes held for tables and columns this node does not have (yet), per table (see ``Store/heldChanges()``).
    public var heldChanges: [String: Int] = [:]
    /// Whether ``digest`` holds every row as it is now; `false` when it was read as last folded (see
    /// ``Store/status(settlingDigest:)``) and rows changed since.
    public var digestIsCurrent = true
}

// The digest is kept incrementally, per table: `shoal_digest` holds each table's sum and row count,
// `shoal_row_hashes` each row's hash as it was last added. Every change-log entry (written by local writes, by
// foreign writes once stamped, and by applies, in their own transaction) also lands in `shoal_digest_pending`;
// reading the digest folds in only those rows (take out the old hash, add the new), so its cost follows the rows
// changed since the last read, never the table size. A table without a stored sum (just replicated, or a
// database from before) is scanned once.
extension Store {
    /// The order-independent digest of every replicated row with its clocks and values (tombstones left out: see
    /// ``StateDigest/counts(_:hasData:)``), as maintained incrementally. Paused tables are left out.
    public func digest() throws(ShoalError) -> StateDigest {
        try refreshSchema()
        try captureForeignWritesIfIdle()
        try refreshSites()
        var stored = try storedTableDigests()
        if try digestNeedsSettling(stored) {
            if connection.isAutocommit {
                // A slice at a time, each in a short write transaction of its own: after a catch-up of a million rows
                // a whole fold took the write lock for seconds, and the app's writes (and the node's) waited.
                while try !settleDigest(maxRows: Self.digestFoldSliceRows) {}
                stored = try storedTableDigests()
            } else {
                try inWriteTransaction { () throws(ShoalError) in stored = try settleDigest(budget: nil).stored }
            }
        }
        var digest = StateDigest()
        for table in capture.tables { if let part = stored[table.id] { digest.add(part) } }
        return digest
    }

    /// How many changed rows ``digest()`` folds in one write transaction (the node's own slices: see
    /// ``SerializedStore``).
    static let digestFoldSliceRows = 2_000

    /// Folds what changed into the digest a slice at a time, pausing after each slice about as long as it held the
    /// write lock, so that other writers of the file get it in between: SQLite's busy handler retries at intervals of
    /// up to 100 ms, and a loop that took the lock again at once kept an app out past its busy timeout (`shoal digest`
    /// beside a node that had just caught up 200,000 rows). For a process of its own, the command line; a running
    /// node folds in its own slices, between its other work.
    public func settleDigestBesideOtherWriters() throws(ShoalError) {
        while true {
            let started = ContinuousClock.now
            if try settleDigest(maxRows: Self.digestFoldSliceRows) { return }
            let held = (ContinuousClock.now - started).components
            let microseconds = held.seconds * 1_000_000 + held.attoseconds / 1_000_000_000_000
            usleep(UInt32(clamping: max(5_000, min(microseconds, 200_000))))
        }
    }

    /// The digest as last folded, without folding in what changed since (read-only).
    func digestAsFolded() throws(ShoalError) -> StateDigest {
        try refreshSchema()
        let stored = try storedTableDigests()
        var digest = StateDigest()
        for table in capture.tables { if let part = stored[table.id] { digest.add(part) } }
        return digest
    }

    /// Folds at most about `maxRows` changed rows into the maintained digest, in a transaction of its own;
    /// returns whether nothing is left to fold (then ``digest()`` answers without folding anything).
    ///
    /// A node calls this a slice at a time, so that a catch-up of millions of rows never holds the store for
    /// the seconds a whole fold takes. (A table not yet summed is scanned whole, once.)
    public func settleDigest(maxRows: Int) throws(ShoalError) -> Bool {
        try refreshSchema()
        try captureForeignWritesIfIdle()
        try refreshSites()
        guard try digestNeedsSettling(try storedTableDigests()) else { return true }
        var settled = false
        try inWriteTransaction { () throws(ShoalError) in settled = try settleDigest(budget: maxRows).settled }
        return settled
    }

    /// Runs `body` in the open transaction, or in an immediate one of its own.
    private func inWriteTransaction(_ body: () throws(ShoalError) -> Void) throws(ShoalError) {
        guard connection.isAutocommit else { return try body() }
        try beginWriting()
        do throws(ShoalError) {
            // Another process may have added sites since they were last read, and the rows to settle may name them.
            try refreshSites()
            try body()
            try connection.exec("COMMIT")
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// The digest recomputed from a scan of every replicated row, to check the maintained one (``digest()``).
    public func fullScanDigest() throws(ShoalError) -> StateDigest {
        try refreshSchema()
        try refreshSites()
        var digest = StateDigest()
        for table in capture.tables {
            try scanRows(of: table) { hash, _ throws(ShoalError) in if let hash { digest.add(rowHash: hash) } }
            // Data rows Shoal holds no metadata for count too: a file with such a row never matches one without.
            try scanRowsWithoutMetadata(of: table) { key, values throws(ShoalError) in
                digest.add(
                    rowHash: StateDigest.rowHash(
                        table: table.name,
                        primaryKey: key,
                        state: nil,
                        columns: table.columns,
                        values: values,
                        order: table.hashOrder
                    )
                )
            }
        }
        return digest
    }

    /// Records that a change-log entry gained `keys` (rows of `table`): their hashes are refreshed at the next
    /// read.
    ///
    /// This node's own transactions need no record: their sequence numbers only grow, so the log entries above
    /// the last one folded in are the new ones, and the local write path writes nothing extra. Applied changes
    /// (a batch at a time, often adding to an entry already there) list the keys each batch added.
    func noteDigestPending(site: Int64, seq: Int64, table: Int64, keys: [UInt8]) throws(ShoalError) {
        if site == ownSiteIndex, let stamp = transactionStamp, Int64(bitPattern: stamp.seq) == seq { return }
        guard !keys.isEmpty else { return }
        let insert = try statement("INSERT INTO shoal_digest_pending(tbl, keys) VALUES (?, ?)")
        try insert.bind([.integer(table), .blob(keys)])
        try insert.run()
    }

    /// Drops every trace of a table from the digest (it is no longer replicated).
    func forgetDigest(ofTable table: Int64) throws(ShoalError) {
        try forgetDigestScan(ofTable: table)
        for name in ["shoal_digest", "shoal_row_hashes", "shoal_digest_pending"] {
            try connection.rows("DELETE FROM \(name) WHERE tbl = ?", [.integer(table)])
        }
    }

    func storedTableDigests() throws(ShoalError) -> [Int64: StateDigest] {
        var stored: [Int64: StateDigest] = [:]
        let select = try statement("SELECT tbl, sum, rows FROM shoal_digest")
        defer { select.reset() }
        while try select.step() {
            guard let digest = StateDigest(bytes: select.columnBytes(1), rowCount: UInt64(select.columnInt64(2)))
            else { throw ShoalError.corruptMetadata("bad shoal_digest row") }
            stored[select.columnInt64(0)] = digest
        }
        return stored
    }

    func digestNeedsSettling(_ stored: [Int64: StateDigest]) throws(ShoalError) -> Bool {
        if capture.tables.contains(where: { stored[$0.id] == nil }) { return true }
        let watermark =
            try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'digest_local_seq'")
            .integerValue ?? 0
        let ceiling = transactionStamp.map { Int64(bitPattern: $0.seq) } ?? Int64.max
        let local = try statement("SELECT 1 FROM shoal_log WHERE site = ? AND seq > ? AND seq < ? LIMIT 1")
        try local.bind([.integer(ownSiteIndex), .integer(watermark), .integer(ceiling)])
        let hasLocal = try local.step()
        local.reset()
        if hasLocal { return true }
        let active = Set(capture.tables.map(\.id))
        let select = try statement("SELECT DISTINCT tbl FROM shoal_digest_pending")
        defer { select.reset() }
        while try select.step() {
            if active.contains(select.columnInt64(0)) { return true }
        }
        return false
    }

    /// Folds the pending rows into the stored sums (in the open transaction): all of them, or with a `budget`,
    /// whole log entries until about that many rows were folded. Returns the sums, and whether nothing is left.
    func settleDigest(budget: Int?) throws(ShoalError) -> (stored: [Int64: StateDigest], settled: Bool) {
        var stored = try storedTableDigests()
        var changed = Set<Int64>()
        var folded = 0
        var exhausted: Bool { budget.map { folded >= $0 } ?? false }
        // A table without a stored sum is scanned once: whole, or with a budget a slice at a time (resumed from
        // the last key scanned). Entries of a table scanned whole in this call need no second look; those of a
        // table still being scanned wait in the pending list until its scan is done.
        // Per table whose scan has ended: this node's log entries up to this seq are in the scan, and need no
        // second look (kept in `shoal_meta` until the watermark passes them, since a slice may end first).
        var covered: [Int64: Int64] = [:]
        for row in try connection.rows("SELECT key, value FROM shoal_meta WHERE key LIKE 'digest_covered_%'") {
            guard case .text(let key) = row[0], let id = Int64(key.dropFirst("digest_covered_".count)),
                let seq = row[1].integerValue
            else { continue }
            covered[id] = seq
        }
        var building = Set<Int64>()
        for table in capture.tables where stored[table.id] == nil {
            if let budget {
                // Scanning a row costs a fraction of refolding one (three lookups and a write): larger slices.
                let slice = max(0, budget - folded) * 10
                let (digest, scanned, coveredSeq) = try buildDigestSlice(of: table, maxRows: slice)
                folded += scanned / 10
                if let digest {
                    stored[table.id] = digest
                    changed.insert(table.id)
                    covered[table.id] = coveredSeq
                    try connection.rows(
                        "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
                        [.text("digest_covered_\(table.id)"), .integer(coveredSeq)]
                    )
                } else {
                    building.insert(table.id)
                }
            } else {
                stored[table.id] = try buildDigest(of: table)
                changed.insert(table.id)
                covered[table.id] = .max
            }
        }
        let tablesByID = Dictionary(
            uniqueKeysWithValues: capture.tables.filter { !building.contains($0.id) }.map { ($0.id, $0) }
        )
        var seen: [Int64: Set<[SQLValue]>] = [:]
        var seenCount = 0
        func rehash(_ keys: [UInt8], of table: ReplicatedTable) throws(ShoalError) {
            var digest = stored[table.id] ?? StateDigest()
            var reader = ByteReader(keys)
            while !reader.isAtEnd {
                let key = try Self.readLogKey(&reader, table: table)
                if seenCount >= 100_000 {
                    seen.removeAll()
                    seenCount = 0
                }
                guard seen[table.id, default: []].insert(key).inserted else { continue }
                seenCount += 1
                folded += 1
                try rehashRow(table: table, key: key, digest: &digest)
            }
            stored[table.id] = digest
            changed.insert(table.id)
        }
        // This node's own entries above the watermark (an open transaction's own entry may still grow: not yet).
        let watermark =
            try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'digest_local_seq'")
            .integerValue ?? 0
        let ceiling = transactionStamp.map { Int64(bitPattern: $0.seq) } ?? Int64.max
        let local = try statement("SELECT seq, tbl, keys FROM shoal_log WHERE site = ? AND seq > ? AND seq < ?")
        try local.bind([.integer(ownSiteIndex), .integer(watermark), .integer(ceiling)])
        var highest = watermark
        var parked: [(seq: Int64, table: Int64, keys: [UInt8])] = []
        while try local.step() {
            if exhausted {
                // Entries of the same transaction (one per table) are folded together: stop before this one's.
                highest = max(watermark, min(highest, local.columnInt64(0) - 1))
                break
            }
            highest = max(highest, local.columnInt64(0))
            guard let table = tablesByID[local.columnInt64(1)] else {
                parked.append((local.columnInt64(0), local.columnInt64(1), local.columnBytes(2)))
                continue
            }
            if let seq = covered[table.id], local.columnInt64(0) <= seq { continue }
            try rehash(local.columnBytes(2), of: table)
        }
        local.reset()
        // An entry of a paused table waits in the pending list for the table to resume.
        for entry in parked {
            try noteDigestPending(site: ownSiteIndex, seq: entry.seq, table: entry.table, keys: entry.keys)
        }
        if highest != watermark {
            try connection.rows(
                "INSERT INTO shoal_meta(key, value) VALUES ('digest_local_seq', ?) "
                    + "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [.integer(highest)]
            )
        }
        for (id, seq) in covered where seq != .max && seq <= highest {
            try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text("digest_covered_\(id)")])
        }
        // Entries are read one at a time (a catch-up may leave millions of rows pending); a row named by several
        // is rehashed once while the set of rows seen stays small, and at worst again (rehashing is idempotent).
        let select = try statement("SELECT id, tbl, keys FROM shoal_digest_pending ORDER BY id")
        defer { select.reset() }
        var done: [Int64] = []
        var replicated: Set<Int64>?
        while !exhausted, try select.step() {
            let id = select.columnInt64(0)
            guard let table = tablesByID[select.columnInt64(1)] else {
                // A paused table keeps its pending rows for when it resumes, and so does a table still being
                // scanned; a table no longer replicated has none.
                if replicated == nil {
                    replicated = Set(
                        try connection.rows("SELECT id FROM shoal_tables").compactMap { $0[0].integerValue }
                    )
                }
                if replicated?.contains(select.columnInt64(1)) == false, !building.contains(select.columnInt64(1)) {
                    done.append(id)
                }
                continue
            }
            try rehash(select.columnBytes(2), of: table)
            done.append(id)
        }
        select.reset()
        let remove = try statement("DELETE FROM shoal_digest_pending WHERE id = ?")
        for id in done {
            try remove.bind([.integer(id)])
            try remove.run()
        }
        let save = try statement("INSERT OR REPLACE INTO shoal_digest(tbl, sum, rows) VALUES (?, ?, ?)")
        for id in changed {
            guard let digest = stored[id] else { continue }
            try save.bind([.integer(id), .blob(digest.bytes), .integer(Int64(bitPattern: digest.rowCount))])
            try save.run()
        }
        return (stored, !exhausted && building.isEmpty)
    }

    /// Takes a row's old hash out of `digest` and adds its current one.
    private func rehashRow(table: ReplicatedTable, key: [SQLValue], digest: inout StateDigest) throws(ShoalError) {
        let encodedKey = SQLValue.encodeKey(key)
        let old = try statement("SELECT hash FROM shoal_row_hashes WHERE tbl = ? AND key = ?")
        try old.bind([.integer(table.id), .blob(encodedKey)])
        let oldHash: [UInt8]? = try old.step() ? old.columnBytes(0) : nil
        old.reset()
        var newHash: [UInt8]?
        if let state = try loadState(table: table, key: key) {
            // The data row is read whatever the metadata says: a live row without one, or a deleted row with one,
            // hashes apart from the row the metadata describes.
            let select = try clockStatements(table).selectRow
            try select.bind(key)
            let values: [SQLValue]? = try select.step() ? Array(select.row().dropFirst()) : nil
            select.reset()
            if StateDigest.counts(state, hasData: values != nil) {
                newHash = StateDigest.rowHash(
                    table: table.name,
                    primaryKey: key,
                    state: state,
                    columns: table.columns,
                    values: values,
                    defaults: table.defaults,
                    order: table.hashOrder
                )
            }
        }
        guard oldHash != newHash else { return }
        if let oldHash { digest.subtract(rowHash: oldHash) }
        if let newHash {
            digest.add(rowHash: newHash)
            let upsert = try statement("INSERT OR REPLACE INTO shoal_row_hashes(tbl, key, hash) VALUES (?, ?, ?)")
            try upsert.bind([.integer(table.id), .blob(encodedKey), .blob(newHash)])
            try upsert.run()
        } else {
            let delete = try statement("DELETE FROM shoal_row_hashes WHERE tbl = ? AND key = ?")
            try delete.bind([.integer(table.id), .blob(encodedKey)])
            try delete.run()
        }
    }

    /// Scans up to `maxRows` more rows of a table that has no stored sum, after the last one a previous slice
    /// scanned: stores their hashes and adds them to the partial sum (kept in `shoal_meta`). Returns the table's
    /// digest once the scan is complete, the rows scanned, and the newest local sequence number the scan covers
    /// (the one when it started: later local writes may have changed rows it had passed).
    private func buildDigestSlice(
        of table: ReplicatedTable,
        maxRows: Int
    ) throws(ShoalError) -> (digest: StateDigest?, scanned: Int, coveredSeq: Int64) {
        let positionKey = "digest_build_\(table.id)"
        let sumKey = "digest_build_sum_\(table.id)"
        let countKey = "digest_build_rows_\(table.id)"
        let seqKey = "digest_build_seq_\(table.id)"
        func meta(_ key: String) throws(ShoalError) -> SQLValue {
            try connection.scalar("SELECT value FROM shoal_meta WHERE key = ?", [.text(key)])
        }
        var after: [SQLValue]?
        var digest = StateDigest()
        let coveredSeq: Int64
        if case .blob(let position) = try meta(positionKey) {
            coveredSeq = try meta(seqKey).integerValue ?? 0
            var reader = ByteReader(position)
            var key: [SQLValue] = []
            for _ in table.keyColumns { key.append(try SQLValue.decode(from: &reader)) }
            after = key
            guard case .blob(let sum) = try meta(sumKey), let count = try meta(countKey).integerValue,
                let partial = StateDigest(bytes: sum, rowCount: UInt64(bitPattern: count))
            else { throw ShoalError.corruptMetadata("bad partial digest of table \(table.name)") }
            digest = partial
        } else {
            // This node's transactions so far are all in what the scan reads; later ones may change rows it passed.
            coveredSeq =
                try connection.scalar("SELECT max(seq) FROM shoal_log WHERE site = ?", [.integer(ownSiteIndex)])
                .integerValue ?? 0
            try connection.rows("DELETE FROM shoal_row_hashes WHERE tbl = ?", [.integer(table.id)])
            try connection.rows("DELETE FROM shoal_digest_pending WHERE tbl = ?", [.integer(table.id)])
        }
        let insert = try statement("INSERT INTO shoal_row_hashes(tbl, key, hash) VALUES (?, ?, ?)")
        var scanned = 0
        var last: [SQLValue]?
        try scanRows(of: table, after: after, limit: max(1, maxRows)) { hash, key throws(ShoalError) in
            scanned += 1
            last = key
            guard let hash else { return }
            digest.add(rowHash: hash)
            try insert.bind([.integer(table.id), .blob(SQLValue.encodeKey(key)), .blob(hash)])
            try insert.run()
        }
        let save = try statement(
            "INSERT INTO shoal_meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        )
        if scanned < max(1, maxRows) {
            try forgetDigestScan(ofTable: table.id)
            return (digest, scanned, coveredSeq)
        }
        for (key, value) in [
            (positionKey, SQLValue.blob(SQLValue.encodeKey(last ?? []))), (sumKey, .blob(digest.bytes)),
            (countKey, .integer(Int64(bitPattern: digest.rowCount))), (seqKey, .integer(coveredSeq)),
        ] {
            try save.bind([.text(key), value])
            try save.run()
        }
        return (nil, scanned, coveredSeq)
    }

    /// Forgets a sliced scan in progress (done, restarted whole, or the table is no longer replicated).
    func forgetDigestScan(ofTable id: Int64) throws(ShoalError) {
        try connection.rows(
            "DELETE FROM shoal_meta WHERE key IN (?, ?, ?, ?)",
            [
                .text("digest_build_\(id)"), .text("digest_build_sum_\(id)"), .text("digest_build_rows_\(id)"),
                .text("digest_build_seq_\(id)"),
            ]
        )
        try connection.rows(
            "DELETE FROM shoal_meta WHERE key = ?", [.text("digest_covered_\(id)")]
        )
    }

    /// Scans a table once: stores every row's hash and returns the table's digest.
    private func buildDigest(of table: ReplicatedTable) throws(ShoalError) -> StateDigest {
        try forgetDigestScan(ofTable: table.id)
        try connection.rows("DELETE FROM shoal_row_hashes WHERE tbl = ?", [.integer(table.id)])
        try connection.rows("DELETE FROM shoal_digest_pending WHERE tbl = ?", [.integer(table.id)])
        let insert = try statement("INSERT INTO shoal_row_hashes(tbl, key, hash) VALUES (?, ?, ?)")
        var digest = StateDigest()
        try scanRows(of: table) { hash, key throws(ShoalError) in
            guard let hash else { return }
            digest.add(rowHash: hash)
            try insert.bind([.integer(table.id), .blob(SQLValue.encodeKey(key)), .blob(hash)])
            try insert.run()
        }
        return digest
    }

    /// Every row of `table` that has metadata, with its hash; or, with `limit`, that many at most in key order,
    /// after key `after`.
    private func scanRows(
        of table: ReplicatedTable,
        after: [SQLValue]? = nil,
        limit: Int? = nil,
        _ body: (_ hash: [UInt8]?, _ key: [SQLValue]) throws(ShoalError) -> Void
    ) throws(ShoalError) {
        try scanRowStates(of: table, after: after, limit: limit) { hash, key, _, _ throws(ShoalError) in
            try body(hash, key)
        }
    }

    /// ``scanRows(of:after:limit:_:)``, also giving each row's metadata and whether its data row is there.
    func scanRowStates(
        of table: ReplicatedTable,
        after: [SQLValue]? = nil,
        limit: Int? = nil,
        _ body: (_ hash: [UInt8]?, _ key: [SQLValue], _ state: RowState, _ hasData: Bool) throws(ShoalError) -> Void
    ) throws(ShoalError) {
        let keys = table.keyColumns.indices.map { "c.k\($0)" }
        let values = table.columns.map { "d.\(quote($0))" }
        let join = table.keyColumns.enumerated().map { "d.\(quote($0.element)) = c.k\($0.offset)" }
        // Whether the data row is there (a joined key column is never NULL).
        let present = "d.\(quote(table.keyColumns[0])) IS NOT NULL"
        var sql =
            "SELECT \((keys + ["c.meta", present] + values).joined(separator: ", ")) FROM \(table.clockTable) c "
            + "LEFT JOIN \(quote(table.name)) d ON \(join.joined(separator: " AND "))"
        if after != nil {
            let marks = Array(repeating: "?", count: keys.count).joined(separator: ", ")
            sql += " WHERE (\(keys.joined(separator: ", "))) > (\(marks))"
        }
        if let limit { sql += " ORDER BY \(keys.joined(separator: ", ")) LIMIT \(limit)" }
        let select = try connection.prepare(sql)
        if let after { try select.bind(after) }
        let keyCount = table.keyColumns.count
        while try select.step() {
            let row = select.row()
            guard case .blob(let meta) = row[keyCount] else {
                throw ShoalError.corruptMetadata("missing row metadata")
            }
            let state = try RowState(encoded: meta, columnCount: table.columns.count, sites: sites)
            let key = Array(row[0..<keyCount])
            let hasData = row[keyCount + 1] == .integer(1)
            let hash =
                StateDigest.counts(state, hasData: hasData)
                ? StateDigest.rowHash(
                    table: table.name,
                    primaryKey: key,
                    state: state,
                    columns: table.columns,
                    values: hasData ? Array(row[(keyCount + 2)...]) : nil,
                    defaults: table.defaults,
                    order: table.hashOrder
                ) : nil
            try body(hash, key, state, hasData)
        }
    }

    /// The rows `table`'s clock table holds (one per row alive or kept as a tombstone) and the bytes of its pages (nil
    /// where SQLite was built without `dbstat`). One walk of its b-tree gives both: the cells of its leaf pages are its
    /// rows (also those of its interior pages, in a table without rowid, whose b-tree is an index's). Counting, then
    /// asking `dbstat`, read a million rows' pages twice.
    private func clockTableSize(_ table: ReplicatedTable) throws(ShoalError) -> (rows: Int, bytes: Int64?) {
        let withoutRowid = try connection.scalar(
            "SELECT sql LIKE '%WITHOUT ROWID' FROM sqlite_master WHERE type = 'table' AND name = ?",
            [.text(table.clockTable)]
        ) == .integer(1)
        // dbstat walks only the b-tree named.
        if let row = try? connection.rows(
            "SELECT sum(pgsize), sum(CASE WHEN pagetype = 'leaf' OR ? THEN ncell ELSE 0 END) FROM dbstat "
                + "WHERE name = ?",
            [.integer(withoutRowid ? 1 : 0), .text(table.clockTable)]
        ).first, case .integer(let bytes) = row[0], case .integer(let rows) = row[1] {
            return (Int(rows), bytes)
        }
        let rows = Int(try connection.scalar("SELECT count(*) FROM \(table.clockTable)").integerValue ?? 0)
        return (rows, nil)
    }

    /// Site id, version vector, tables with row and tombstone counts, paused tables, conflicts and digest.
    ///
    /// `settlingDigest: false` leaves the digest as last folded when rows changed since (see
    /// ``StoreStatus/digestIsCurrent``): folding a catch-up's million rows takes the write lock for seconds, which a
    /// status read beside a running node must not do (the node folds them a slice at a time). Nor does it capture
    /// other connections' writes then (the node does, at once): such a read takes no write lock at all, so it never
    /// waits behind the node's transactions.
    public func status(settlingDigest: Bool = true) throws(ShoalError) -> StoreStatus {
        try refreshSchema()
        if settlingDigest { try captureForeignWritesIfIdle() }
        var tables: [TableStatus] = []
        for table in capture.tables {
            let rows = Int(try connection.scalar("SELECT count(*) FROM \(quote(table.name))").integerValue ?? 0)
            let (tracked, metadataBytes) = try clockTableSize(table)
            tables.append(
                TableStatus(
                    name: table.name,
                    rows: rows,
                    tombstones: max(0, tracked - rows),
                    counterColumns: table.columns.indices.filter { table.isCounter[$0] }.map { table.columns[$0] },
                    metadataBytes: metadataBytes
                )
            )
        }
        var status = StoreStatus(
            siteID: siteID,
            nodeName: try nodeName(),
            versionVector: try versionVector(),
            tables: tables.filter { !Self.internalReplicatedTables.contains($0.name) },
            pausedTables: pausedTableList,
            conflicts: try conflictCount(),
            digest: settlingDigest ? try digest() : try digestAsFolded(),
            identityChange: try identityChange()
        )
        if !settlingDigest { status.digestIsCurrent = !(try digestNeedsSettling(try storedTableDigests())) }
        (status.schemaChanges, status.schemaPending) = try schemaPosition()
        status.schemaConflicts = try schemaConflicts()
        status.heldChanges = try heldChanges()
        status.awaitsFreshState = try awaitsFreshState()
        return status
    }
}
