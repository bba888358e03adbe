import ShoalCore

// The schema fingerprint: what peers compare before they exchange changes (the hello, a change stream's header).
extension Store {
    /// A fingerprint of the replicated schema: nodes that exchange changes should share it.
    ///
    /// It covers each replicated table's whole shape as far as it decides what the table stores (see
    /// ``TableShape/fingerprintText(table:counters:checks:)``), so that peers whose tables would store different
    /// rows for the same changes never exchange them, on the live path (the hello) and the offline one (the change
    /// stream's header).
    public func schemaFingerprint() throws(ShoalError) -> String {
        try refreshSchema()
        if let cached = fingerprintCache, cached.version == schemaVersion { return cached.text }
        var parts: [String] = []
        for table in capture.tables {
            guard let part = try fingerprintPart(of: table) else { continue }
            parts.append(part)
            try keepFingerprint(part, of: table.id)
        }
        // A paused table counts as it was replicated: a local schema problem does not turn every peer away.
        parts += pausedTableList.compactMap(\.fingerprintText)
        let text = parts.sorted().joined(separator: ";")
        fingerprintCache = (schemaVersion, text)
        return text
    }

    /// One active table's part of ``schemaFingerprint()``.
    func fingerprintPart(of table: ReplicatedTable) throws(ShoalError) -> String? {
        guard let shape = try currentShape(of: table.name) else { return nil }
        let sql = try connection.scalar(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?",
            [.text(table.name)]
        )
        let text = if case .text(let text) = sql { text } else { "" }
        let checks = SQLText.checkExpressions(in: text).map(SQLText.normalized)
        let counters = table.columns.indices.filter { table.isCounter[$0] }.map { table.columns[$0] }
        var part = shape.fingerprintText(table: table.name, counters: counters, checks: checks)
        // A STRICT table refuses values another would store; a rowid key takes integers only.
        if Self.isStrict(text) { part += " STRICT" }
        if table.keyIsRowid { part += " ROWID" }
        return part
    }

    /// Keeps a table's fingerprint part, so that it counts the same while paused (its shape then is not what it was
    /// replicated with). A read-only file only delays this.
    func keepFingerprint(_ part: String, of id: Int64) throws(ShoalError) {
        let key = "fingerprint_\(id)"
        guard try connection.scalar("SELECT value FROM shoal_meta WHERE key = ?", [.text(key)]) != .text(part) else {
            return
        }
        _ = try? connection.rows("INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)", [.text(key), .text(part)])
    }

    /// Whether a `CREATE TABLE` statement declares a STRICT table (its options follow the closing parenthesis).
    static func isStrict(_ sql: String) -> Bool {
        let tokens = SQLText.tokenize(sql)
        guard let close = tokens.lastIndex(where: { $0.kind == .symbol(")") }) else { return false }
        return tokens[close...].contains { if case .word(let word) = $0.kind { word.uppercased() == "STRICT" } else { false } }
    }
}
