/// The replication metadata of one row: its causal length and the clock of every column.
///
/// This is where the merge rules live. A row's *life* is its causal length: odd is alive, even is deleted,
/// 0 is never seen. A higher causal length always wins (so a delete beats concurrent updates, and only an
/// insert that observed the delete revives the row); within one life each column is a last-writer-wins
/// register ordered by ``Stamp``, and counter columns are PN-counters with one entry per writing site.
public struct RowState: Hashable, Sendable {
    /// The metadata of one column in the current life.
    public enum Cell: Hashable, Sendable {
        /// Not written in this life.
        case empty
        /// A last-writer-wins value written by `stamp`, which overwrote `previous` where it was made.
        case value(Stamp, previous: Dot?)
        /// A PN-counter: each site's total contribution.
        case counter([SiteID: CounterEntry])
    }

    /// Odd: alive; even: deleted; 0: never seen.
    public var causalLength: UInt64
    /// The change that set the causal length, when known. A row's first life needs none when its columns
    /// travel anyway, so it is `nil` there.
    public var lengthStamp: Stamp?
    /// One cell per non-key column, in table order.
    public var cells: [Cell]

    /// A row never seen.
    public init(columnCount: Int) {
        self.causalLength = 0
        self.lengthStamp = nil
        self.cells = Array(repeating: .empty, count: columnCount)
    }

    /// A row with this causal length, the stamp that set it, and one cell per non-key column.
    public init(causalLength: UInt64, lengthStamp: Stamp?, cells: [Cell]) {
        self.causalLength = causalLength
        self.lengthStamp = lengthStamp
        self.cells = cells
    }

    /// Whether the row exists.
    public var isAlive: Bool { causalLength % 2 == 1 }

    /// Whether transaction `dot` still has an effect here that a peer lacking it would be sent: it set the
    /// causal length, the current value of a column, or its site's latest counter entry.
    public func holds(_ dot: Dot) -> Bool {
        if lengthStamp?.dot == dot { return true }
        return cells.contains { cell in
            switch cell {
            case .empty: false
            case .value(let stamp, _): stamp.dot == dot
            case .counter(let entries): entries[dot.site]?.seq == dot.seq
            }
        }
    }

    /// The value of counter cell `index`: the sum of every site's contribution, computed exactly (in 128 bits)
    /// and then held within Int64's range: a sum beyond `Int64.max` reads `Int64.max`, one below `Int64.min` reads
    /// `Int64.min`. The sum is taken over the whole set of contributions, so every node holding the same ones
    /// reads the same value, whatever order they arrived in; a counter never wraps around to the other sign.
    public func counterValue(_ index: Int) -> Int64 {
        guard case .counter(let entries) = cells[index] else { return 0 }
        let sum = entries.values.reduce(Int128(0)) { $0 + Int128($1.increments) - Int128($1.decrements) }
        return Int64(clamping: sum)
    }

    /// The transactions in this row that may have overwritten what the transaction of `stamp` wrote here: the one
    /// that set the causal length (a new life resets every cell), writes of a column with a later stamp, and a
    /// later counter entry of the same site. A transaction never overwrites itself.
    public func possibleOverwriters(of stamp: Stamp) -> [Dot] {
        var result: [Dot] = []
        if let lengthStamp, lengthStamp.dot != stamp.dot { result.append(lengthStamp.dot) }
        for cell in cells {
            switch cell {
            case .empty: break
            case .value(let written, _):
                if written > stamp && written.dot != stamp.dot { result.append(written.dot) }
            case .counter(let entries):
                if let entry = entries[stamp.site], entry.seq > stamp.seq {
                    result.append(Dot(site: stamp.site, seq: entry.seq))
                }
            }
        }
        return result
    }

    /// Gives every stamp of transaction `dot` in this row the clock `hlc` (a transaction stamped again before it was
    /// ever sent).
    public mutating func restamp(_ dot: Dot, hlc: HLC) {
        if let stamp = lengthStamp, stamp.dot == dot { lengthStamp = Stamp(hlc: hlc, site: dot.site, seq: dot.seq) }
        for index in cells.indices {
            switch cells[index] {
            case .empty: break
            case .value(let stamp, let previous):
                if stamp.dot == dot { cells[index] = .value(Stamp(hlc: hlc, site: dot.site, seq: dot.seq), previous: previous) }
            case .counter(var entries):
                guard let entry = entries[dot.site], entry.seq == dot.seq else { continue }
                entries[dot.site]?.hlc = hlc
                cells[index] = .counter(entries)
            }
        }
    }

    /// Gives every stamp of transaction `dot` in this row the site and number of `reissued`, keeping its clock (a
    /// transaction a database restored from an older copy wrote under a number its peers hold with other content,
    /// issued again under its fresh site).
    ///
    /// A counter's entry is the sum of all its site's transactions in the row's life, and the part `dot` added is not
    /// known: it moves to the fresh site when it is all `dot`'s and its site's later ones, that is when it is zero
    /// (an insert's default) or `lifeIsReissued` (the row's life began with a reissued transaction), and otherwise
    /// stays the old site's.
    public mutating func reissue(_ dot: Dot, as reissued: Dot, lifeIsReissued: Bool) {
        func moved(_ stamp: Stamp) -> Stamp {
            stamp.dot == dot ? Stamp(hlc: stamp.hlc, site: reissued.site, seq: reissued.seq) : stamp
        }
        if let stamp = lengthStamp { lengthStamp = moved(stamp) }
        for index in cells.indices {
            switch cells[index] {
            case .empty: break
            case .value(let stamp, let previous):
                cells[index] = .value(moved(stamp), previous: previous == dot ? reissued : previous)
            case .counter(var entries):
                guard let entry = entries[dot.site], entry.seq == dot.seq,
                    lifeIsReissued || (entry.increments == 0 && entry.decrements == 0)
                else { continue }
                entries[dot.site] = nil
                entries[reissued.site] = CounterEntry(
                    increments: entry.increments, decrements: entry.decrements, seq: reissued.seq, hlc: entry.hlc
                )
                cells[index] = .counter(entries)
            }
        }
    }

