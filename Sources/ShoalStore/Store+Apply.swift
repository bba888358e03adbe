import ShoalCore

/// What applying a set of changes did.
public struct ApplyReport: Sendable, Hashable, CustomStringConvertible {
    /// Changes that took effect.
    public var applied = 0
    /// Changes already held, or beaten by what is held.
    public var alreadyKnown = 0
    /// Changes that met a different concurrent value (recorded in the conflict log).
    public var conflicts = 0
    /// The same conflicts counted by table (what the node's `shoal_node_conflicts_total` metric counts).
    public var conflictsByTable: [String: Int] = [:]
    /// Sites whose changes were refused for a clock further ahead than the drift bound, with the newest clock
    /// refused: their changes from that clock on were left out (and are not claimed), everything else applied.
    public var clockRefusals: [SiteID: HLC] = [:]
    /// Changes left out per site because a removed member made them after its removal (``Store/fences()``): not
    /// applied, not claimed.
    public var fenced: [SiteID: Int] = [:]
    /// Changes a member made while suspended for collection, left out because they would have brought back a row
    /// collected here (see `Store+SuspendedWrites.swift`): counted in ``alreadyKnown`` too, and claimed.
    public var suspendedWritesLeftOut = 0
    /// The highest seq per site of the changes applied (those refused left out): pass it, merged over the batches
    /// of one answer, as the next batch's `received` (see ``Store/apply(_:claim:since:received:)``).
    public internal(set) var acceptedHighest: [SiteID: UInt64] = [:]

    /// Whether any change was left out (fenced, or refused for its clock): an answer that withheld something does not
    /// end complete (see ``Store/apply(_:claim:since:received:completing:)``).
    public var withheldAny: Bool { !fenced.isEmpty || !clockRefusals.isEmpty }

    /// A report of nothing applied yet.
    public init() {}

    /// Adds what a later part of the same apply (a chunk, a slice) did.
    mutating func add(_ part: ApplyReport) {
        applied += part.applied
        alreadyKnown += part.alreadyKnown
        conflicts += part.conflicts
        conflictsByTable.merge(part.conflictsByTable, uniquingKeysWith: +)
        clockRefusals.merge(part.clockRefusals) { max($0, $1) }
        fenced.merge(part.fenced, uniquingKeysWith: +)
        suspendedWritesLeftOut += part.suspendedWritesLeftOut
        acceptedHighest.merge(part.acceptedHighest) { max($0, $1) }
    }

    /// The three counts, for a person: `applied 3, already known 0, conflicts 1`.
    public var description: String { "applied \(applied), already known \(alreadyKnown), conflicts \(conflicts)" }
}

/// One row being merged during an apply.
private struct RowWork {
    let table: Int
    let key: [SQLValue]
    let original: RowState?
    var state: RowState
    /// New value per cell, for last-writer-wins cells won in this apply.
    var values: [SQLValue?]
    var countersChanged: [Bool]
    var lifeChanged = false
    /// The row's values as stored before the apply, read only when a conflict needs them.
    var storedValues: [SQLValue]?
}

extension Store {
    /// Applies remote changes in one transaction, idempotently, in any order and grouping.
    ///
    /// `claim` is what the sender says the receiver holds once these changes (and `since`) are applied; it
    /// is merged into the version vector only if this database already holds `since`, the version the
    /// changes were cut for, and only as far as the changes prove it (``provenClaim(_:changes:held:)``: a
    /// raised claim is clipped to what was received, on the live and the offline path alike). Everything is
    /// validated before anything is written: an unknown table or column, a clock beyond the drift bound, or
    /// changes claiming this database's own site id for sequence numbers it never issued are refused with
    /// nothing applied.
    ///
    /// `received` is the highest seq per site of the changes applied from earlier batches of the same answer
    /// (their reports' ``ApplyReport/acceptedHighest``): a sender holds back the claim of a transaction until it
    /// has sent what overwrote part of it, so a batch may claim what earlier batches delivered.
    ///
    /// `completing`: these are the last changes of a whole answer, every earlier batch of which was applied with
    /// nothing withheld (``ApplyReport/withheldAny``). The claim is then taken whole for every site none of these
    /// changes was withheld from (see ``claimed(_:highest:held:completing:withheld:)``).
    @discardableResult
    public func apply(
        _ changes: [Change],
        claim: VersionVector = VersionVector(),
        since: VersionVector? = nil,
        received: [SiteID: UInt64] = [:],
        completing: Bool = false
    ) throws(ShoalError) -> ApplyReport {
        try apply(changes, claim: claim, since: since, received: received, completing: completing, validatedAt: nil)
    }

