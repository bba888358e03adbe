import ShoalCore

/// A position in the answer to "what does this version vector lack": the store hands out one batch at a
/// time from it (``Store/nextBatch(_:maxChanges:maxBytes:)``), bounded in changes and in bytes, so a catch-up
/// of any size and any value sizes needs memory for one batch only.
///
/// Batches are cut at transaction boundaries. A transaction larger than a batch on its own is split; its
/// earlier parts claim nothing for it, so an interrupted catch-up sends it again from its start.
public final class DeltaCursor {
    let since: VersionVector
    /// What the answer sends: the store's version when the cursor opened, extended by writes committed since to rows
    /// it had yet to send (see ``Store/carryRewrites(_:of:)``).
    var held: VersionVector
    /// How many times the answer was extended.
    var extensions = 0
    /// An answer extends itself at most this often; later rewrites cap it instead, so that an app writing without
    /// pause cannot keep one answer going forever.
    static let maximumExtensions = 256
    /// The sites in the order the answer sends them, each from `from` on: every known site from what the asker
    /// holds, then any site the answer was extended with after passing it, from where it had stopped.
    var sites: [(index: UInt64, site: SiteID, from: UInt64)]
    var siteIndex = 0
    /// The highest seq of the current site already sent whole.
    var floor: UInt64 = 0
    var claim: VersionVector
    /// The transaction being sent: its log rows, and how far through them.
    var dot: Dot?
    var dotRows: [(table: Int64, keys: [UInt8])] = []
    var rowPosition = 0
    var keyOffset = 0
    var seenKeys = SeenKeys()
    var dotStartedInBatch = false
    /// About how many changes the whole answer holds (from the change log's size).
    public internal(set) var estimatedChanges: UInt64 = 0
    /// How many changes were handed out so far.
    public internal(set) var sentChanges: UInt64 = 0
    /// The bytes of the change-log key lists the answer reads, when it opened.
    var listBytes: UInt64 = 0
    /// The bytes of the key lists of the transactions sent whole (or passed over) so far.
    var listBytesDone: UInt64 = 0
    /// How far through the key lists the last batch ended (``listBytesRead``).
    var listBytesAtLastBatch: UInt64 = 0
    /// Changes the last batch handed out per byte of key list it read: how the rest will go (keys grow longer as a
    /// table's integer keys grow, so the first list's keys, which ``estimatedChanges`` goes by, are shorter than most).
    var changesPerListByte: Double?
    /// About how many changes are left to send: the key lists' bytes left at the last batch's pace, or, before a
    /// batch, the estimate from the lists' size.
    public var estimatedRemaining: UInt64 {
        if let changesPerListByte {
            let left = listBytes > listBytesAtLastBatch ? listBytes - listBytesAtLastBatch : 0
            return UInt64(Double(left) * changesPerListByte)
        }
        return estimatedChanges > sentChanges ? estimatedChanges - sentChanges : 0
    }

    /// The bytes of key lists read so far: the transactions done, and the part of the one in progress.
    var listBytesRead: UInt64 {
        guard dot != nil else { return listBytesDone }
        let rowsDone = dotRows[..<min(rowPosition, dotRows.count)].reduce(0) { $0 + $1.keys.count }
        return listBytesDone + UInt64(rowsDone + keyOffset)
    }

    /// Notes a batch of `changes` changes handed out, for ``estimatedRemaining``.
    func noteBatch(changes: Int) {
        sentChanges += UInt64(changes)
        let read = listBytesRead
        if read > listBytesAtLastBatch, changes > 0 {
            changesPerListByte = Double(changes) / Double(read - listBytesAtLastBatch)
        }
        listBytesAtLastBatch = read
    }
    /// Whether the last batch (the one with the final claim) was handed out.
    public internal(set) var isFinished = false

