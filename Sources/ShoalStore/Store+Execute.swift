import CSQLite
import ShoalCore

/// A statement prepared once and run many times through the store, with change capture.
public final class PreparedStatement {
    private let store: Store
    private let statement: SQLiteStatement
    private let control: TransactionControl?
    private let columns: [String]
    /// Whether the statement can only store values as large as its SQL text or its arguments.
    private let copiesItsInputs: Bool

    init(store: Store, statement: SQLiteStatement, copiesItsInputs: Bool) {
        self.store = store
        self.statement = statement
        self.control = TransactionControl(sql: statement.sql)
        self.columns = (0..<statement.columnCount).map(statement.columnName)
        self.copiesItsInputs = copiesItsInputs
    }

    /// Runs the statement with `arguments` and returns its rows.
    @discardableResult
    public func execute(_ arguments: [SQLValue] = []) throws(ShoalError) -> QueryResult {
        try statement.bind(arguments)
        let checkSizes = !store.valueSizesBounded(copiesItsInputs, arguments: arguments)
        return QueryResult(columns: columns, rows: try store.run(statement, control: control, checkSizes: checkSizes))
    }
}

/// How a statement affects the transaction, which decides when captured changes are written.
enum TransactionControl {
    case begin, commit, savepoint, release, rollback, rollbackTo

    /// Reads the statement's leading keyword(s), skipping whitespace and comments.
    init?(sql: String) {
        var words: [String] = []
        var scalars = Substring(sql).unicodeScalars[...]
        while words.count < 3, let first = scalars.first {
            if first.properties.isWhitespace || first == ";" {
                scalars = scalars.dropFirst()
            } else if scalars.starts(with: "--".unicodeScalars) {
                scalars = scalars.drop { $0 != "\n" }
            } else if scalars.starts(with: "/*".unicodeScalars) {
                scalars = scalars.dropFirst(2)
                while !scalars.isEmpty && !scalars.starts(with: "*/".unicodeScalars) { scalars = scalars.dropFirst() }
                scalars = scalars.dropFirst(2)
            } else if first.properties.isAlphabetic {
                let word = scalars.prefix { $0.properties.isAlphabetic || $0 == "_" }
                words.append(String(String.UnicodeScalarView(word)).uppercased())
                scalars = scalars.dropFirst(word.count)
            } else {
                break
            }
        }
        switch words.first {
        case "BEGIN": self = .begin
        case "COMMIT", "END": self = .commit
        case "SAVEPOINT": self = .savepoint
        case "RELEASE": self = .release
        case "ROLLBACK": self = words.dropFirst().contains("TO") ? .rollbackTo : .rollback
        default: return nil
        }
    }
}

