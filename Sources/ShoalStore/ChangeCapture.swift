import CSQLite
import ShoalCore

#if canImport(Glibc)
import Glibc
#endif

/// Collects the row changes SQLite reports through its pre-update hook.
///
/// Events of the running statement are kept apart until it succeeds (a failed statement is undone by
/// SQLite, so its events are dropped); then they fold into one net ``PendingWrite`` per row, which the
/// store turns into metadata before the transaction commits.
final class ChangeCapture {
    /// Replicated tables, by name.
    var tableNumbers: [String: Int] = [:]
    var tables: [ReplicatedTable] = []
    /// Set while the store applies remote changes or writes its own metadata: nothing is captured.
    var isSuspended = false
    private(set) var statementEvents: [CapturedEvent] = []
    /// The running statement's only event so far, when it is an insert into a table whose key is the rowid and that
    /// has no counters (most statements of a bulk insert): kept bare, not as a ``CapturedEvent``.
    private var soleInsert: (table: Int, rowid: Int64)?
    /// A write of the running statement that cannot be replicated (a value over the size maximum); the
    /// store fails the statement with it.
    var refusal: ShoalError?
    /// Whether the running statement's new values need the size check (see
    /// ``Store/valueSizesBounded(_:arguments:)``); tables whose defaults are expressions are always checked.
    var checkSizes = true
    var tablesWithExpressionDefaults: Set<Int> = []
    /// Net writes per replicated table (indexed like `tables`).
    private(set) var pending: [PendingTable] = []
    private var hasPending = false

    var hasUncommittedWork: Bool { !statementEvents.isEmpty || soleInsert != nil || hasPending }
    var hasPendingWrites: Bool { hasPending }

    /// The last table name the hook saw and its number (-1: not replicated), to skip a lookup per row.
    private var lastName: [CChar] = []
    private var lastNumber = -1

    /// Per table: the positions whose new values the size check reads (every column but a rowid key).
    private var sizeCheckPositions: [[Int32]] = []
    /// Per table: whether its key is the rowid and it has no counters (an insert is noted as ``soleInsert``).
    private var rowidWithoutCounters: [Bool] = []

    func setTables(_ tables: [ReplicatedTable]) {
        self.tables = tables
        sizeCheckPositions = tables.map { ($0.keyIsRowid ? [] : $0.keyPositions) + $0.columnPositions }
        rowidWithoutCounters = tables.map { $0.keyIsRowid && !$0.hasCounters }
        soleInsert = nil
        pending = Array(repeating: PendingTable(), count: tables.count)
        hasPending = false
        lastName = []
        lastNumber = -1
        tableNumbers = Dictionary(uniqueKeysWithValues: tables.enumerated().map { ($0.element.name, $0.offset) })
    }

    /// The statement finished: keep its events.
    func statementSucceeded() {
        if let sole = soleInsert {
            soleInsert = nil
            if !pending[sole.table].appendFreshRowid(sole.rowid) {
                fold(.insert(table: sole.table, rowid: sole.rowid))
            }
            hasPending = true
            return
        }
        for event in statementEvents {
            // The common case of a bulk insert, noted without folding: a new row with the highest rowid yet.
            if event.kind == .insert, event.counterDelta == nil, case .rowid(let rowid) = event.key,
                pending[event.table].appendFreshRowid(rowid)
            {
                hasPending = true
                continue
            }
            fold(event)
        }
        statementEvents.removeAll(keepingCapacity: true)
    }

    /// The statement failed and SQLite undid it: forget its events.
    func statementFailed() {
        soleInsert = nil
        statementEvents.removeAll(keepingCapacity: true)
    }

    /// The transaction (or the part since the last savepoint boundary) was rolled back, or was flushed.
    func discardPending() {
        soleInsert = nil
        statementEvents.removeAll(keepingCapacity: true)
        guard hasPending else { return }
        for index in pending.indices { pending[index] = PendingTable() }
        hasPending = false
    }

    /// Hands over the net writes and forgets them.
    func takePending() -> [PendingTable] {
        guard hasPending else { return [] }
        defer {
            pending = Array(repeating: PendingTable(), count: tables.count)
            hasPending = false
        }
        return pending
    }

    /// The net writes pending now, kept as they are (``restorePending(_:)`` puts them back after a failed flush).
    func savedPending() -> [PendingTable] {
        hasPending ? pending : []
    }

    /// Puts back net writes handed over by ``takePending()`` while nothing else is pending.
    func restorePending(_ taken: [PendingTable]) {
        guard !taken.isEmpty else { return }
        precondition(!hasPending, "restoring captured writes over others")
        pending = taken
        hasPending = true
    }

    /// Adds a write made on the store's own behalf (rows already in a table when it becomes replicated): by
    /// default a new row whose counters hold `counterDelta`; for a row whose metadata was kept when the table was
    /// unreplicated, whether it `existed` then, whether it `exists` now, and what its counters moved meanwhile.
    func addExistingRow(
        table: Int,
        key: [SQLValue],
        existed: Bool = false,
        exists: Bool = true,
        changed: [Bool]? = nil,
        counterDelta: [Int64]? = nil
    ) {
        let pendingKey: PendingKey = tables[table].keyIsRowid ? .rowid(key[0].integerValue ?? 0) : .values(key)
        pending[table].append(
            pendingKey,
            PendingWrite(existedBefore: existed, existsAfter: exists, changed: changed, counterDelta: counterDelta)
        )
        hasPending = true
    }