    /// Counts this cursor as open until it finishes or goes away.
    var lease: CursorLease?
    /// Per site, the highest seq the answer may claim: below a transaction one of whose rows this store wrote
    /// after the answer's version was fixed (see ``CursorCount``). What it sent of that
    /// transaction and the later ones still applies; the receiver claims them once a later answer, whose version
    /// holds the newer write, sends it.
    var ceilings: [SiteID: UInt64] = [:]
    /// Whether this database's own writes past what the asker holds are held back (it awaits its fresh state): one of
    /// them may be what overwrote a transaction whose overwriters the log no longer names.
    var holdsBackOwnWrites = false

    /// Transactions sent (or skipped) whose claim waits, per site in order: part of what they wrote may have been
    /// overwritten by a transaction this answer has not sent yet (`needs`; `nil` when unknown, for transactions
    /// compaction dropped from the log), which the receiver must hold before it claims them. Otherwise a batch
    /// would let the receiver claim a write it holds neither itself nor what beat it, and if the sender were then
    /// lost, the survivors would never exchange it.
    var waits: [SiteID: [(seq: UInt64, needs: [Dot]?)]] = [:]
    /// The claim of the transaction being sent waits for these.
    var dotNeeds: Set<Dot> = []
    /// The clock of the transaction being sent.
    var dotHLC = HLC(rawValue: 0)

    /// Notes that `site`'s transaction `seq` may be claimed only once `needs` were sent (`nil`: at the end).
    func wait(_ site: SiteID, _ seq: UInt64, needs: [Dot]?) {
        if let needs, needs.allSatisfy({ claim.covers($0) }) { return }
        waits[site, default: []].append((seq, needs))
    }

    /// What a batch handed out now may claim: what was sent (``claim``), short of the transactions still waiting.
    func batchClaim() -> VersionVector {
        var entries = claim.entries
        for (site, list) in waits {
            // Sent writes only add up, so a wait once met stays met: drop met ones from the front.
            let firstUnmet = list.firstIndex { wait in
                guard let needs = wait.needs else {
                    // Unknown overwriters lie within what the answer holds: met once all of it was sent, unless part
                    // was held back (a ceiling, or this database's own writes awaiting its fresh state), which might
                    // be one of them. (An awaiting copy claimed another site's write it had overwritten with one of
                    // its own held back: the asker never got either.)
                    return !(isFinished && ceilings.isEmpty && !holdsBackOwnWrites)
                }
                return !needs.allSatisfy { claim.covers($0) }
            }
            guard let firstUnmet else {
                waits[site] = nil
                continue
            }
            waits[site] = Array(list[firstUnmet...])
            entries[site] = min(entries[site] ?? 0, list[firstUnmet].seq - 1)
        }
        return VersionVector(entries)
    }

    /// Lowers the claim's ceiling for `dot`'s site to just below `dot`.
    func cap(_ dot: Dot) {
        ceilings[dot.site] = min(ceilings[dot.site] ?? .max, dot.seq - 1)
    }

    /// Claims what the current site holds (up to its ceiling) and moves on to the next site.
    func moveToNextSite() {
        advanceClaim(sites[siteIndex].site, to: held[sites[siteIndex].site])
        siteIndex += 1
        if siteIndex < sites.count { floor = sites[siteIndex].from }
    }

    /// Advances the claim for `site` to `seq`, or to its ceiling.
    func advanceClaim(_ site: SiteID, to seq: UInt64) {
        claim.advance(site, to: min(seq, ceilings[site] ?? .max))
    }

    init(since: VersionVector, held: VersionVector, sites: [(index: UInt64, site: SiteID)]) {
        self.since = since
        self.held = held
        self.sites = sites.sorted { $0.site < $1.site }.map { ($0.index, $0.site, since[$0.site]) }
        self.claim = since
        if let first = self.sites.first { floor = first.from }
    }
}