extension Store {
    /// Runs one or more SQL statements and returns the rows of the last one.
    ///
    /// `arguments` bind to `?` parameters and are allowed only when `sql` holds a single statement. A write
    /// outside an explicit transaction is its own transaction, as in SQLite.
    @discardableResult
    public func execute(_ sql: String, _ arguments: [SQLValue] = []) throws(ShoalError) -> QueryResult {
        try refreshSchemaIfIdle()
        var result = QueryResult(columns: [], rows: [])
        var statementCount = 0
        var remaining = Array(sql.utf8CString)
        var offset = 0
        while offset < remaining.count - 1 {
            var handle: OpaquePointer?
            var tail: UnsafePointer<CChar>?
            preparingUserStatement = true
            userStatementComputesValues = false
            authorizerDenial = nil
            addingColumn = Self.addsColumn(remaining[offset..<min(offset + 512, remaining.count - 1)])
            defer { addingColumn = false }
            let code = remaining.withUnsafeBufferPointer { buffer in
                sqlite3_prepare_v2(connection.handle, buffer.baseAddress! + offset, -1, &handle, &tail)
            }
            preparingUserStatement = false
            if addingColumn, code == SQLITE_OK, !connection.isAutocommit {
                sqlite3_finalize(handle)
                throw ShoalError(
                    code: .invalidArgument,
                    message: "add columns to a replicated table outside of an explicit transaction (the change "
                        + "replicates as a transaction of its own); nothing was changed"
                )
            }
            if code != SQLITE_OK {
                if let denial = authorizerDenial { throw ShoalError(code: .unsupportedSchema, message: denial) }
                // The statement that failed is what follows the last one prepared (SQLite cannot say where it ends).
                let failed = String(decoding: remaining[offset..<(remaining.count - 1)].map { UInt8(bitPattern: $0) }, as: UTF8.self)
                throw connection.error(code, statement: failed.trimmingPrefix(while: \.isWhitespace).description)
            }
            let consumed = remaining.withUnsafeBufferPointer { buffer in
                tail.map { $0 - buffer.baseAddress! } ?? (buffer.count - 1)
            }
            offset = consumed
            guard let handle else { continue }
            let statement = SQLiteStatement(handle, connection: connection)
            statementCount += 1
            if !arguments.isEmpty {
                guard statementCount == 1, remaining[offset...].allSatisfy({ $0 == 0 || isSpaceOrSemicolon($0) })
                else {
                    throw ShoalError(code: .invalidArgument, message: "parameters need a single SQL statement")
                }
                try statement.bind(arguments)
            }
            let checkSizes = !valueSizesBounded(copiesInputs(statement), arguments: arguments)
            let altered = addingColumn
            let rows = try run(statement, control: TransactionControl(sql: statement.sql), checkSizes: checkSizes)
            result = QueryResult(columns: (0..<statement.columnCount).map(statement.columnName), rows: rows)
            // A column added: replicated now, and the statements after it capture it.
            if altered { try adoptSchemaChanges() }
        }
        remaining.removeAll()
        return result
    }

