extension RowState {
    /// Folds one row's net local change in a transaction into its metadata.
    ///
    /// - An insert of a row that is not alive starts its next life (causal length + 1): every cell gets
    ///   `stamp`, counters restart from this site's inserted value.
    /// - An update writes `stamp` into the changed cells (recording which write it overwrote) and moves this
    ///   site's counter entries by `counterDelta`.
    /// - A delete of a live row ends its life (causal length + 1, cells cleared). Deleting a row never seen
    ///   leaves a tombstone, so the delete still reaches nodes that hold the row.
    ///
    /// `hasColumns` is false for tables whose only columns are the key: their first life then carries an
    /// explicit row stamp, since no column change would announce the row.
    /// Returns whether anything changed.
    @discardableResult
    public mutating func recordLocalWrite(
        existedBefore: Bool,
        existsAfter: Bool,
        changed: [Bool],
        counterDelta: [Int64],
        isCounter: [Bool],
        stamp: Stamp
    ) -> Bool {
        let before = self
        switch (existedBefore, existsAfter) {
        case (_, true) where !isAlive:
            causalLength += 1
            lengthStamp = causalLength == 1 && !cells.isEmpty ? nil : stamp
            for index in cells.indices {
                cells[index] =
                    isCounter[index]
                    ? .counter([stamp.site: Self.entry(nil, delta: counterDelta[index], stamp: stamp)])
                    : .value(stamp, previous: nil)
            }
        case (_, true):
            for index in cells.indices {
                if isCounter[index] {
                    guard counterDelta[index] != 0 else { continue }
                    var entries: [SiteID: CounterEntry] = [:]
                    if case .counter(let current) = cells[index] { entries = current }
                    entries[stamp.site] = Self.entry(entries[stamp.site], delta: counterDelta[index], stamp: stamp)
                    cells[index] = .counter(entries)
                } else if changed[index] {
                    var previous: Dot?
                    if case .value(let current, _) = cells[index] { previous = current.dot }
                    cells[index] = .value(stamp, previous: previous)
                }
            }
        case (true, false):
            guard isAlive || causalLength == 0 else { break }
            causalLength += isAlive ? 1 : 2
            lengthStamp = stamp
            for index in cells.indices { cells[index] = .empty }
        case (false, false):
            break
        }
        return self != before
    }

    private static func entry(_ current: CounterEntry?, delta: Int64, stamp: Stamp) -> CounterEntry {
        var entry = current ?? CounterEntry(increments: 0, decrements: 0, seq: stamp.seq, hlc: stamp.hlc)
        // A site's running totals stop at UInt64.max rather than wrap (see ``counterValue(_:)``).
        if delta >= 0 {
            let (sum, overflow) = entry.increments.addingReportingOverflow(UInt64(delta))
            entry.increments = overflow ? .max : sum
        } else {
            // `magnitude`, not negation: Int64.min has no positive counterpart.
            let (sum, overflow) = entry.decrements.addingReportingOverflow(delta.magnitude)
            entry.decrements = overflow ? .max : sum
        }
        entry.seq = stamp.seq
        entry.hlc = stamp.hlc
        return entry
    }
}