extension Store {
    /// Starts answering "what does `since` lack".
    public func deltaCursor(since: VersionVector) throws(ShoalError) -> DeltaCursor {
        try refreshSchema()
        try captureForeignWritesIfIdle()
        let servable = try readServableVector()
        var held = servable
        if since[siteID] > held[siteID] {
            // The asker holds more of this database's own history than this database does: this file was restored
            // from an older copy (in a way its opening did not see: under a running node, or without the file that
            // records what was sent) or lost commits it had already sent. Its next transactions would reuse sequence
            // numbers the asker holds with other content, so it answers nothing, and moves to a fresh site when it
            // next opens.
            noteOwnSiteEvidence(since[siteID])
            throw ShoalError(
                code: .siteConflict,
                message: "the peer holds transactions up to \(since[siteID]) of this database's own site "
                    + "\(siteID.hex.prefix(8)), but this database has only \(held[siteID]): it was restored from an "
                    + "older copy or lost commits it had sent, and its later writes would reuse numbers the peer holds "
                    + "with other content, so nothing is sent. \(Self.restartToMove)"
            )
        }
        if held[siteID] > since[siteID], try awaitsFreshState() {
            // This database lost history and has not taken its fresh state yet: its own writes wait (see
            // `Store+FreshState.swift`), neither sent nor claimed.
            held = VersionVector(held.entries.merging([siteID: since[siteID]]) { $1 })
        }
        let holdsBack = held[siteID] < servable[siteID]
        if held[siteID] > since[siteID] { try makeLocalCommitsDurable(upTo: held[siteID]) }
        let cursor = DeltaCursor(since: since, held: held, sites: sites.all)
        cursor.holdsBackOwnWrites = holdsBack
        if holdsBack {
            // A transaction of another site the log no longer lists was overwritten whole, perhaps by one of the
            // writes held back: not claimed past it (a peer that took its claim would hold neither). Peers claim it
            // from nodes that send what overwrote it, or from this one once its own writes go.
            let seqs = try statement("SELECT DISTINCT seq FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ? ORDER BY seq")
            for (index, site, _) in cursor.sites where site != siteID && held[site] > since[site] {
                try seqs.bind([
                    .integer(Int64(index)), .integer(Int64(bitPattern: since[site])),
                    .integer(Int64(bitPattern: held[site])),
                ])
                var next = since[site] + 1
                while try seqs.step(), case .integer(let seq) = seqs.column(0), UInt64(seq) == next { next += 1 }
                seqs.reset()
                if next <= held[site] { cursor.ceilings[site] = next - 1 }
            }
        }
        cursor.lease = CursorLease(openCursors)
        // The rows listed, from the lists' bytes and the bytes a key takes in the first list (a key of one integer
        // takes 3-4 bytes, one written before or of other values more); each row listed carries about one change per
        // column.
        let columns = max(1, capture.tables.map { $0.columns.count }.max() ?? 1)
        let first = try statement(
            "SELECT substr(keys, 1, 65536) FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ? LIMIT 1"
        )
        for (index, site, _) in cursor.sites where held[site] > since[site] {
            let bytes = try logListBytes(site: index, after: since[site], through: held[site])
            try first.bind([
                .integer(Int64(index)),
                .integer(Int64(bitPattern: since[site])),
                .integer(Int64(bitPattern: held[site])),
            ])
            let perKey = try first.step() ? Self.bytesPerLogKey(first.columnBytes(0)) : 10
            first.reset()
            cursor.estimatedChanges += UInt64(Double(bytes) / perKey) * UInt64(columns)
            cursor.listBytes += bytes
        }
        return cursor
    }

    /// The bytes of the change-log key lists of the site numbered `site`, of its transactions after `after` up to and
    /// including `through`.
    private func logListBytes(site: UInt64, after: UInt64, through: UInt64) throws(ShoalError) -> UInt64 {
        let size = try statement("SELECT sum(length(keys)) FROM shoal_log WHERE site = ? AND seq > ? AND seq <= ?")
        defer { size.reset() }
        try size.bind([
            .integer(Int64(bitPattern: site)), .integer(Int64(bitPattern: after)), .integer(Int64(bitPattern: through)),
        ])
        guard try size.step(), case .integer(let bytes) = size.column(0) else { return 0 }
        return UInt64(max(0, bytes))
    }