    /// Whether a statement's start reads `ALTER TABLE name ADD`.
    static func addsColumn(_ start: ArraySlice<CChar>) -> Bool {
        let text = String(decoding: start.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let words = SQLText.tokenize(text).prefix(6).compactMap { token -> String? in
            switch token.kind {
            case .word(let word): word.uppercased()
            case .quotedIdentifier, .string: "NAME"
            case .symbol(let symbol): symbol == "." ? "." : nil
            }
        }
        guard words.count >= 4, words[0] == "ALTER", words[1] == "TABLE" else { return false }
        // ALTER TABLE name ADD, or ALTER TABLE schema . name ADD
        return words[3] == "ADD" || (words.count >= 6 && words[3] == "." && words[5] == "ADD")
    }

    private func isSpaceOrSemicolon(_ character: CChar) -> Bool {
        character == 32 || character == 9 || character == 10 || character == 13 || character == 59
    }

    /// Prepares one statement to run many times (bulk writes bind and run it in a loop).
    public func prepare(_ sql: String) throws(ShoalError) -> PreparedStatement {
        try refreshSchemaIfIdle()
        let statement = try prepareUser(sql)
        return PreparedStatement(store: self, statement: statement, copiesItsInputs: copiesInputs(statement))
    }

    /// Whether a just-prepared user statement only copies its inputs into the rows it writes: it calls no
    /// function, reads no column and concatenates nothing, so no value it stores is longer than its SQL
    /// text or one of its arguments.
    private func copiesInputs(_ statement: SQLiteStatement) -> Bool {
        let sql = statement.sql
        return !userStatementComputesValues && !sql.contains("||") && sql.utf8.count <= Self.maximumValueBytes
    }

    /// Whether the values a statement stores cannot exceed ``maximumValueBytes``, so the pre-update hook
    /// may skip its per-row size check (reading a new row's values in the hook makes SQLite unpack the
    /// record, about a tenth of the cost of a bulk insert). Users' triggers may compute anything, so with
    /// them every row is checked.
    func valueSizesBounded(_ copiesItsInputs: Bool, arguments: [SQLValue]) -> Bool {
        guard copiesItsInputs, !triggersEnabled else { return false }
        return arguments.allSatisfy { argument in
            switch argument {
            case .text(let text): text.utf8.count <= Self.maximumValueBytes
            case .blob(let bytes): bytes.count <= Self.maximumValueBytes
            default: true
            }
        }
    }

    /// Runs `body` in one transaction: every write in it is one change, committed together or not at all.
    public func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let value = try body()
            try execute("COMMIT")
            return value
        } catch {
            if !connection.isAutocommit { _ = try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Reads the schema again before a statement, unless this transaction already captured writes: a transaction
    /// opened with a deferred BEGIN takes its snapshot at its first statement, and another process may have added a
    /// column just before; once it captured writes, its snapshot is fixed, and no other process's schema change can
    /// show in it (SQLite refuses to let it write over a newer one).
    private func refreshSchemaIfIdle() throws(ShoalError) {
        if connection.isAutocommit || !capture.hasUncommittedWork { try refreshSchema() }
    }

    /// Runs one user statement with capture: flushes captured writes before anything that may end the
    /// transaction, and wraps a lone write in a transaction of its own so its metadata commits with it.
    func run(
        _ statement: SQLiteStatement,
        control: TransactionControl?,
        checkSizes: Bool = true
    ) throws(ShoalError) -> [[SQLValue]] {
        capture.checkSizes = checkSizes
        defer { capture.checkSizes = true }
        switch control {
        case .commit, .savepoint, .release:
            try flushCaptured()
        case .rollback, .rollbackTo:
            capture.discardPending()
        case .begin, nil:
            break
        }
        let wrap = control == nil && connection.isAutocommit && !statement.isReadOnly
        if wrap {
            try connection.exec("BEGIN IMMEDIATE")
            // Holding the write lock, no other process can change the schema now: capture by its current shape.
            try refreshSchema()
        }
        var rows: [[SQLValue]] = []
        do throws(ShoalError) {
            defer { statement.reset() }
            while try statement.step() { rows.append(statement.row()) }
            if userTriggerCreated {
                userTriggerCreated = false
                setTriggers(enabled: true)
            }
            if let refusal = capture.refusal { throw refusal }
            capture.statementSucceeded()
            if control == .rollbackTo { try afterRollbackToSavepoint() }
            if wrap {
                try flushCaptured()
                try connection.exec("COMMIT")
            }
        } catch {
            let refusal = capture.refusal ?? refusalRaisedByTrigger()
            capture.refusal = nil
            capture.statementFailed()
            if wrap && !connection.isAutocommit {
                try? connection.exec("ROLLBACK")
            } else if let refusal, !connection.isAutocommit {
                // The hook saw the rows after SQLite stored them; only undoing the transaction takes them back
                // (and a trigger's refusal is treated the same, so the rule does not depend on which caught it).
                try? connection.exec("ROLLBACK")
                endTransaction()
                throw ShoalError(
                    code: refusal.code,
                    message: refusal.message + "; the open transaction was rolled back"
                )
            }
            if connection.isAutocommit { endTransaction() }
            throw refusal ?? error
        }
        if connection.isAutocommit { endTransaction() }
        return rows
    }

    /// The typed error for a statement that one of Shoal's triggers aborted (a counter column given a
    /// non-integer, or, on other connections, an oversized value), read from SQLite's last error
    /// (`SQLITE_CONSTRAINT_TRIGGER`, a macro Swift does not import).
    func refusalRaisedByTrigger() -> ShoalError? {
        guard sqlite3_extended_errcode(connection.handle) == SQLITE_CONSTRAINT | (7 << 8) else { return nil }
        let message = String(cString: sqlite3_errmsg(connection.handle))
        let prefix = "shoal: "
        guard message.hasPrefix(prefix) else { return nil }
        let text = String(message.dropFirst(prefix.count))
        return ShoalError(code: text.hasPrefix("counter") ? .counterNotInteger : .valueTooLarge, message: text)
    }

    /// After `ROLLBACK TO` a savepoint: what the rolled-back part stamped may be undone with it. The outbox's writes a
    /// flush there stamped are back in the outbox (the next flush drains it again), and the transaction's stamp is
    /// kept only if its change log rows are still there (it was taken before the savepoint), so its writes stay one
    /// change set, and the next one never skips a number.
    private func afterRollbackToSavepoint() throws(ShoalError) {
        forgetUndoneWork()
        guard let stamp = transactionStamp else { return }
        let kept = try connection.scalar(
            "SELECT EXISTS(SELECT 1 FROM shoal_log WHERE site = ? AND seq = ?)",
            [.integer(ownSiteIndex), .integer(Int64(bitPattern: stamp.seq))]
        )
        if kept.integerValue != 1 { transactionStamp = nil }
    }

    /// What a rollback (whole or to a savepoint) may have undone: the found writes' time, that the outbox was drained,
    /// sites allocated since the table was read (SQL cannot run here: the rollback hook calls this too).
    func forgetUndoneWork() {
        foreignWriteTime = nil
        outboxCheckedAt = nil
        if sites.allocatedSinceLoad { sitesNeedReload = true }
    }

    func endTransaction() {
        capture.discardPending()
        transactionStamp = nil
        foreignWriteTime = nil
    }

    /// The stamp of the open transaction's local changes: the next sequence number, and a clock after
    /// everything this node has written or observed.
    private func localStamp() throws(ShoalError) -> Stamp {
        if let transactionStamp { return transactionStamp }
        let last = try statement("SELECT seq, hlc FROM shoal_log WHERE site = ? ORDER BY seq DESC LIMIT 1")
        try last.bind([.integer(ownSiteIndex)])
        var seq: UInt64 = 1
        var latest = HLC.zero
        if try last.step() {
            seq = UInt64(last.columnInt64(0)) + 1
            latest = HLC(rawValue: UInt64(bitPattern: last.columnInt64(1)))
        }
        last.reset()
        // The newest clock received from any peer.
        let high = try statement("SELECT value FROM shoal_meta WHERE key = 'hlc_high'")
        var remoteHigh = HLC.zero
        if try high.step() {
            remoteHigh = HLC(rawValue: UInt64(bitPattern: high.columnInt64(0)))
            if remoteHigh > latest { latest = remoteHigh }
        }
        high.reset()
        if hybridClock.latest > latest { latest = hybridClock.latest }
        let now = physicalTime(corroboratedBy: remoteHigh)
        if latest.milliseconds > now + options.maximumClockDriftMilliseconds {
            // An earlier write was stamped while this machine's clock ran ahead: a site's clock never goes back (its
            // own later writes must win over its earlier ones), so peers refuse this node's changes (only its own)
            // until time catches up. Said once per process, loudly.
            if !warnedClockAhead {
                warnedClockAhead = true
                options.logger.error(
                    """
                    this database's clock is ahead of this machine's: an earlier write was stamped while the clock \
                    ran ahead; peers refuse this node's own changes until time catches up
                    """,
                    metadata: [
                        "ahead_ms": "\(latest.milliseconds - now)",
                        "bound_ms": "\(options.maximumClockDriftMilliseconds)",
                    ]
                )
            }
        } else {
            warnedClockAhead = false
        }
        hybridClock = HybridClock(latest: latest, maximumDriftMilliseconds: options.maximumClockDriftMilliseconds)
        // Other connections' writes found only now (made while no node ran, or in a file copied or restored since)
        // are stamped at the time they were made, so that a peer's write made in between still wins over them; never
        // later than now (a writer's clock that ran ahead), and never before what this file had seen by then:
        // `latest` holds every clock applied before them (every apply stamps the outbox first), so the stamp still
        // follows whatever the writer could have read.
        let made = foreignWriteTime.map { min(now, $0) } ?? now
        foreignWriteTime = nil
        let stamp = Stamp(hlc: hybridClock.tick(now: made), site: siteID, seq: seq)
        transactionStamp = stamp
        return stamp
    }

    /// The wall clock's reading for a local write, unless it jumped forward since this store last stamped beyond
    /// what the monotonic clock says elapsed (a clock set wrong, an NTP step) by more than the drift bound, with no
    /// peer's clock to back it: then the time the monotonic clock says it is, and an error logged once. A write
    /// stamped a day ahead would be refused by every peer, and every later write of this node stamped after it.
    /// And while the clock runs ahead of every peer's by more than the drift bound (``notePeerClock(_:from:)``: it may have
    /// started that way, with no earlier reading to compare with), the most advanced peer's time, with an error
    /// logged once.
    func physicalTime(corroboratedBy remote: HLC) -> UInt64 {
        let now = options.clock.nowMilliseconds()
        let steady = options.clock.monotonicMilliseconds()
        let bound = Int64(options.maximumClockDriftMilliseconds)
        if let peerNow = peerClockNow(), now > peerNow + UInt64(bound) {
            if !warnedAheadOfPeers {
                warnedAheadOfPeers = true
                options.logger.error(
                    "this machine's clock is ahead of its peers': local writes are stamped with their time; set it right",
                    metadata: ["ahead_ms": "\(now - peerNow)", "bound_ms": "\(bound)"]
                )
            }
            // Carried on by the monotonic clock once the peers' readings stop coming.
            clockReference = (peerNow, steady)
            return peerNow
        }
        warnedAheadOfPeers = false
        guard let reference = clockReference else {
            clockReference = (now, steady)
            return now
        }
        let expected = Int64(reference.wall) + (Int64(steady) - Int64(reference.steady))
        guard Int64(now) > expected + bound, Int64(remote.milliseconds) < Int64(now) - bound else {
            clockReference = (now, steady)
            warnedClockJump = false
            return now
        }
        if !warnedClockJump {
            warnedClockJump = true
            options.logger.error(
                "the wall clock jumped ahead: local writes are stamped with the time elapsed since, not with it",
                metadata: [
                    "jumped_ms": "\(Int64(now) - expected)", "bound_ms": "\(bound)",
                ]
            )
        }
        return UInt64(max(0, expected))
    }

    /// Turns the writes captured so far in this transaction into metadata: clock rows and the change log.
    ///
    /// All or nothing: inside a savepoint of its own, so a failure part-way (a full disk, an outbox row no trigger
    /// wrote) undoes what it wrote and drained, and the captured writes wait as they were. A retried COMMIT then
    /// flushes them again, or fails again; it never commits writes without their metadata.
    func flushCaptured() throws(ShoalError) {
        guard !connection.isAutocommit else {
            capture.discardPending()
            return
        }
        guard capture.hasPendingWrites else { return }
        let captured = capture.savedPending()
        let stamp = transactionStamp
        try connection.exec("SAVEPOINT shoal_flush")
        do throws(ShoalError) {
            try flushCapturedWrites()
            try connection.exec("RELEASE shoal_flush")
        } catch {
            try? connection.exec("ROLLBACK TO shoal_flush")
            try? connection.exec("RELEASE shoal_flush")
            capture.discardPending()
            capture.restorePending(captured)
            transactionStamp = stamp
            forgetUndoneWork()
            throw error
        }
    }

    /// ``flushCaptured()``'s work, inside its savepoint.
    private func flushCapturedWrites() throws(ShoalError) {
        // Foreign writes committed before this transaction took its write lock come first: a transaction of their own,
        // stamped when they were made (``localStamp()``), unless this one is stamped already; then they join it.
        if capture.hasPendingWrites, try outboxMayHoldRows() {
            if transactionStamp == nil {
                let own = capture.takePending()
                try stampForeignWrites()
                capture.restorePending(own)
            } else {
                try drainOutbox()
            }
        }
        let pending = capture.takePending()
        guard !pending.isEmpty else { return }
        try refreshSites()
        let stamp = try localStamp()
        let wasSuspended = capture.isSuspended
        capture.isSuspended = true
        defer { capture.isSuspended = wasSuspended }
        var logKeys: [Int: [UInt8]] = [:]
        for (tableNumber, pendingTable) in pending.enumerated() where !pendingTable.isEmpty {
            let table = capture.tables[tableNumber]
            committedTables.insert(table.name)
            var keys: [UInt8] = []
            // A brand-new row of a table without counters gets the same metadata as every other: encode it once.
            var freshTemplate: [UInt8]?
            // A row new to this node starts its life above every tombstone collected in the table (see
            // ``causalLengthFloor(_:)``): nodes that still keep one for its key must take the row. Read at the first
            // such row, not for every write.
            var knownFloor: UInt64?
            func floor() throws(ShoalError) -> UInt64 {
                if let knownFloor { return knownFloor }
                let read = try causalLengthFloor(table.name)
                knownFloor = read
                return read
            }
            var fresh: [PendingKey] = []
            var general: [(key: PendingKey, write: PendingWrite)] = []
            func addFresh(_ pendingKey: PendingKey) throws(ShoalError) {
                if freshTemplate == nil {
                    var state = RowState(columnCount: table.columns.count)
                    state.causalLength = try floor()
                    state.recordLocalWrite(
                        existedBefore: false,
                        existsAfter: true,
                        changed: table.allChanged,
                        counterDelta: table.noDelta,
                        isCounter: table.isCounter,
                        stamp: stamp
                    )
                    freshTemplate = state.encoded(sites: &sites)
                    try persistNewSites()
                }
                fresh.append(pendingKey)
                guard fresh.count == Self.freshBatchSize else { return }
                let existing = try insertStates(freshTemplate!, table: table, keys: fresh)
                for key in fresh where !existing.contains(key) { appendLogKey(key, to: &keys) }
                general += existing.map { ($0, PendingWrite.freshInsert) }
                fresh.removeAll(keepingCapacity: true)
            }
            for rowid in pendingTable.freshRowids { try addFresh(.rowid(rowid)) }
            for (pendingKey, write) in pendingTable.rows {
                guard !write.existedBefore && write.existsAfter && !table.hasCounters else {
                    general.append((pendingKey, write))
                    continue
                }
                try addFresh(pendingKey)
            }
            for pendingKey in fresh {
                if try insertState(freshTemplate!, table: table, key: pendingKey) {
                    appendLogKey(pendingKey, to: &keys)
                } else {
                    general.append((pendingKey, PendingWrite.freshInsert))
                }
            }
            for (pendingKey, write) in general {
                let key = pendingKey.values
                let stored = try loadState(table: table, key: key)
                var state = stored ?? RowState(columnCount: table.columns.count)
                if stored == nil, write.existsAfter { state.causalLength = try floor() }
                var existsAfter = write.existsAfter
                // A write that would start a new life must find its data row: a row another connection updated
                // and an apply since deleted (or one gone behind Shoal's back) is not brought back as NULLs.
                if existsAfter, write.fromOutbox || stored?.isAlive == false,
                    try !dataRowExists(table: table, key: key)
                {
                    existsAfter = false
                }
                let changed = state.recordLocalWrite(
                    existedBefore: write.existedBefore,
                    existsAfter: existsAfter,
                    changed: write.changed ?? table.allChanged,
                    counterDelta: write.counterDelta ?? table.noDelta,
                    isCounter: table.isCounter,
                    stamp: stamp
                )
                guard changed else { continue }
                try saveState(state, table: table, key: key)
                if table.hasCounters && state.isAlive { try normalizeCounters(table: table, key: key, state: state) }
                appendLogKey(pendingKey, to: &keys)
            }
            if !keys.isEmpty { logKeys[tableNumber] = keys }
        }
        for (number, keys) in logKeys {
            try appendLog(dot: stamp.dot, table: capture.tables[number].id, hlc: stamp.hlc, keys: keys)
        }
        if !logKeys.isEmpty { committedDots.insert(stamp.dot) }
    }

    /// Whether table `table` holds a data row with primary key `key`.
    func dataRowExists(table: ReplicatedTable, key: [SQLValue]) throws(ShoalError) -> Bool {
        let select = try statement(table.rowExistsSQL)
        try select.bind(key)
        defer { select.reset() }
        return try select.step()
    }

    /// Counter columns hold the sum of every site's contribution; rewrite a value that is not that integer.
    private func normalizeCounters(table: ReplicatedTable, key: [SQLValue], state: RowState) throws(ShoalError) {
        let counters = table.columns.indices.filter { table.isCounter[$0] }
        let select = try statement(
            "SELECT \(counters.map { quote(table.columns[$0]) }.joined(separator: ", ")) FROM \(quote(table.name)) "
                + "WHERE \(table.dataKeyPredicate)"
        )
        try select.bind(key)
        guard try select.step() else { return }
        let current = select.row()
        select.reset()
        for (position, index) in counters.enumerated() where current[position] != .integer(state.counterValue(index)) {
            let update = try statement(
                "UPDATE \(quote(table.name)) SET \(quote(table.columns[index])) = ? WHERE \(table.dataKeyPredicate)"
            )
            try update.bind([.integer(state.counterValue(index))] + key)
            try update.run()
        }
    }
}