    /// Every stamp this row holds, for the delta query: a change must be sent while its dot is not covered.
    public var dots: Set<Dot> {
        var result = Set<Dot>()
        if let lengthStamp { result.insert(lengthStamp.dot) }
        for cell in cells {
            switch cell {
            case .empty: break
            case .value(let stamp, _): result.insert(stamp.dot)
            case .counter(let entries):
                for (site, entry) in entries { result.insert(Dot(site: site, seq: entry.seq)) }
            }
        }
        return result
    }

    /// ``dots`` with the clock each transaction wrote here.
    public var dotClocks: [Dot: HLC] {
        var result: [Dot: HLC] = [:]
        if let lengthStamp { result[lengthStamp.dot] = lengthStamp.hlc }
        for cell in cells {
            switch cell {
            case .empty: break
            case .value(let stamp, _): result[stamp.dot] = stamp.hlc
            case .counter(let entries):
                for (site, entry) in entries { result[Dot(site: site, seq: entry.seq)] = entry.hlc }
            }
        }
        return result
    }
}

/// What merging one change into a row did.
public enum MergeOutcome: Hashable, Sendable {
    /// The row already holds this exact change.
    case known
    /// The change lost: the row holds a later life, or a later write of the same column.
    /// `winner` is the local write that beat it (when it was a column write).
    case stale(winner: Stamp?, winnerPrevious: Dot?)
    /// The change took effect. `lifeChanged` says the causal length moved (every cell was reset first);
    /// `overwritten` is the column write it replaced, if any.
    case applied(lifeChanged: Bool, overwritten: Stamp?, overwrittenPrevious: Dot?)
}

extension RowState {
    /// Moves the row to a later life: every cell starts empty.
    private mutating func adopt(causalLength: UInt64, stamp: Stamp?) {
        self.causalLength = causalLength
        self.lengthStamp = stamp
        for index in cells.indices { cells[index] = .empty }
    }

    /// Merges only the row's life that a change carries: for a change to a column this node does not have yet (it
    /// is held until the column appears), the row still lives the life the change was made in, as the columns this
    /// node has would show it. Returns whether the row moved to a later life.
    public mutating func mergeLife(of change: Change) -> Bool {
        guard change.causalLength > causalLength else { return false }
        adopt(causalLength: change.causalLength, stamp: nil)
        return true
    }

    /// Merges one remote change. `column` is the payload's column index (nil for a row change); the caller
    /// has checked that the payload kind matches the column's kind.
    public mutating func merge(_ change: Change, column: Int?) -> MergeOutcome {
        let incomingLength = change.causalLength
        if incomingLength < causalLength { return .stale(winner: nil, winnerPrevious: nil) }

        guard let column else {
            // A row change: the causal length register.
            if incomingLength > causalLength {
                adopt(causalLength: incomingLength, stamp: change.stamp)
                return .applied(lifeChanged: true, overwritten: nil, overwrittenPrevious: nil)
            }
            guard let current = lengthStamp else {
                lengthStamp = change.stamp
                return .applied(lifeChanged: false, overwritten: nil, overwrittenPrevious: nil)
            }
            if current == change.stamp { return .known }
            if change.stamp < current { return .stale(winner: nil, winnerPrevious: nil) }
            lengthStamp = change.stamp
            return .applied(lifeChanged: false, overwritten: nil, overwrittenPrevious: nil)
        }

        var lifeChanged = false
        if incomingLength > causalLength {
            adopt(causalLength: incomingLength, stamp: nil)
            lifeChanged = true
        }

        switch change.payload {
        case .row:
            preconditionFailure("a row change has no column")
        case .column:
            if case .value(let current, let currentPrevious) = cells[column] {
                if current == change.stamp { return .known }
                if change.stamp < current { return .stale(winner: current, winnerPrevious: currentPrevious) }
                cells[column] = .value(change.stamp, previous: change.previous)
                return .applied(lifeChanged: lifeChanged, overwritten: current, overwrittenPrevious: currentPrevious)
            }
            cells[column] = .value(change.stamp, previous: change.previous)
            return .applied(lifeChanged: lifeChanged, overwritten: nil, overwrittenPrevious: nil)
        case .counter(_, let increments, let decrements):
            var entries: [SiteID: CounterEntry] = [:]
            if case .counter(let current) = cells[column] { entries = current }
            let site = change.stamp.site
            if let existing = entries[site] {
                if existing.seq == change.stamp.seq { return .known }
                if existing.seq > change.stamp.seq { return .stale(winner: nil, winnerPrevious: nil) }
            }
            entries[site] = CounterEntry(
                increments: increments,
                decrements: decrements,
                seq: change.stamp.seq,
                hlc: change.stamp.hlc
            )
            cells[column] = .counter(entries)
            return .applied(lifeChanged: lifeChanged, overwritten: nil, overwrittenPrevious: nil)
        }
    }
}