    /// The bytes a key takes in a change-log key list (``appendLogKey(_:to:)``), on average over the whole keys at the
    /// start of `list` (10 when it holds none).
    static func bytesPerLogKey(_ list: [UInt8]) -> Double {
        var reader = ByteReader(list)
        var keys = 0
        var end = 0
        // The first 64 KB of a list may end inside a key: the whole ones before it count.
        while !reader.isAtEnd {
            guard let length = try? reader.readVarint(),
                (length == 0 ? (try? reader.readVarint()) != nil : (try? reader.readBytes(Int(clamping: length))) != nil)
            else { break }
            keys += 1
            end = reader.offset
        }
        return keys > 0 ? Double(end) / Double(keys) : 10
    }

    /// The next batch of at most `maxChanges` changes and about `maxBytes` encoded bytes, or `nil` once the
    /// final batch was handed out.
    ///
    /// A batch ends before the row that would take it over either limit, so it exceeds `maxBytes` only when it
    /// holds a single row larger than that on its own. It ends at a transaction boundary when it holds whole
    /// transactions; a transaction larger than a batch spans several, and only the batch that completes it
    /// raises the claim to cover it.
    public func nextBatch(
        _ cursor: DeltaCursor,
        maxChanges: Int,
        maxBytes: Int = Store.defaultBatchBytes
    ) throws(ShoalError) -> ChangeBatch? {
        guard !cursor.isFinished else { return nil }
        // Writes other connections committed are stamped first, and the batch is read in one snapshot: a row's
        // values and its clocks are read as of one moment. A write committed after the stamp and before the
        // snapshot is in the outbox: its rows count as rewritten (their data is newer than their clocks).
        try captureForeignWritesIfIdle()
        let batch = try inReadSnapshot { () throws(ShoalError) -> ChangeBatch in
            let unstamped = try unstampedKeys()
            return try nextBatchBody(cursor, maxChanges: max(1, maxChanges), maxBytes: max(1, maxBytes), unstamped)
        }
        cursor.noteBatch(changes: batch.changes.count)
        return batch
    }

    /// The rows other connections wrote that are not stamped yet (in the outboxes), by table id.
    private func unstampedKeys() throws(ShoalError) -> [Int64: Set<[SQLValue]>] {
        guard try outboxMayHoldRows() else { return [:] }
        var keys: [Int64: Set<[SQLValue]>] = [:]
        for table in capture.tables {
            let columns = table.keyColumns.indices.map { "k\($0)" }.joined(separator: ", ")
            let select = try statement("SELECT \(columns) FROM \(Self.outboxTable(table.id))")
            defer { select.reset() }
            while try select.step() { keys[table.id, default: []].insert(select.row()) }
        }
        return keys
    }

    /// The default byte bound of a batch (2 MiB: well under the 16 MiB frame maximum).
    public static let defaultBatchBytes = 2 * 1024 * 1024

