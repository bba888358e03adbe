import ShoalCore

/// What the store knows about one replicated table. Immutable; a class so that passing it around costs one
/// retain rather than one per field.
final class ReplicatedTable {
    /// The table's stable number in this database (names the clock table).
    let id: Int64
    let name: String
    /// Primary key columns, in key order.
    let keyColumns: [String]
    /// Positions of the key columns in the table (the pre-update hook's numbering).
    let keyPositions: [Int32]
    /// Non-key columns, in table order: the replicated cells.
    let columns: [String]
    /// Positions of the non-key columns in the table.
    let columnPositions: [Int32]
    /// Per non-key column: a PN-counter rather than last-writer-wins.
    let isCounter: [Bool]
    /// Non-key column name → index.
    let columnIndex: [String: Int]
    /// Non-key column names, quoted for SQL.
    let quotedColumns: [String]
    /// The key is a single INTEGER PRIMARY KEY, i.e. the rowid: the hook hands it over without a lookup.
    let keyIsRowid: Bool

    /// The table's name, quoted for SQL.
    let quotedName: String
    /// Its clock table: the row metadata.
    let clockTable: String
    /// `k0 = ? AND k1 = ? ...` against the clock table's key columns.
    let clockKeyPredicate: String
    /// `"id" = ? AND ...` against the data table's key columns.
    let dataKeyPredicate: String
    /// `1`, then the row's non-key columns, by its key (bound in key order): whether the row exists, and its values.
    /// The statements a row's apply, answer and digest use are built here once: built again for every row (quoting
    /// each name), they cost a catch-up about a fifth of its CPU time.
    let selectRowSQL: String
    /// Whether the row exists, by its key.
    let rowExistsSQL: String
    /// Deletes the row, by its key.
    let deleteRowSQL: String
    /// Every column written, for inserts.
    let allChanged: [Bool]
    /// No counter movement.
    let noDelta: [Int64]
    /// The type affinity of each key column and of each other column (see ``ColumnAffinity``).
    let keyAffinities: [ColumnAffinity]
    let affinities: [ColumnAffinity]
    /// Each non-key column's declared default when it is a constant (what a row never written there holds).
    let defaults: [SQLValue?]
    /// Whether each non-key column is declared NOT NULL.
    let notNull: [Bool]
    /// The non-key columns' positions in the order of their names: the order a row's hash takes them in
    /// (``StateDigest/nameOrder(_:)``).
    let hashOrder: [Int]

    init(
        id: Int64,
        name: String,
        keyColumns: [String],
        keyPositions: [Int32],
        columns: [String],
        columnPositions: [Int32],
        isCounter: [Bool],
        keyIsRowid: Bool,
        keyAffinities: [ColumnAffinity],
        affinities: [ColumnAffinity],
        defaults: [SQLValue?] = [],
        notNull: [Bool] = []
    ) {
        self.defaults = defaults
        self.notNull = notNull
        self.keyAffinities = keyAffinities
        self.affinities = affinities
        self.id = id
        self.name = name
        self.keyColumns = keyColumns
        self.keyPositions = keyPositions
        self.columns = columns
        self.columnPositions = columnPositions
        self.isCounter = isCounter
        self.keyIsRowid = keyIsRowid
        self.columnIndex = Dictionary(uniqueKeysWithValues: columns.enumerated().map { ($0.element, $0.offset) })
        self.hashOrder = StateDigest.nameOrder(columns)
        let quotedColumns = columns.map(quote)
        self.quotedColumns = quotedColumns
        self.allChanged = Array(repeating: true, count: columns.count)
        self.noDelta = Array(repeating: 0, count: columns.count)
        let quotedName = quote(name)
        let dataKeyPredicate = keyColumns.map { "\(quote($0)) = ?" }.joined(separator: " AND ")
        self.quotedName = quotedName
        self.clockTable = "shoal_clock_\(id)"
        self.clockKeyPredicate = keyColumns.indices.map { "k\($0) = ?" }.joined(separator: " AND ")
        self.dataKeyPredicate = dataKeyPredicate
        self.selectRowSQL =
            "SELECT \((["1"] + quotedColumns).joined(separator: ", ")) FROM \(quotedName) WHERE \(dataKeyPredicate)"
        self.rowExistsSQL = "SELECT 1 FROM \(quotedName) WHERE \(dataKeyPredicate)"
        self.deleteRowSQL = "DELETE FROM \(quotedName) WHERE \(dataKeyPredicate)"
    }
    var hasCounters: Bool { isCounter.contains(true) }

    /// The index of non-key column `name`, if the table has it: compared in turn in a table of a few columns (short
    /// names compare in a step; hashing one for ``columnIndex`` costs more, three times a change in a catch-up).
    func index(ofColumn name: String) -> Int? {
        guard columns.count <= 8 else { return columnIndex[name] }
        return columns.firstIndex(of: name)
    }