    /// ``apply(_:claim:since:received:completing:)``; `validatedAt`: the changes were checked whole
    /// (``validateBeforeSlices(_:claim:)``) at this schema version, and while the schema is the same they are not
    /// checked again (a slice of a batch, with no claim).
    @discardableResult
    package func apply(
        _ changes: [Change],
        claim: VersionVector = VersionVector(),
        since: VersionVector? = nil,
        received: [SiteID: UInt64] = [:],
        completing: Bool = false,
        validatedAt: Int64?
    ) throws(ShoalError) -> ApplyReport {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "apply changes outside of any open transaction")
        }
        try refreshSchema()
        if changes.isEmpty, since == nil, case let held = try versionVector(),
            !Self.claimed(claim, highest: received, held: held, completing: completing).advances(held)
        {
            // Nothing to merge, and a claim alone proves nothing beyond what is held and was received earlier (see
            // `provenClaim`): check it, and write nothing, so an idle round stays read-only.
            try refreshSites()
            _ = try validate(changes, claim: claim, since: since)
            return ApplyReport()
        }
        let triggersWereOn = try beginApply()
        defer {
            capture.isSuspended = false
            setTriggers(enabled: triggersWereOn)
        }
        do throws(ShoalError) {
            try replayHeldInTransaction()
            let report = try applyInTransaction(
                changes, claim: claim, since: since, carried: received, completing: completing,
                validatedAt: claim.isEmpty && since == nil ? validatedAt : nil
            )
            try connection.exec("COMMIT")
            // After the commit: another process opening the file meanwhile must not find more recorded than it holds.
            recordHolds()
            return report
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// Checks `changes` and `claim` as an apply would before writing anything (see ``apply(_:claim:since:received:)``),
    /// without writing: a batch applied in slices (``SlicedApply``) is refused whole, before its first slice, as one
    /// applied at once is.
    /// Returns the schema version it checked them against: slices applied while it stays the same are not checked again
    /// (``apply(_:claim:since:received:completing:validatedAt:)``).
    func validateBeforeSlices(_ changes: [Change], claim: VersionVector) throws(ShoalError) -> Int64 {
        try inReadSnapshot { () throws(ShoalError) -> Int64 in
            try refreshSites()
            _ = try validate(changes, claim: claim, since: nil)
            return schemaVersion
        }
    }

    /// Applies a stream whose changes arrive in chunks (`next` returns `nil` after the last), all in one
    /// transaction: each chunk is merged as soon as it comes, so a reader can parse while this applies, and
    /// an error from `next` (a truncated or malformed stream) or from any chunk rolls everything back. The
    /// claim is taken at the end, as far as all the chunks together prove it; see ``apply(_:claim:since:)``.
    @discardableResult
    public func apply(
        chunks next: () throws(ShoalError) -> [Change]?,
        claim: VersionVector,
        since: VersionVector?
    ) throws(ShoalError) -> ApplyReport {
        guard connection.isAutocommit, !capture.hasUncommittedWork else {
            throw ShoalError(code: .invalidArgument, message: "apply changes outside of any open transaction")
        }
        try refreshSchema()
        let triggersWereOn = try beginApply()
        defer {
            capture.isSuspended = false
            setTriggers(enabled: triggersWereOn)
        }
        do throws(ShoalError) {
            try replayHeldInTransaction()
            var total = ApplyReport()
            var carried: [SiteID: UInt64] = [:]
            while let chunk = try next() {
                guard !chunk.isEmpty else { continue }
                let report = try applyInTransaction(chunk, claim: VersionVector(), since: since)
                total.add(report)
                carried.merge(report.acceptedHighest) { max($0, $1) }
            }
            // A stream is a file anyone may have edited: its claim is taken only as far as its changes prove it,
            // even when it arrived whole (a live answer's is taken whole: see `claimed`).
            _ = try applyInTransaction([], claim: claim, since: since, carried: carried)
            try connection.exec("COMMIT")
            recordHolds()
            return total
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// Opens an apply's write transaction: stamps what other connections committed first (an app's write made
    /// after a remote one must win over it, and a remote delete must see the update it deletes), then suspends
    /// capture and the app's triggers. Returns whether the triggers were on (the caller puts them back).
    private func beginApply() throws(ShoalError) -> Bool {
        try connection.exec("BEGIN IMMEDIATE")
        do throws(ShoalError) {
            // Holding the write lock, no other process can change the schema now: merge by its current shape (a
            // column another process added since the last look has cells in the metadata it wrote).
            try refreshSchema()
            try stampForeignWrites()
        } catch {
            capture.discardPending()
            try? connection.exec("ROLLBACK")
            throw error
        }
        capture.isSuspended = true
        return suspendAppTriggers()
    }

    /// Turns the app's triggers off for an apply; returns whether they were on.
    ///
    /// An app trigger's writes are part of the transaction that fired it: on the node where the app wrote, they
    /// are captured with it and travel as that node's own changes (an audit row, a running total, an `updated_at`).
    /// Firing the trigger again where the change is applied would write them twice, or write rows no one
    /// captures, so triggers of the main schema do not run while Shoal applies remote changes. TEMP triggers
    /// created on Shoal's own connection still run (SQLite leaves them on): the way to keep a local-only table
    /// (a search index, a cache) up to date with applied rows; their writes to replicated tables are not captured.
    func suspendAppTriggers() -> Bool {
        let wereOn = triggersEnabled
        setTriggers(enabled: false)
        return wereOn
    }

    private func validate(_ changes: [Change], claim: VersionVector, since: VersionVector?) throws(ShoalError) -> Int64
    {
        let localSeq = try versionVector()[siteID]
        var maxHLC = HLC.zero
        // A batch's changes come table by table: the last table's number is looked up again only when it changes.
        var lastTable: (name: String, number: Int?)?
        for (position, change) in changes.enumerated() {
            let number = position + 1
            if lastTable?.name != change.table { lastTable = (change.table, capture.tableNumbers[change.table]) }
            guard let tableNumber = lastTable?.number else {
                // A table this database does not have (yet): the change is held (see ``hold(_:)``).
                try validateHeld(change, number: number, localSeq: localSeq)
                if change.stamp.hlc > maxHLC { maxHLC = change.stamp.hlc }
                continue
            }
            let table = capture.tables[tableNumber]
            guard change.primaryKey.count == table.keyColumns.count else {
                throw ShoalError(
                    code: .malformedStream,
                    message: "change \(number) has a key of \(change.primaryKey.count) values; \(table.name) has "
                        + "\(table.keyColumns.count) key columns. Nothing was applied"
                )
            }
            // The bounds every change meets, whatever its table (a NULL key part, a value over the maximum, a
            // sequence number no node issues, this database's own site beyond what it wrote): see `validateHeld`.
            try validateHeld(change, number: number, localSeq: localSeq)
            for (position, value) in change.primaryKey.enumerated() where table.keyAffinities[position].converts(value) {
                throw Self.convertedValue(number, value, table: table, column: table.keyColumns[position])
            }
            if table.keyIsRowid, case .integer = change.primaryKey[0] {
            } else if table.keyIsRowid {
                throw ShoalError(
                    code: .malformedStream,
                    message: "change \(number) has a key that is not an integer; the key of \(table.name) is its "
                        + "rowid. Nothing was applied"
                )
            }
            // A column this database does not have (yet): the value is held, the row's life merged. A value the
            // column would store as another is held too (see ``mustHold(_:)``).
            if let column = change.columnName, let index = table.index(ofColumn: column) {
                let isCounterPayload = if case .counter = change.payload { true } else { false }
                guard isCounterPayload == table.isCounter[index] else {
                    throw ShoalError(
                        code: .unsupportedSchema,
                        message: "change \(number) treats \(table.name).\(column) as a "
                            + "\(isCounterPayload ? "counter" : "plain column"), but here it is "
                            + "\(table.isCounter[index] ? "a counter" : "a plain column"). Nothing was applied"
                    )
                }
            }
            // (Clocks beyond the drift bound were set aside before: see `setAsideFutureClocks`.)
            if change.stamp.hlc > maxHLC { maxHLC = change.stamp.hlc }
        }
        if claim[siteID] > localSeq {
            noteOwnSiteEvidence(claim[siteID])
            throw ShoalError(
                code: .siteConflict,
                message: "the sender claims this database's own site up to seq \(claim[siteID]), but this "
                    + "database has only written up to \(localSeq): it was restored from an older copy or lost "
                    + "commits it had sent. \(Self.restartToMove)"
            )
        }
        return Int64(bitPattern: maxHLC.rawValue)
    }

    /// A value the column would store as something else: the sender's column is declared differently.
    private static func convertedValue(_ number: Int, _ value: SQLValue, table: ReplicatedTable, column: String)
        -> ShoalError
    {
        let kind =
            switch value {
            case .null: "NULL"
            case .integer: "an INTEGER"
            case .real(let real): real.isNaN ? "a NaN" : "a REAL"
            case .text, .invalidText: "a TEXT"
            case .blob: "a BLOB"
            }
        return ShoalError(
            code: .unsupportedSchema,
            message: "change \(number) stores \(kind) in \(table.name).\(column), which SQLite would store as another "
                + "value there: the sender's column is declared with another type. Nothing was applied"
        )
    }

    /// `carried`: the highest seq per site of changes applied earlier in the same transaction.
    /// `replaying`: the changes were held here (``replayHeldInTransaction()``), so they passed fences and the clock
    /// bound when they arrived, and are merged now whatever the clock says.
    func applyInTransaction(
        _ changes: [Change],
        claim: VersionVector,
        since: VersionVector?,
        carried: [SiteID: UInt64] = [:],
        completing: Bool = false,
        replaying: Bool = false,
        validatedAt: Int64? = nil
    ) throws(ShoalError) -> ApplyReport {
        try refreshSites()
        var changes = changes
        var fenced: [SiteID: Int] = [:]
        var refusals: [SiteID: HLC] = [:]
        if !replaying {
            // A removal, or a removed node's binding of a fresh site, among these changes fences before any is merged.
            try gateFences(changes)
            let unfenced: [Change]
            (unfenced, fenced) = try setAsideFenced(changes)
            if !fenced.isEmpty { try noteFenceGaps(fenced.keys) }
            (changes, refusals) = setAsideFutureClocks(unfenced)
        }
        var lastDot: Dot?
        var lastTable: String?
        for change in changes {
            if change.table != lastTable {
                lastTable = change.table
                committedTables.insert(change.table)
            }
            if change.stamp.dot != lastDot {
                lastDot = change.stamp.dot
                committedDots.insert(change.stamp.dot)
            }
        }
        // The first schema change to arrive here brings the table that records them.
        if capture.tableNumbers[Self.schemaTable] == nil, changes.contains(where: { $0.table == Self.schemaTable }) {
            try prepareSchemaTableInTransaction()
        }
        // So does the first floor of collected tombstones (see ``collectedTable``).
        if capture.tableNumbers[Self.collectedTable] == nil,
            changes.contains(where: { $0.table == Self.collectedTable })
        {
            try prepareCollectedTableInTransaction()
        }
        // And the first suspension (see ``suspendedTable``).
        if capture.tableNumbers[Self.suspendedTable] == nil,
            changes.contains(where: { $0.table == Self.suspendedTable })
        {
            try prepareSuspendedTableInTransaction()
        }
        // And the first member's report (see ``memberReportsTable``).
        if capture.tableNumbers[Self.memberReportsTable] == nil,
            changes.contains(where: { $0.table == Self.memberReportsTable })
        {
            try prepareMemberReportsTableInTransaction()
        }
        let maxHLC: Int64
        if let validatedAt, validatedAt == schemaVersion {
            maxHLC = Int64(bitPattern: changes.reduce(HLC.zero) { max($0, $1.stamp.hlc) }.rawValue)
        } else {
            maxHLC = try validate(changes, claim: claim, since: since)
        }
        let held = try versionVector()
        if let since, !held.dominatesOrEquals(since) {
            throw ShoalError(
                code: .streamNotApplicable,
                message: "these changes were cut for version \(since), but this database holds \(held); "
                    + "ask for changes since this database's own version. Nothing was applied"
            )
        }
        var report = ApplyReport()
        if !replaying {
            // A transaction this database already holds (its vector covers the dot) is merged here, or was overwritten
            // by what is: merged again it changes nothing, and it costs a row read. Skipped, it can also never bring
            // back a row or tombstone collected since. (Held changes replayed once their column arrives have covered
            // dots: they are not skipped.)
            let received = changes.count
            changes.removeAll { held[$0.stamp.site] >= $0.stamp.seq }
            report.alreadyKnown += received - changes.count
        } else {
            // Held changes merged now get log entries under numbers collection may have passed while they were held:
            // it looks at them again (see ``collectTombstones(upTo:maxRows:)``).
            try reopenCollection(for: changes)
        }
        let accepted = changes
        if !replaying {
            // Writes a suspended member made while away, to rows collected here: counted as beaten, and claimed.
            let leftOut = try leaveOutSuspendedWrites(&changes)
            report.alreadyKnown += leftOut
            report.suspendedWritesLeftOut = leftOut
        }
        // Whether each change is held (decided once: see ``mustHold(_:)``); changes of unknown tables go only there.
        var holding = mustHold(changes)
        var toHold = zip(changes, holding).compactMap { $1 ? $0 : nil }
        if !toHold.isEmpty {
            let known = changes.indices.filter { capture.tableNumbers[changes[$0].table] != nil }
            changes = known.map { changes[$0] }
            holding = known.map { holding[$0] }
        }
        // At most one row per run of changes with the same key: reserve once instead of growing step by step.
        var runs = changes.isEmpty ? 0 : 1
        for index in changes.indices.dropFirst()
        where changes[index].primaryKey != changes[index - 1].primaryKey
            || changes[index].table != changes[index - 1].table
        {
            runs += 1
        }
        var work: [RowKey: RowWork] = Dictionary(minimumCapacity: runs)
        var order: [RowKey] = []
        order.reserveCapacity(runs)
        var logKeys: [LogSlot: [UInt8]] = [:]
        var conflicts: [ConflictRecord] = []
        for change in changes { _ = sites.index(of: change.stamp.site) }
        try persistNewSites()

        // Changes of one row usually arrive together: keep the row being merged out of the dictionary.
        var tableName = ""
        var tableNumber = -1
        var currentKey: RowKey?
        var row = RowWork(
            table: -1,
            key: [],
            original: nil,
            state: RowState(columnCount: 0),
            values: [],
            countersChanged: []
        )
        var slot: LogSlot?
        var slotKeys: [UInt8] = []
        var slotLastKey: [SQLValue] = []
        for (position, change) in changes.enumerated() {
            if change.table != tableName {
                tableName = change.table
                tableNumber = capture.tableNumbers[change.table]!
            }
            let table = capture.tables[tableNumber]
            if currentKey?.table != tableNumber || currentKey?.key != change.primaryKey {
                if let currentKey { work[currentKey] = row }
                let rowKey = RowKey(table: tableNumber, key: change.primaryKey)
                if let existing = work.removeValue(forKey: rowKey) {
                    row = existing
                } else {
                    let original = try loadState(table: table, key: change.primaryKey)
                    row = RowWork(
                        table: tableNumber,
                        key: change.primaryKey,
                        original: original,
                        state: original ?? RowState(columnCount: table.columns.count),
                        values: Array(repeating: nil, count: table.columns.count),
                        countersChanged: Array(repeating: false, count: table.columns.count)
                    )
                    order.append(rowKey)
                }
                currentKey = rowKey
            }
            let column = change.columnName.flatMap { table.index(ofColumn: $0) }
            if change.columnName != nil, holding[position] {
                // A column this database does not have yet (or declares otherwise): the value is held (below); the
                // row lives on here.
                if row.state.mergeLife(of: change) {
                    row.lifeChanged = true
                    row.values = Array(repeating: nil, count: table.columns.count)
                    row.countersChanged = Array(repeating: false, count: table.columns.count)
                }
                continue
            }
            let outcome = row.state.merge(change, column: column)
            switch outcome {
            case .known:
                report.alreadyKnown += 1
            case .stale(let winner, let winnerPrevious):
                report.alreadyKnown += 1
                if case .column(let name, let incoming) = change.payload, let winner, let column {
                    try noteConflict(
                        change,
                        column: name,
                        incoming: incoming,
                        local: winner,
                        localPrevious: winnerPrevious,
                        winner: .local,
                        row: &row,
                        index: column,
                        table: table,
                        into: &conflicts
                    )
                }
            case .applied(let lifeChanged, let overwritten, let overwrittenPrevious):
                report.applied += 1
                if lifeChanged {
                    row.lifeChanged = true
                    row.values = Array(repeating: nil, count: table.columns.count)
                    row.countersChanged = Array(repeating: false, count: table.columns.count)
                }
                switch change.payload {
                case .row:
                    break
                case .column(let name, let incoming):
                    if let overwritten, let column {
                        try noteConflict(
                            change,
                            column: name,
                            incoming: incoming,
                            local: overwritten,
                            localPrevious: overwrittenPrevious,
                            winner: .remote,
                            row: &row,
                            index: column,
                            table: table,
                            into: &conflicts
                        )
                    }
                    row.values[column!] = incoming
                case .counter:
                    row.countersChanged[column!] = true
                }
                let changeSlot = LogSlot(dot: change.dot, table: table.id, hlc: change.stamp.hlc)
                if slot != changeSlot {
                    if let slot { logKeys[slot, default: []].append(contentsOf: slotKeys) }
                    slot = changeSlot
                    slotKeys.removeAll(keepingCapacity: true)
                    slotLastKey = []
                }
                if slotLastKey != change.primaryKey {
                    appendLogKey(change.primaryKey, to: &slotKeys)
                    slotLastKey = change.primaryKey
                }
            }
        }
        if let currentKey { work[currentKey] = row }
        if let slot { logKeys[slot, default: []].append(contentsOf: slotKeys) }

        var refused: Set<RowKey> = []
        for rowKey in order {
            guard let row = work[rowKey], row.original != row.state else { continue }
            if try !write(row) { refused.insert(rowKey) }
        }
        if !refused.isEmpty {
            // Rows a CHECK here refuses (declared differently on the device that wrote them): their changes are held
            // like values this database would store otherwise, and the row stays as it was.
            let refusedChanges = changes.filter { change in
                capture.tableNumbers[change.table].map { refused.contains(RowKey(table: $0, key: change.primaryKey)) }
                    ?? false
            }
            toHold += refusedChanges
            report.applied = max(0, report.applied - refusedChanges.count)
            for rowKey in refused {
                options.logger.warning(
                    "a CHECK constraint here refuses a row a peer wrote: its changes are held",
                    metadata: ["table": "\(capture.tables[rowKey.table].name)"]
                )
            }
        }
        for (slot, keys) in logKeys { try appendLog(dot: slot.dot, table: slot.table, hlc: slot.hlc, keys: keys) }
        let (kept, known) = try hold(toHold, logging: !replaying)
        report.applied += kept
        report.alreadyKnown += known
        // A peer's schema change among them is made here now, and the values held for it merged.
        if !replaying, changes.contains(where: { $0.table == Self.schemaTable }), try executeSchemaRecords() {
            try replayHeldInTransaction()
        }
        if since != nil || !claim.isEmpty {
            let upsert = try statement(
                "INSERT INTO shoal_claims(site, seq) VALUES (?, ?) "
                    + "ON CONFLICT(site) DO UPDATE SET seq = max(seq, excluded.seq)"
            )
            // A site some of whose changes a fence left out takes no claim from them: a sender sends only what still
            // has an effect, so what its transactions within the fence lost to the ones beyond never came. Nor do the
            // changes of earlier batches prove anything of such a site (its fence gap): a fence may have left out
            // some of theirs.
            let gaps = carried.isEmpty ? [:] : try fenceGaps()
            let proving = carried.filter { fenced[$0.key] == nil && gaps[$0.key] == nil }
            let highest = Self.highestSeqs(accepted).merging(proving) { max($0, $1) }
            let withheld = Set(fenced.keys).union(refusals.keys)
            let claimable = fenced.isEmpty ? claim : VersionVector(claim.entries.filter { fenced[$0.key] == nil })
            for (site, seq) in Self.claimed(
                claimable, highest: highest, held: held, completing: completing, withheld: withheld
            ).entries
            where site != siteID && seq > held[site] {
                try upsert.bind([.integer(Int64(sites.index(of: site))), .integer(Int64(bitPattern: seq))])
                try upsert.run()
            }
            try persistNewSites()
        }
        let raiseHigh = try statement("UPDATE shoal_meta SET value = max(value, ?) WHERE key = 'hlc_high'")
        try raiseHigh.bind([.integer(maxHLC)])
        try raiseHigh.run()
        try? hybridClock.observe(HLC(rawValue: UInt64(bitPattern: maxHLC)), now: options.clock.nowMilliseconds())
        report.clockRefusals = refusals
        report.fenced = fenced
        report.acceptedHighest = Self.highestSeqs(accepted)
        if !conflicts.isEmpty {
            try record(conflicts)
            report.conflicts = conflicts.count
            for conflict in conflicts { report.conflictsByTable[conflict.table, default: 0] += 1 }
        }
        return report
    }

    /// Leaves out, per site, every change from the first whose clock is further ahead of local time than the drift
    /// bound (a site's clocks only grow with its seq): one node whose clock ran ahead holds back only its own
    /// changes, never the other sites' a peer forwards in the same batch. What is left out is not claimed
    /// (``provenClaim(_:highest:held:)`` takes a site only as far as its applied changes), so it comes again once
    /// local time has caught up. Logged once per site and apply.
    private func setAsideFutureClocks(_ changes: [Change]) -> (accepted: [Change], refused: [SiteID: HLC]) {
        let now = options.clock.nowMilliseconds()
        var firstRefused: [SiteID: UInt64] = [:]
        var refused: [SiteID: HLC] = [:]
        for change in changes where !hybridClock.accepts(change.stamp.hlc, now: now) {
            let site = change.stamp.site
            firstRefused[site] = min(firstRefused[site] ?? .max, change.stamp.seq)
            refused[site] = max(refused[site] ?? change.stamp.hlc, change.stamp.hlc)
        }
        guard !refused.isEmpty else { return (changes, [:]) }
        for (site, hlc) in refused {
            options.logger.warning(
                "refused the changes of one site: its clock is too far ahead",
                metadata: [
                    "site": "\(site.hex)", "hlc": "\(hlc)", "ahead_ms": "\(Int64(hlc.milliseconds) - Int64(now))",
                    "bound_ms": "\(options.maximumClockDriftMilliseconds)",
                ]
            )
        }
        let accepted = changes.filter { change in
            firstRefused[change.stamp.site].map { change.stamp.seq < $0 } ?? true
        }
        return (accepted, refused)
    }

    /// The part of `claim` that the changes themselves prove, given what is `held`.
    ///
    /// A version vector may only advance to what was received and checked: for each site, the claim is taken
    /// up to the highest of what this database already holds and the highest seq of that site among the
    /// changes received (a sender only sends dots its own vector covers, and sends every one that still has
    /// an effect, so the dots below a received one are received, held, or overwritten by what was received).
    /// Anything above is clipped, never trusted: a raised claim cannot make this database skip changes it
    /// never received. A site whose newest transactions were all overwritten before they were sent stays
    /// lower here until that site writes again; nothing of it is missing (what it wrote was overwritten by
    /// changes this database holds), and later exchanges still deliver everything.
    static func provenClaim(_ claim: VersionVector, changes: [Change], held: VersionVector) -> VersionVector {
        provenClaim(claim, highest: highestSeqs(changes), held: held)
    }

    /// What this database takes of `claim`: the part the changes prove (``provenClaim(_:highest:held:)``), or, once a
    /// whole answer was applied with nothing withheld (`completing`), the claim itself for every site not `withheld`.
    ///
    /// A sender answers with every dot its cut covers that still has an effect and this database lacks; the dots it
    /// leaves out were overwritten by ones it sends or this database holds (compaction dropped them), and its last
    /// batch claims them only once everything that may have overwritten them was sent (``DeltaCursor``). So when a
    /// live answer arrived whole, from a member over an authenticated link, this database holds the effect of
    /// everything its claim covers, including a site whose newest transactions were all overwritten before they were
    /// sent: claimed here too, the vectors become equal instead of leaving that site lower until it writes again.
    /// A site some of whose changes were fenced or refused for their clock keeps the proven part only, so they are
    /// asked again. A stream file (``apply(chunks:claim:since:)``) and a relay range never complete: anyone may
    /// have edited a file, and a relay range covers one site.
    static func claimed(
        _ claim: VersionVector,
        highest: [SiteID: UInt64],
        held: VersionVector,
        completing: Bool,
        withheld: Set<SiteID> = []
    ) -> VersionVector {
        let proven = provenClaim(claim, highest: highest, held: held)
        guard completing else { return proven }
        var taken = proven
        for (site, claimed) in claim.entries where !withheld.contains(site) { taken.advance(site, to: claimed) }
        return taken
    }

    /// ``provenClaim(_:changes:held:)`` given the highest seq per site of the changes received.
    static func provenClaim(_ claim: VersionVector, highest: [SiteID: UInt64], held: VersionVector) -> VersionVector {
        var proven = VersionVector()
        for (site, claimed) in claim.entries {
            proven.advance(site, to: min(claimed, max(held[site], highest[site] ?? 0)))
        }
        return proven
    }

    /// The highest seq of each site among `changes`.
    static func highestSeqs(_ changes: [Change]) -> [SiteID: UInt64] {
        var highest: [SiteID: UInt64] = [:]
        var site: SiteID?
        var seq: UInt64 = 0
        for change in changes {
            // Changes come grouped by site: fold runs without a dictionary lookup per change.
            if change.stamp.site != site {
                if let site { highest[site] = max(highest[site] ?? 0, seq) }
                site = change.stamp.site
                seq = 0
            }
            seq = max(seq, change.stamp.seq)
        }
        if let site { highest[site] = max(highest[site] ?? 0, seq) }
        return highest
    }

    /// Records a conflict when an incoming column write met a concurrent one with a different value:
    /// written on another site, and neither write overwrote the other directly.
    private func noteConflict(
        _ change: Change,
        column name: String,
        incoming: SQLValue,
        local: Stamp,
        localPrevious: Dot?,
        winner: ConflictRecord.Winner,
        row: inout RowWork,
        index: Int,
        table: ReplicatedTable,
        into conflicts: inout [ConflictRecord]
    ) throws(ShoalError) {
        guard local.site != change.stamp.site, change.previous != local.dot, localPrevious != change.dot else { return }
        let localValue = try currentValue(&row, column: index, table: table)
        guard localValue != incoming else { return }
        conflicts.append(
            ConflictRecord(
                table: table.name,
                primaryKey: change.primaryKey,
                column: name,
                localValue: localValue,
                localStamp: local,
                remoteValue: incoming,
                remoteStamp: change.stamp,
                winner: winner
            )
        )
    }

    /// The value a cell holds now: won earlier in this apply, or as stored.
    private func currentValue(_ row: inout RowWork, column: Int, table: ReplicatedTable) throws(ShoalError) -> SQLValue
    {
        if let value = row.values[column] { return value }
        if row.storedValues == nil {
            let select = try clockStatements(table).selectRow
            try select.bind(row.key)
            row.storedValues =
                try select.step()
                ? (1...table.columns.count).map { select.column($0) }
                : Array(repeating: .null, count: table.columns.count)
            select.reset()
        }
        return row.storedValues![column]
    }

    /// Writes a merged row: its metadata, and the data row as the merge left it.
    /// Writes `row`'s merged values and metadata; `false` (and nothing written) when a CHECK constraint of this
    /// database refuses its values.
    private func write(_ row: RowWork) throws(ShoalError) -> Bool {
        let table = capture.tables[row.table]
        do throws(ShoalError) {
            try writeValues(row, table: table)
        } catch {
            // SQLITE_CONSTRAINT_CHECK: the statement failed whole, and left the row as it was.
            guard error.sqlite?.extendedResultCode == 19 | (1 << 8) else { throw error }
            return false
        }
        try saveState(row.state, table: table, key: row.key)
        return true
    }

    private func writeValues(_ row: RowWork, table: ReplicatedTable) throws(ShoalError) {
        let wasAlive = row.original?.isAlive ?? false
        if !row.state.isAlive {
            if wasAlive {
                let delete = try clockStatements(table).deleteRow
                try delete.bind(row.key)
                try delete.run()
            }
            return
        }
        var written: [Int] = []
        var values: [SQLValue] = []
        written.reserveCapacity(table.columns.count)
        values.reserveCapacity(table.columns.count)
        for index in table.columns.indices {
            if table.isCounter[index] {
                guard row.countersChanged[index] else { continue }
                values.append(.integer(row.state.counterValue(index)))
            } else {
                guard let value = row.values[index] else { continue }
                values.append(value)
            }
            written.append(index)
        }
        if wasAlive && !row.lifeChanged {
            guard !written.isEmpty else { return }
            let update = try dataStatement(table: table, columns: written, update: true) {
                "UPDATE \(table.quotedName) SET \(written.map { "\(table.quotedColumns[$0]) = ?" }.joined(separator: ", ")) "
                    + "WHERE \(table.dataKeyPredicate)"
            }
            try update.bind(values + row.key)
            try update.run()
            return
        }
        let insert = try dataStatement(table: table, columns: written, update: false) {
            let columns = table.keyColumns.map(quote) + written.map { table.quotedColumns[$0] }
            let marks = Array(repeating: "?", count: columns.count).joined(separator: ", ")
            return "INSERT OR REPLACE INTO \(table.quotedName)(\(columns.joined(separator: ", "))) VALUES (\(marks))"
        }
        guard wasAlive else {
            try insert.bind(row.key + values)
            try insert.run()
            return
        }
        // A row revived over a live one: deleted first (the columns not written go back to their defaults), in a
        // savepoint, so that an insert a CHECK refuses leaves the row as it was.
        try connection.exec("SAVEPOINT shoal_revive")
        do throws(ShoalError) {
            let delete = try clockStatements(table).deleteRow
            try delete.bind(row.key)
            try delete.run()
            try insert.bind(row.key + values)
            try insert.run()
            try connection.exec("RELEASE shoal_revive")
        } catch {
            try? connection.exec("ROLLBACK TO shoal_revive")
            try? connection.exec("RELEASE shoal_revive")
            throw error
        }
    }

    /// The INSERT or UPDATE of a table for one set of columns (their indexes among its non-key columns), prepared
    /// once.
    private func dataStatement(
        table: ReplicatedTable,
        columns: [Int],
        update: Bool,
        sql: () -> String
    ) throws(ShoalError) -> SQLiteStatement {
        let key = DataStatementKey(table: table.id, update: update, columns: columns)
        if let cached = dataStatements[key] { return cached }
        let prepared = try connection.prepare(sql())
        dataStatements[key] = prepared
        return prepared
    }
}

/// One change-log row being built: a transaction's rows in one table.
private struct LogSlot: Hashable {
    let dot: Dot
    let table: Int64
    let hlc: HLC
}

/// Identifies a cached data-table statement.
struct DataStatementKey: Hashable {
    let table: Int64
    let update: Bool
    /// The columns written, by index among the table's non-key columns.
    let columns: [Int]
}
