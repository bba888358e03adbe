import ShoalCore

/// What a member said it held, as it wrote it in ``Store/memberReportsTable``.
public struct MemberReport: Sendable, Hashable {
    /// The member, by the site its membership names.
    public var site: SiteID
    /// Its node name, if it has one.
    public var name: String?
    /// What it held when it wrote the report.
    public var versionVector: VersionVector
    /// When it wrote it, by its own wall clock (Unix milliseconds).
    public var reportedAtMs: UInt64
    /// The site whose write the row's vector is (the member itself, unless someone else wrote its row).
    public var writtenBy: SiteID?

    /// A report of `site` (named `name`) holding `versionVector` at `reportedAtMs`.
    public init(
        site: SiteID,
        name: String? = nil,
        versionVector: VersionVector,
        reportedAtMs: UInt64,
        writtenBy: SiteID? = nil
    ) {
        self.site = site
        self.name = name
        self.writtenBy = writtenBy
        self.versionVector = versionVector
        self.reportedAtMs = reportedAtMs
    }
}

/// Members' reports of what they hold, as replicated rows.
///
/// On a LAN a member tells its peers what it holds on every link, and they pass it on (`MemberDirectory`). A member
/// that reaches the others only through the relay has no link to tell them on; so a node that collects writes its
/// report, after commits, as a row of the replicated table ``memberReportsTable`` (one row per member, written by the
/// member itself), which travels as every change does: sealed through the relay, and over LAN links. A relay operator can neither read
/// nor forge one; one it withholds or replays is an older report, which only holds collection back.
extension Store {
    /// The replicated table of members' reports: member site → its node name, its version vector as text
    /// (`hex:seq,…`) and when it wrote it.
    public static let memberReportsTable = "shoal_member_reports"

    /// The tables Shoal replicates for itself, which are not the app's.
    public static let internalReplicatedTables: Set<String> = [
        schemaTable, collectedTable, suspendedTable, memberReportsTable,
    ]

    /// Creates and replicates ``memberReportsTable`` inside the caller's write transaction, if it is missing.
    func prepareMemberReportsTableInTransaction() throws(ShoalError) {
        try prepareInternalTableInTransaction(
            Self.memberReportsTable,
            columns: "site BLOB NOT NULL PRIMARY KEY, name TEXT, vector TEXT NOT NULL DEFAULT '', "
                + "at INTEGER NOT NULL DEFAULT 0"
        )
    }

    /// Writes, as a change of this node, that `site` (this node's membership, named `name`) holds `vector` as of `atMs`.
    /// Returns `false`, writing nothing, while a transaction is open on this connection (an app's, through the node):
    /// the caller writes it later.
    @discardableResult
    public func writeMemberReport(
        site: SiteID,
        name: String?,
        holds vector: VersionVector,
        atMs: UInt64
    ) throws(ShoalError) -> Bool {
        guard connection.isAutocommit, !capture.hasUncommittedWork else { return false }
        try writingOwnChanges { () throws(ShoalError) in
            try prepareMemberReportsTableInTransaction()
            try connection.rows(
                "INSERT OR REPLACE INTO \(Self.memberReportsTable)(site, name, vector, at) VALUES (?, ?, ?, ?)",
                [
                    .blob(site.bytes), name.map(SQLValue.text) ?? .null, .text(Self.vectorText(vector)),
                    .integer(Int64(clamping: atMs)),
                ]
            )
            capture.statementSucceeded()
        }
        return true
    }

    /// Every member's last report this database holds, with who wrote each (from the row's metadata).
    public func memberReports() throws(ShoalError) -> [MemberReport] {
        try refreshSchema()
        guard let number = capture.tableNumbers[Self.memberReportsTable] else { return [] }
        let table = capture.tables[number]
        let vectorCell = table.columns.firstIndex(of: "vector")
        let select = "SELECT site, name, vector, at FROM \(Self.memberReportsTable)"
        var reports: [MemberReport] = []
        for row in try connection.rows(select) {
            guard case .blob(let bytes) = row[0], let site = SiteID(bytes: bytes), case .text(let text) = row[2],
                case .integer(let at) = row[3]
            else { continue }
            let name: String? = if case .text(let name) = row[1] { name } else { nil }
            var writer: SiteID?
            if let vectorCell, let state = try loadState(table: table, key: [row[0]]),
                case .value(let stamp, _) = state.cells[vectorCell]
            {
                writer = stamp.site
            }
            reports.append(
                MemberReport(
                    site: site, name: name, versionVector: Self.vector(fromText: text),
                    reportedAtMs: UInt64(max(0, at)), writtenBy: writer
                )
            )
        }
        return reports
    }
}