    /// Folds an event read from a table's outbox (a foreign connection's committed write).
    func foldForeign(_ event: CapturedEvent) {
        fold(event, fromOutbox: true)
    }

    /// Folds net writes that happened after those pending now (this connection's own writes, taken out so
    /// that the foreign writes that preceded them could be folded first).
    func foldAfter(_ later: [PendingTable]) {
        for (table, pendingTable) in later.enumerated() {
            var pendingTable = pendingTable
            pendingTable.materializeFreshRowids()
            for (key, write) in pendingTable.rows {
                guard let position = pending[table].position(of: key) else {
                    pending[table].append(key, write)
                    hasPending = true
                    continue
                }
                var combined = pending[table].rows[position].write
                combined.existsAfter = write.existsAfter
                // This connection's own writes came last: what they say of the row's existence is current.
                combined.fromOutbox = false
                if let changed = write.changed, let earlier = combined.changed {
                    combined.changed = zip(earlier, changed).map { $0 || $1 }
                } else if write.changed == nil {
                    combined.changed = nil
                }
                if let delta = write.counterDelta {
                    combined.counterDelta = combined.counterDelta.map { zip($0, delta).map { $0 &+ $1 } } ?? delta
                }
                pending[table].update(at: position, combined)
            }
        }
    }

    private func fold(_ event: CapturedEvent, fromOutbox: Bool = false) {
        let columnCount = tables[event.table].columns.count
        let position = pending[event.table].position(of: event.key)
        let existing = position.map { pending[event.table].rows[$0].write }
        var write =
            existing
            ?? PendingWrite(
                existedBefore: event.kind != .insert,
                existsAfter: event.kind != .insert,
                changed: event.kind == .insert ? nil : Array(repeating: false, count: columnCount),
                counterDelta: nil
            )
        switch event.kind {
        case .insert:
            write.existsAfter = true
            write.changed = nil
        case .delete:
            write.existsAfter = false
        case .update:
            write.existsAfter = true
            if let changed = event.changed, write.changed != nil {
                for (index, flag) in changed.enumerated() where flag { write.changed![index] = true }
            }
        }
        if fromOutbox { write.fromOutbox = true }
        if let delta = event.counterDelta {
            if write.counterDelta == nil {
                write.counterDelta = delta
            } else {
                for index in delta.indices { write.counterDelta![index] &+= delta[index] }
            }
        }
        if let position {
            pending[event.table].update(at: position, write)
        } else {
            pending[event.table].append(event.key, write)
            hasPending = true
        }
    }

    /// Called from the pre-update hook for every row change on the connection.
    func record(db: OpaquePointer, operation: Int32, tableName: UnsafePointer<CChar>, oldKey: Int64, newKey: Int64) {
        if isSuspended { return }
        let sameTable = lastName.withUnsafeBufferPointer { buffer in
            buffer.count > 0 && strcmp(buffer.baseAddress!, tableName) == 0
        }
        if !sameTable {
            let name = String(cString: tableName)
            lastName = Array(name.utf8CString)
            lastNumber = tableNumbers[name] ?? -1
        }
        guard lastNumber >= 0 else { return }
        let number = lastNumber
        if operation != SQLITE_DELETE, refusal == nil, checkSizes || tablesWithExpressionDefaults.contains(number),
            let position = oversizedPosition(db, number)
        {
            refusal = oversizedValue(db, tables[number], position: position)
        }
        if operation == SQLITE_INSERT, rowidWithoutCounters[number], soleInsert == nil, statementEvents.isEmpty {
            soleInsert = (number, newKey)
            return
        }
        if let sole = soleInsert {
            // A second event in the statement: the first joins the others, in order.
            soleInsert = nil
            statementEvents.append(.insert(table: sole.table, rowid: sole.rowid))
        }
        let table = tables[number]
        if operation != SQLITE_DELETE, refusal == nil, table.hasCounters { refusal = nonIntegerCounter(db, table) }
        switch operation {
        case SQLITE_INSERT:
            let key: PendingKey = table.keyIsRowid ? .rowid(newKey) : .values(values(db, table.keyPositions, new: true))
            if refusal == nil, case .values(let values) = key { refusal = table.keyRefusal(values) }
            let counters = table.hasCounters ? counterValues(db, table, new: true) : nil
            statementEvents.append(
                CapturedEvent(table: number, kind: .insert, key: key, changed: nil, counterDelta: counters)
            )
        case SQLITE_DELETE:
            let key: PendingKey =
                table.keyIsRowid ? .rowid(oldKey) : .values(values(db, table.keyPositions, new: false))
            let counters = table.hasCounters ? counterValues(db, table, new: false).map { 0 &- $0 } : nil
            statementEvents.append(
                CapturedEvent(table: number, kind: .delete, key: key, changed: nil, counterDelta: counters)
            )
        case SQLITE_UPDATE:
            let oldRowKey: PendingKey =
                table.keyIsRowid ? .rowid(oldKey) : .values(values(db, table.keyPositions, new: false))
            let newRowKey: PendingKey =
                table.keyIsRowid ? .rowid(newKey) : .values(values(db, table.keyPositions, new: true))
            if refusal == nil, case .values(let values) = newRowKey { refusal = table.keyRefusal(values) }
            let oldValues = values(db, table.columnPositions, new: false)
            let newValues = values(db, table.columnPositions, new: true)
            if oldRowKey != newRowKey {
                // A primary key update is a delete of the old key and an insert of the new one.
                let oldCounters = table.hasCounters ? counters(table, oldValues).map { 0 &- $0 } : nil
                let newCounters = table.hasCounters ? counters(table, newValues) : nil
                statementEvents.append(
                    CapturedEvent(table: number, kind: .delete, key: oldRowKey, changed: nil, counterDelta: oldCounters)
                )
                statementEvents.append(
                    CapturedEvent(table: number, kind: .insert, key: newRowKey, changed: nil, counterDelta: newCounters)
                )
                return
            }
            let changed = zip(oldValues, newValues).map { $0 != $1 }
            var delta: [Int64]?
            if table.hasCounters {
                let before = counters(table, oldValues)
                let after = counters(table, newValues)
                delta = zip(after, before).map { $0 &- $1 }
            }
            statementEvents.append(
                CapturedEvent(table: number, kind: .update, key: newRowKey, changed: changed, counterDelta: delta)
            )
        default:
            break
        }
    }