    private func nextBatchBody(
        _ cursor: DeltaCursor,
        maxChanges: Int,
        maxBytes: Int,
        _ unstamped: [Int64: Set<[SQLValue]>]
    ) throws(ShoalError) -> ChangeBatch {
        try refreshSchema()
        let tablesByID = Dictionary(uniqueKeysWithValues: capture.tables.map { ($0.id, $0) })
        var changes: [Change] = []
        var bytes = 0
        var dotStart = 0
        var rowChanges: [Change] = []
        /// Adds one row's changes (a log key's, starting at `keyStart` in the entry and ending at `keyEnd`) to the
        /// batch, or, when they do not fit, returns the batch to hand out, with the cursor set to go on from there.
        func add(_ rowChanges: [Change], resumingAt keyStart: Int, after keyEnd: Int, key: [SQLValue]? = nil)
            -> ChangeBatch?
        {
            let rowBytes = rowChanges.reduce(0) { $0 + $1.estimatedEncodedBytes }
            if !changes.isEmpty && (changes.count + rowChanges.count > maxChanges || bytes + rowBytes > maxBytes) {
                if dotStart > 0 && cursor.dotStartedInBatch {
                    // The batch holds whole transactions before this one: end it there, and send this transaction
                    // from its start next time.
                    changes.removeSubrange(dotStart...)
                    restart(cursor)
                    return ChangeBatch(changes: changes, claim: cursor.batchClaim())
                }
                // This transaction alone exceeds a batch: send a part, claiming nothing for it, and go on from this
                // row next time.
                if let key { cursor.seenKeys.remove(key) }
                cursor.keyOffset = keyStart
                cursor.dotStartedInBatch = false
                return ChangeBatch(changes: changes, claim: cursor.batchClaim())
            }
            cursor.keyOffset = keyEnd
            changes.append(contentsOf: rowChanges)
            bytes += rowBytes
            return nil
        }
        nextTransaction: while true {
            if let dot = cursor.dot {
                // Continue the transaction in progress.
                if cursor.dotStartedInBatch == false { dotStart = changes.count }
                while cursor.rowPosition < cursor.dotRows.count {
                    let row = cursor.dotRows[cursor.rowPosition]
                    if row.table == Self.heldLogTable {
                        // Changes held here for a table or column this node does not have: sent as they came.
                        var reader = ByteReader(row.keys)
                        _ = try reader.readBytes(cursor.keyOffset)
                        while !reader.isAtEnd {
                            let keyStart = reader.offset
                            rowChanges.removeAll(keepingCapacity: true)
                            try collectHeld(try Self.readHeldLogKey(&reader), dot: dot, cursor: cursor, into: &rowChanges)
                            if let full = add(rowChanges, resumingAt: keyStart, after: reader.offset) { return full }
                        }
                        cursor.rowPosition += 1
                        cursor.keyOffset = 0
                        cursor.seenKeys.removeAll()
                        continue
                    }
                    guard let table = tablesByID[row.table] else {
                        cursor.rowPosition += 1
                        cursor.keyOffset = 0
                        cursor.seenKeys.removeAll()
                        continue
                    }
                    var reader = ByteReader(row.keys)
                    _ = try reader.readBytes(cursor.keyOffset)
                    while !reader.isAtEnd {
                        let keyStart = reader.offset
                        let key = try Self.readLogKey(&reader, table: table)
                        guard cursor.seenKeys.insert(key).inserted else {
                            cursor.keyOffset = reader.offset
                            continue
                        }
                        rowChanges.removeAll(keepingCapacity: true)
                        let (rewritten, state) = try collect(
                            dot: dot,
                            table: table,
                            key: key,
                            ownSeq: cursor.held[siteID],
                            into: &rowChanges
                        )
                        let touched =
                            rewritten
                            || cursor.lease.map({
                                openCursors.wasTouched(table: table.id, key: key, since: $0.openedAt)
                            }) ?? false
                        let carried = touched ? try carryRewrites(cursor, of: state) : true
                        if unstamped[table.id]?.contains(key) == true || !carried {
                            // Written since the answer's version was fixed, by a write this answer cannot carry:
                            // this transaction and the site's later ones are neither sent nor claimed now (a later
                            // answer sends them with what overwrote them), so that every change sent lies within
                            // what the answer claims.
                            cursor.cap(dot)
                            changes.removeSubrange(dotStart...)
                            cursor.dot = nil
                            // Their key lists are not read: the changes left no longer count them.
                            let skipped = try logListBytes(
                                site: cursor.sites[cursor.siteIndex].index,
                                after: dot.seq - 1,
                                through: cursor.held[dot.site]
                            )
                            cursor.listBytes -= min(cursor.listBytes, skipped)
                            cursor.moveToNextSite()
                            continue nextTransaction
                        }
                        if let state {
                            // What may have overwritten part of this transaction here, and that this answer sends
                            // (it holds it, and the receiver does not): the claim waits for it. A write held without
                            // being claimed (part of a transaction still arriving, or cut off) is not sent as a
                            // transaction: what it wrote in this row travels here, beside, so that the receiver holds
                            // what beat this transaction when it claims it.
                            let stamp = Stamp(hlc: cursor.dotHLC, site: dot.site, seq: dot.seq)
                            for overwriter in state.possibleOverwriters(of: stamp) where !cursor.since.covers(overwriter) {
                                // A write of this database's own held back (it awaits its fresh state) neither
                                // travels nor is met: the transaction it overwrote is not claimed.
                                if cursor.held.covers(overwriter)
                                    || cursor.holdsBackOwnWrites && overwriter.site == siteID
                                {
                                    cursor.dotNeeds.insert(overwriter)
                                } else {
                                    _ = try collect(dot: overwriter, table: table, key: key, into: &rowChanges)
                                }
                            }
                        }
                        if let full = add(rowChanges, resumingAt: keyStart, after: reader.offset, key: key) { return full }
                    }
                    cursor.rowPosition += 1
                    cursor.keyOffset = 0
                    // Keys repeat only within one table's list, which may come in several parts (one per apply).
                    if cursor.rowPosition == cursor.dotRows.count || cursor.dotRows[cursor.rowPosition].table != row.table {
                        cursor.seenKeys.removeAll()
                    }
                }
                // The transaction is complete.
                cursor.listBytesDone += UInt64(cursor.dotRows.reduce(0) { $0 + $1.keys.count })
                if !cursor.dotNeeds.isEmpty { cursor.wait(dot.site, dot.seq, needs: Array(cursor.dotNeeds)) }
                cursor.dotNeeds.removeAll()
                cursor.advanceClaim(dot.site, to: dot.seq)
                cursor.floor = dot.seq
                cursor.dot = nil
                if changes.count >= maxChanges || bytes >= maxBytes {
                    return ChangeBatch(changes: changes, claim: cursor.batchClaim())
                }
            }
            // The next transaction of the current site, or the next site.
            guard cursor.siteIndex < cursor.sites.count else {
                cursor.isFinished = true
                cursor.lease = nil
                for (site, seq) in cursor.held.entries { cursor.advanceClaim(site, to: seq) }
                return ChangeBatch(changes: changes, claim: cursor.batchClaim())
            }
            let (index, site, _) = cursor.sites[cursor.siteIndex]
            let next = try nextLoggedSeq(site: index, after: cursor.floor)
            if cursor.floor < cursor.held[site], (next ?? .max) > cursor.floor + 1 {
                // Transactions compaction dropped (everything they wrote was overwritten since): what overwrote them
                // is not known here, so their claim waits for the whole answer.
                cursor.wait(site, cursor.floor + 1, needs: nil)
            }
            guard let seq = next, seq <= cursor.held[site] else {
                cursor.moveToNextSite()
                continue
            }
            let select = try statement(
                "SELECT tbl, keys, hlc FROM shoal_log WHERE site = ? AND seq = ? ORDER BY tbl, part"
            )
            try select.bind([.integer(Int64(index)), .integer(Int64(bitPattern: seq))])
            var rows: [(table: Int64, keys: [UInt8])] = []
            while try select.step() {
                rows.append((select.columnInt64(0), select.columnBytes(1)))
                cursor.dotHLC = HLC(rawValue: UInt64(bitPattern: select.columnInt64(2)))
            }
            select.reset()
            cursor.dot = Dot(site: site, seq: seq)
            cursor.dotNeeds.removeAll()
            cursor.dotRows = rows
            cursor.rowPosition = 0
            cursor.keyOffset = 0
            cursor.seenKeys.removeAll()
            cursor.dotStartedInBatch = true
            dotStart = changes.count
        }
    }