    /// A description of the replicated schema that two nodes must share.
    /// Why a key written to this table cannot be replicated, if it cannot: a NULL part (SQLite allows one in the
    /// primary key of a rowid table, but no node could name the row), or, in a key column declared with no type, a
    /// REAL equal to an integer (SQLite compares `1.0` and `1` as one key; nodes would keep either).
    func keyRefusal(_ key: [SQLValue], ending: String = "nothing was written") -> ShoalError? {
        for (index, value) in key.enumerated() {
            let problem: String
            switch value {
            case .null:
                problem = "NULL"
            case .real(let real) where keyAffinities[index] == .blob && real == real.rounded(.towardZero):
                problem = "the REAL \(real), which SQLite compares equal to an integer key"
            default:
                continue
            }
            return ShoalError(
                code: .unsupportedSchema,
                message: "key column \(name).\(keyColumns[index]) of a replicated table cannot hold \(problem): no "
                    + "other node could tell that row apart; \(ending)"
            )
        }
        return nil
    }
}

/// One row's net local change within a transaction, folded from the pre-update hook's events.
struct PendingWrite {
    /// Whether the row existed when the transaction (or the flush window) began.
    var existedBefore: Bool
    /// Whether it exists now.
    var existsAfter: Bool
    /// Which non-key columns were written; `nil` means all of them (after an insert).
    var changed: [Bool]?
    /// Net movement of each counter column; `nil` when none moved.
    var counterDelta: [Int64]?
    /// Whether another connection's write (read from the outbox) is part of it: what it says of the row's
    /// existence held when that connection committed, and is checked against the table when stamped.
    var fromOutbox = false

    /// A new row's write: it did not exist, it does now, every column written.
    static let freshInsert = PendingWrite(existedBefore: false, existsAfter: true, changed: nil, counterDelta: nil)
}

/// A row's primary key as the capture keeps it: the rowid itself when the key is the rowid.
enum PendingKey: Hashable {
    case rowid(Int64)
    case values([SQLValue])

    var values: [SQLValue] {
        switch self {
        case .rowid(let rowid): [.integer(rowid)]
        case .values(let values): values
        }
    }
}

/// A raw event from the pre-update hook, kept per statement until the statement succeeds.
struct CapturedEvent {
    enum Kind {
        case insert, delete, update
    }

    let table: Int
    let kind: Kind
    let key: PendingKey
    /// For updates: which non-key columns changed value.
    let changed: [Bool]?
    /// Per counter column: new minus old.
    let counterDelta: [Int64]?

    /// An insert of the row with rowid `rowid` into table number `table`, which has no counters.
    static func insert(table: Int, rowid: Int64) -> CapturedEvent {
        CapturedEvent(table: table, kind: .insert, key: .rowid(rowid), changed: nil, counterDelta: nil)
    }
}

/// Hashable key of a row: table number and primary key.
struct RowKey: Hashable {
    let table: Int
    let key: [SQLValue]
}

/// One table's net writes in the open transaction, in the order the rows were first written (which keeps
/// metadata inserts in key order when the application writes in key order).
///
/// Bulk inserts usually arrive in increasing rowid order; while they do, a new rowid cannot repeat an
/// earlier one, so the hash index is only built at the first key out of order. While nothing but such inserts of
/// new rows came, they are kept as bare rowids (``freshRowids``): a bulk insert is most of what a capture holds.
struct PendingTable {
    /// New rows inserted with increasing rowids before any other write: each a ``PendingWrite/freshInsert``, in
    /// write order, before every entry of ``rows``.
    private(set) var freshRowids: [Int64] = []
    private(set) var rows: [(key: PendingKey, write: PendingWrite)] = []
    private var index: [PendingKey: Int]?
    private var highestRowid = Int64.min

    var isEmpty: Bool { rows.isEmpty && freshRowids.isEmpty }

    /// Notes a new row inserted with a rowid above every one before, if nothing but such rows came so far;
    /// `false` (nothing noted) otherwise.
    mutating func appendFreshRowid(_ rowid: Int64) -> Bool {
        guard rows.isEmpty, index == nil, rowid > highestRowid else { return false }
        highestRowid = rowid
        freshRowids.append(rowid)
        return true
    }

    /// The position of `key` among the rows, if it was written before.
    mutating func position(of key: PendingKey) -> Int? {
        if index == nil {
            if case .rowid(let rowid) = key, rowid > highestRowid { return nil }
            materializeFreshRowids()
            buildIndex()
        }
        return index![key]
    }

    mutating func append(_ key: PendingKey, _ write: PendingWrite) {
        materializeFreshRowids()
        if index == nil, case .rowid(let rowid) = key, rowid > highestRowid {
            highestRowid = rowid
        } else {
            if index == nil { buildIndex() }
            index![key] = rows.count
        }
        rows.append((key, write))
    }

    mutating func update(at position: Int, _ write: PendingWrite) {
        rows[position].write = write
    }

    /// Moves the bare rowids into ``rows`` (they come first), for a write that is not one of them.
    mutating func materializeFreshRowids() {
        guard !freshRowids.isEmpty else { return }
        rows = freshRowids.map { (PendingKey.rowid($0), PendingWrite.freshInsert) } + rows
        freshRowids = []
    }

    private mutating func buildIndex() {
        var built: [PendingKey: Int] = [:]
        built.reserveCapacity(rows.count * 2)
        for (position, row) in rows.enumerated() { built[row.key] = position }
        index = built
    }
}
