import ShoalCore

extension Store {
    /// Every held change whose dot `since` does not cover, ordered by (site, seq), in batches of at most
    /// `maxChangesPerBatch` changes and about `maxBytesPerBatch` bytes, cut at transaction boundaries (a larger
    /// transaction spans several batches, and only the last of them claims it).
    ///
    /// Only the latest write of each column is held, so superseded changes are not sent; each batch's
    /// ``ChangeBatch/claim`` says what the receiver holds once it has applied it and the batches before it.
    /// There is always at least one batch, so the receiver learns the final claim even when nothing is sent.
    public func changes(
        since: VersionVector,
        maxChangesPerBatch: Int = 10_000,
        maxBytesPerBatch: Int = Store.defaultBatchBytes
    ) throws(ShoalError) -> [ChangeBatch] {
        let cursor = try deltaCursor(since: since)
        var batches: [ChangeBatch] = []
        while let batch = try nextBatch(cursor, maxChanges: maxChangesPerBatch, maxBytes: maxBytesPerBatch) {
            batches.append(batch)
        }
        return batches
    }

    /// Writes the offline stream (``ChangeStream``) of every held change `since` lacks: the header, one line
    /// per change, and the trailer, handing `write` about `chunkBytes` of whole lines at a time as they are
    /// produced, so a reader can parse while the rest is read. Everything comes from one read snapshot, so
    /// the header's claim is exactly what the lines deliver. Returns the number of changes written.
    @discardableResult
    public func writeChangeStream(
        since: VersionVector,
        chunkBytes: Int = 1 << 20,
        write: ([UInt8]) throws(ShoalError) -> Void
    ) throws(ShoalError) -> Int {
        // Writes other connections made are stamped first, so the snapshot below holds them.
        try captureForeignWritesIfIdle()
        let snapshot = connection.isAutocommit
        if snapshot { try connection.exec("BEGIN") }
        defer { if snapshot { try? connection.exec("COMMIT") } }
        let cursor = try deltaCursor(since: since)
        var heads: [Stamp] = []
        for (site, seq) in since.entries where site != siteID {
            if let head = try loggedHead(of: site, upTo: seq) { heads.append(head) }
        }
        var buffer = Array(
            ChangeStream.headerLine(
                .init(
                    site: siteID,
                    since: since,
                    claim: since.merging(cursor.held),
                    schema: try schemaFingerprint(),
                    heads: heads
                )
            ).utf8
        )
        buffer.append(0x0A)
        buffer.reserveCapacity(chunkBytes + 4096)
        var writer = ChangeStream.Writer()
        var count = 0
        while let batch = try nextBatch(cursor, maxChanges: 10_000) {
            for change in batch.changes {
                writer.append(change, to: &buffer)
                buffer.append(0x0A)
                count += 1
                if buffer.count >= chunkBytes {
                    try write(buffer)
                    buffer.removeAll(keepingCapacity: true)
                }
            }
        }
        buffer.append(contentsOf: ChangeStream.trailerLine(count: count).utf8)
        buffer.append(0x0A)
        try write(buffer)
        return count
    }

    /// The changes of transaction `dot` that row `key` still holds.
    /// The changes of row `key` that transaction `dot` wrote and that still hold.
    ///
    /// Returns the row's clocks, and whether the row holds a stamp of this database's own site above `ownSeq`: a
    /// write committed after an answer that holds own transactions up to `ownSeq` opened (by this store, or by
    /// another process's store on the same file, such as `shoal sql` beside `shoal serve`), which may have
    /// overwritten part of `dot`.
    @discardableResult
    func collect(
        dot: Dot,
        table: ReplicatedTable,
        key: [SQLValue],
        ownSeq: UInt64 = .max,
        into changes: inout [Change]
    ) throws(ShoalError) -> (rewritten: Bool, state: RowState?) {
        guard let state = try loadState(table: table, key: key) else { return (false, nil) }
        var newerOwn = false
        if ownSeq != .max {
            func newer(_ stamp: Stamp?) -> Bool { stamp.map { $0.site == siteID && $0.seq > ownSeq } ?? false }
            newerOwn = newer(state.lengthStamp)
            for cell in state.cells where !newerOwn {
                switch cell {
                case .empty: break
                case .value(let stamp, _): newerOwn = newer(stamp)
                case .counter(let entries): newerOwn = (entries[siteID]?.seq ?? 0) > ownSeq
                }
            }
        }
        if let lengthStamp = state.lengthStamp, lengthStamp.dot == dot {
            changes.append(
                Change(
                    table: table.name,
                    primaryKey: key,
                    payload: .row,
                    causalLength: state.causalLength,
                    stamp: lengthStamp
                )
            )
        }
        var values: [SQLValue]?
        for (index, cell) in state.cells.enumerated() {
            switch cell {
            case .empty:
                continue
            case .value(let stamp, let previous):
                guard stamp.dot == dot else { continue }
                if values == nil { values = try dataValues(table: table, key: key) }
                changes.append(
                    Change(
                        table: table.name,
                        primaryKey: key,
                        payload: .column(table.columns[index], values![index]),
                        causalLength: state.causalLength,
                        stamp: stamp,
                        previous: previous
                    )
                )
            case .counter(let entries):
                guard let entry = entries[dot.site], entry.seq == dot.seq else { continue }
                changes.append(
                    Change(
                        table: table.name,
                        primaryKey: key,
                        payload: .counter(
                            table.columns[index],
                            increments: entry.increments,
                            decrements: entry.decrements
                        ),
                        causalLength: state.causalLength,
                        stamp: Stamp(hlc: entry.hlc, site: dot.site, seq: dot.seq)
                    )
                )
            }
        }
        return (newerOwn, state)
    }

    /// A row's non-key values as stored (NULLs when the row is missing).
    func dataValues(table: ReplicatedTable, key: [SQLValue]) throws(ShoalError) -> [SQLValue] {
        guard !table.columns.isEmpty else { return [] }
        let select = try clockStatements(table).selectRow
        try select.bind(key)
        defer { select.reset() }
        guard try select.step() else { return Array(repeating: .null, count: table.columns.count) }
        return (1...table.columns.count).map { select.column($0) }
    }
}