    /// Extends the answer to carry the writes committed to a row since its version was fixed (the app rewrote it,
    /// a third peer's batch landed): the transaction being sent then waits for them (they overwrote part of it) and
    /// is claimed once they were sent, instead of being held back, which would leave the receiver without a claim
    /// of the site for as long as the app keeps writing. A site the answer already passed (or did not know when it
    /// opened) is sent again at the end, from where it stopped.
    ///
    /// Returns `false` when the answer cannot carry them: writes held but not claimed (part of a transaction cut
    /// off, or one whose claim still waits), or an answer extended too often already.
    private func carryRewrites(_ cursor: DeltaCursor, of state: RowState?) throws(ShoalError) -> Bool {
        guard let state else { return false }
        let newer = state.dots.filter { !cursor.held.covers($0) }
        guard !newer.isEmpty else { return true }
        // This database's own writes held back until its fresh state are not carried (an awaiting copy sent one so,
        // and claimed the write of another site it had overwritten).
        if cursor.holdsBackOwnWrites, newer.contains(where: { $0.site == siteID }) { return false }
        guard cursor.extensions < DeltaCursor.maximumExtensions else { return false }
        let current = try versionVector()
        guard newer.allSatisfy({ current.covers($0) }) else { return false }
        for site in Set(newer.map(\.site)) {
            let stopped = cursor.held[site]
            cursor.held.advance(site, to: current[site])
            let ahead = cursor.sites[cursor.siteIndex...].contains { $0.site == site }
            if !ahead, let index = sites.existingIndex(of: site) {
                cursor.sites.append((index, site, max(stopped, cursor.since[site])))
            }
        }
        try makeLocalCommitsDurable(upTo: cursor.held[siteID])
        cursor.extensions += 1
        return true
    }

