import ShoalCore

/// One replicated table's part of the state digest.
public struct TableDigest: Sendable, Hashable {
    /// The table's name.
    public var name: String
    /// Its primary key's columns, in key order.
    public var keyColumns: [String]
    /// Its sum of row hashes, and how many rows (alive or deleted) it covers.
    public var digest: StateDigest
}

// Reads of the maintained digest, part by part, for comparing two replicas without shipping rows: each table's sum
// (`shoal_digest`), then the row hashes of a table whose sums differ (`shoal_row_hashes`), a page at a time in the
// order of their encoded keys. Nothing here changes replicated data; the digest is brought up to date first.
extension Store {
    /// The version vector, the digest, and each replicated table's part of it (paused tables are left out, as the
    /// digest leaves them out), read together.
    public func tableDigests() throws(ShoalError) -> (
        versionVector: VersionVector, digest: StateDigest, tables: [TableDigest]
    ) {
        // Folds every pending row in (what any read of the digest does), so the row hashes are current.
        _ = try digest()
        return try inReadTransaction { () throws(ShoalError) in
            let vector = try versionVector()
            var sums: [Int64: StateDigest] = [:]
            let select = try statement("SELECT tbl, sum, rows FROM shoal_digest")
            defer { select.reset() }
            while try select.step() {
                guard
                    let digest = StateDigest(
                        bytes: select.columnBytes(1),
                        rowCount: UInt64(bitPattern: select.columnInt64(2))
                    )
                else { throw ShoalError.corruptMetadata("bad shoal_digest row") }
                sums[select.columnInt64(0)] = digest
            }
            var total = StateDigest()
            var tables: [TableDigest] = []
            for table in capture.tables.sorted(by: { $0.name < $1.name }) {
                let sum = sums[table.id] ?? StateDigest()
                total.add(sum)
                tables.append(TableDigest(name: table.name, keyColumns: table.keyColumns, digest: sum))
            }
            return (vector, total, tables)
        }
    }

    /// At most `limit` row hashes of replicated table `table`, ordered by encoded key (bytewise), after the encoded
    /// key `after` (from the first when nil); and whether no row follows them. A table that is not replicated here
    /// (or paused) has none.
    public func rowHashes(
        of table: String,
        after: [UInt8]?,
        limit: Int
    ) throws(ShoalError) -> (rows: [(key: [UInt8], hash: [UInt8])], isLast: Bool) {
        guard let replicated = capture.tables.first(where: { $0.name == table }) else { return ([], true) }
        if after == nil { _ = try digest() }
        let select: SQLiteStatement
        if let after {
            select = try statement(
                "SELECT key, hash FROM shoal_row_hashes WHERE tbl = ? AND key > ? ORDER BY key LIMIT ?"
            )
            try select.bind([.integer(replicated.id), .blob(after), .integer(Int64(limit) + 1)])
        } else {
            select = try statement("SELECT key, hash FROM shoal_row_hashes WHERE tbl = ? ORDER BY key LIMIT ?")
            try select.bind([.integer(replicated.id), .integer(Int64(limit) + 1)])
        }
        defer { select.reset() }
        var rows: [(key: [UInt8], hash: [UInt8])] = []
        while try select.step() {
            if rows.count == limit { return (rows, false) }
            rows.append((select.columnBytes(0), select.columnBytes(1)))
        }
        return (rows, true)
    }

    /// Runs `body` in a read transaction (or in the one open), so that what it reads is one state.
    private func inReadTransaction<T>(_ body: () throws(ShoalError) -> T) throws(ShoalError) -> T {
        guard connection.isAutocommit else { return try body() }
        try connection.exec("BEGIN")
        do throws(ShoalError) {
            let result = try body()
            try connection.exec("COMMIT")
            return result
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }
}