    /// The position of a new TEXT or BLOB value larger than ``Store/maximumValueBytes``, if the row has one
    /// (`sqlite3_value_bytes` is O(1): nothing is copied).
    private func oversizedPosition(_ db: OpaquePointer, _ number: Int) -> Int32? {
        let position = sizeCheckPositions[number].withUnsafeBufferPointer { positions in
            shoal_preupdate_oversized(db, positions.baseAddress, Int32(positions.count), Int64(Store.maximumValueBytes))
        }
        return position >= 0 ? position : nil
    }

    /// The refusal for the oversized value at `position`.
    private func oversizedValue(_ db: OpaquePointer, _ table: ReplicatedTable, position: Int32) -> ShoalError {
        var value: OpaquePointer?
        sqlite3_preupdate_new(db, position, &value)
        let type = sqlite3_value_type(value)
        let bytes = Int(sqlite3_value_bytes(value))
        let name =
            table.keyPositions.firstIndex(of: position).map { table.keyColumns[$0] }
            ?? table.columnPositions.firstIndex(of: position).map { table.columns[$0] } ?? "?"
        return ShoalError(
            code: .valueTooLarge,
            message: "a \(type == SQLITE_TEXT ? "TEXT" : "BLOB") value of \(bytes) bytes written to "
                + "\(table.name).\(name) is larger than the maximum of \(Store.maximumValueBytes) bytes "
                + "(256 MiB) a replicated table accepts; nothing was written"
        )
    }

    /// The refusal for a counter column given anything but an integer (SQLite turns an overflowing sum
    /// into a REAL).
    private func nonIntegerCounter(_ db: OpaquePointer, _ table: ReplicatedTable) -> ShoalError? {
        for index in table.columns.indices where table.isCounter[index] {
            var value: OpaquePointer?
            guard sqlite3_preupdate_new(db, table.columnPositions[index], &value) == SQLITE_OK, let value else {
                continue
            }
            let kind: String
            switch sqlite3_value_type(value) {
            case SQLITE_INTEGER: continue
            case SQLITE_NULL: kind = "NULL"
            case SQLITE_FLOAT: kind = "a REAL (a fraction, or a sum that overflowed 64-bit integers)"
            case SQLITE_TEXT: kind = "TEXT"
            default: kind = "a BLOB"
            }
            return ShoalError(
                code: .counterNotInteger,
                message: "counter column \(table.name).\(table.columns[index]) takes integers only; this write puts "
                    + "\(kind) in it, nothing was written"
            )
        }
        return nil
    }

    private func values(_ db: OpaquePointer, _ positions: [Int32], new: Bool) -> [SQLValue] {
        positions.map { position in
            var value: OpaquePointer?
            if new {
                sqlite3_preupdate_new(db, position, &value)
            } else {
                sqlite3_preupdate_old(db, position, &value)
            }
            return sqlValue(value)
        }
    }

    private func counterValues(_ db: OpaquePointer, _ table: ReplicatedTable, new: Bool) -> [Int64] {
        counters(table, values(db, table.columnPositions, new: new))
    }

    /// Per non-key column: the integer value of counter columns, 0 elsewhere.
    private func counters(_ table: ReplicatedTable, _ values: [SQLValue]) -> [Int64] {
        zip(values, table.isCounter).map { $1 ? ($0.integerValue ?? 0) : 0 }
    }
}
