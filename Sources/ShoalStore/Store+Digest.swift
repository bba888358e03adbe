import ShoalCore

/// Row counts of one replicated table.
public struct TableStatus: Sendable, Hashable {
    public var name: String
    /// Rows alive.
    public var rows: Int
    /// Deleted rows whose tombstones are kept.
    public var tombstones: Int
    public var counterColumns: [String]
}

/// A summary of a store.
public struct StoreStatus: Sendable, Hashable {
    public var siteID: SiteID
    public var nodeName: String?
    public var versionVector: VersionVector
    public var tables: [TableStatus]
    public var conflicts: Int
    public var digest: StateDigest
}

extension Store {
    /// The order-independent digest of every replicated row (alive or deleted) with its clocks and values.
    public func digest() throws(ShoalError) -> StateDigest {
        try refreshSchema()
        try captureForeignWritesIfIdle()
        try refreshSites()
        var digest = StateDigest()
        for table in capture.tables {
            let keys = table.keyColumns.indices.map { "c.k\($0)" }
            let values = table.columns.map { "d.\(quote($0))" }
            let join = table.keyColumns.enumerated().map { "d.\(quote($0.element)) = c.k\($0.offset)" }
            let select = try connection.prepare(
                "SELECT \((keys + ["c.meta"] + values).joined(separator: ", ")) FROM \(table.clockTable) c "
                    + "LEFT JOIN \(quote(table.name)) d ON \(join.joined(separator: " AND "))"
            )
            let keyCount = table.keyColumns.count
            while try select.step() {
                let row = select.row()
                guard case .blob(let meta) = row[keyCount] else {
                    throw ShoalError.corruptMetadata("missing row metadata")
                }
                let state = try RowState(encoded: meta, columnCount: table.columns.count, sites: sites)
                digest.addRow(
                    table: table.name,
                    primaryKey: Array(row[0..<keyCount]),
                    state: state,
                    columns: table.columns,
                    values: Array(row[(keyCount + 1)...])
                )
            }
        }
        return digest
    }

    /// Site id, version vector, tables with row and tombstone counts, conflicts and digest.
    public func status() throws(ShoalError) -> StoreStatus {
        try refreshSchema()
        try captureForeignWritesIfIdle()
        var tables: [TableStatus] = []
        for table in capture.tables {
            let rows = Int(try connection.scalar("SELECT count(*) FROM \(quote(table.name))").integerValue ?? 0)
            let tracked = Int(try connection.scalar("SELECT count(*) FROM \(table.clockTable)").integerValue ?? 0)
            tables.append(
                TableStatus(
                    name: table.name,
                    rows: rows,
                    tombstones: max(0, tracked - rows),
                    counterColumns: table.columns.indices.filter { table.isCounter[$0] }.map { table.columns[$0] }
                )
            )
        }
        return StoreStatus(
            siteID: siteID,
            nodeName: try nodeName(),
            versionVector: try versionVector(),
            tables: tables,
            conflicts: try conflictCount(),
            digest: try digest()
        )
    }
}