    private func restart(_ cursor: DeltaCursor) {
        cursor.rowPosition = 0
        cursor.keyOffset = 0
        cursor.seenKeys.removeAll()
        cursor.dotStartedInBatch = true
    }

    private func nextLoggedSeq(site index: UInt64, after floor: UInt64) throws(ShoalError) -> UInt64? {
        let select = try statement("SELECT min(seq) FROM shoal_log WHERE site = ? AND seq > ?")
        try select.bind([.integer(Int64(index)), .integer(Int64(bitPattern: floor))])
        defer { select.reset() }
        guard try select.step(), case .integer(let seq) = select.column(0) else { return nil }
        return UInt64(seq)
    }
}

extension Change {
    /// About how many bytes the change takes in a change batch (an upper bound of the wire encoding: the table
    /// name, the key, the value, and the fixed fields).
    var estimatedEncodedBytes: Int {
        var size = 40 + table.utf8.count
        for value in primaryKey { size += value.encodedSizeBound }
        switch payload {
        case .row: break
        case .column(let name, let value): size += name.utf8.count + value.encodedSizeBound
        case .counter(let name, _, _): size += name.utf8.count + 20
        }
        return size
    }
}

/// The keys of the transaction being sent that were sent already (a key can be listed in several parts of its log
/// entry). Keys of one integer, the usual kind, are kept apart as integers: hashing them as arrays of values cost the
/// sender of a catch-up a few percent of its time.
struct SeenKeys {
    private var integers = Set<Int64>()
    private var others = Set<[SQLValue]>()

    /// Adds `key`; whether it was new.
    mutating func insert(_ key: [SQLValue]) -> (inserted: Bool, Void) {
        if key.count == 1, case .integer(let value) = key[0] { return (integers.insert(value).inserted, ()) }
        return (others.insert(key).inserted, ())
    }

    mutating func remove(_ key: [SQLValue]) {
        if key.count == 1, case .integer(let value) = key[0] {
            integers.remove(value)
        } else {
            others.remove(key)
        }
    }

    mutating func removeAll() {
        integers.removeAll(keepingCapacity: true)
        others.removeAll()
    }
}
