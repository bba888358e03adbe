import ShoalCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why this database writes as a fresh site: its file is an older copy of itself, or a copy of another file.
///
/// One identity has one history. A database restored from an older backup, or a file copied (to this device or
/// another), would go on issuing the sequence numbers its peers already hold, or that the original issues, with
/// other content; so before it writes anything, it moves to a fresh site. What it holds of the old site stays that
/// site's history (it is a prefix of it), claimed as far as it goes: peers send back what the old site wrote later,
/// and nothing is lost. A restored file claims the old site only as far as it had sent it: what it wrote past that,
/// after the restore, is issued again under the fresh site.
public struct IdentityChange: Sendable, Hashable, CustomStringConvertible {
    /// What was found.
    public enum Reason: String, Sendable {
        /// The file holds fewer of its own transactions than it had already sent: restored from an older copy, or it
        /// lost commits.
        case restored
        /// The file is a copy (another file than the one last opened here, on this machine).
        case copied
        /// The file was copied from another machine: it is another node, which needs a membership of its own.
        case copiedFromAnotherMachine = "copied-from-another-machine"
        /// The file was given a new node key (`shoal init --new-key`): it is another node than the one whose key it
        /// had (a copy of a member's file, or a file whose key was lost), which joins under a site of its own.
        case newNodeKey = "new-node-key"
        /// The file wrote transactions under numbers a peer holds with other content: restored from an older copy
        /// whose record of what it had sent was lost, and written to since (seen by a peer's request).
        case forked
    }

    /// What was found.
    public var reason: Reason
    /// The site it wrote as before.
    public var previousSite: SiteID
    /// The site it writes as now.
    public var site: SiteID
    /// When (milliseconds since the Unix epoch).
    public var atMilliseconds: UInt64

    /// What happened, in plain words, with what (if anything) to do.
    public var description: String {
        let sites = "it now writes as site \(site.hex.prefix(8)) (was \(previousSite.hex.prefix(8)))"
        switch reason {
        case .restored:
            return "this database holds fewer of its own writes than it had already sent (restored from an older "
                + "copy, or commits lost): \(sites), so that none of its new writes reuses a number its peers hold; "
                + "peers send back what it had sent since, and nothing is lost"
        case .copied:
            return "this database file is a copy of another (copied, or restored from a backup file): \(sites), so "
                + "that it and the original never write under the same numbers; nothing is lost"
        case .forked:
            return "this database wrote transactions under numbers a peer holds with other content (it was restored "
                + "from an older copy and written to since): \(sites); those transactions are issued again under it, "
                + "and peers send back what they hold under the old numbers, so nothing is lost"
        case .copiedFromAnotherMachine:
            return "this database was copied from another machine: \(sites). It is another node than the original: "
                + "give it a key and a membership of its own (remove its .shoal-key file, then run shoal invite on a "
                + "member and shoal join here) before it syncs"
        case .newNodeKey:
            return "this database was given a new node key: \(sites). It is another node than the one whose key it "
                + "had, with a site of its own: run shoal invite on a member and shoal join here; nothing is lost"
        }
    }

    var encoded: String { "\(reason.rawValue) \(previousSite.hex) \(site.hex) \(atMilliseconds)" }

    init(reason: Reason, previousSite: SiteID, site: SiteID, atMilliseconds: UInt64) {
        self.reason = reason
        self.previousSite = previousSite
        self.site = site
        self.atMilliseconds = atMilliseconds
    }

    init?(encoded: String) {
        let fields = encoded.split(separator: " ").map(String.init)
        guard fields.count == 4, let reason = Reason(rawValue: fields[0]), let previous = SiteID(hex: fields[1]),
            let site = SiteID(hex: fields[2]), let at = UInt64(fields[3])
        else { return nil }
        self.init(reason: reason, previousSite: previous, site: site, atMilliseconds: at)
    }
}

extension Store {
    /// The file beside the database recording how far this site's transactions were sent: a database that holds
    /// fewer than that was restored from an older copy.
    /// (Beside the file itself: a database opened through a symbolic link is recorded where it is.)
    static func sentFilePath(_ path: String) -> String {
        guard let resolved = realpath(path, nil) else { return path + ".shoal-sent" }
        defer { free(resolved) }
        return String(cString: resolved) + ".shoal-sent"
    }

    /// The last identity change, if this database ever moved to a fresh site.
    public func identityChange() throws(ShoalError) -> IdentityChange? {
        guard case .text(let text) = try connection.scalar("SELECT value FROM shoal_meta WHERE key = 'identity_change'")
        else { return nil }
        return IdentityChange(encoded: text)
    }

    /// Checks, when the database opens, that its file is the one that last wrote as its site and that it holds all
    /// its site sent; otherwise moves it to a fresh site before anything is written (see ``IdentityChange``).
    /// Returns the site, the index of the site in `shoal_sites`, and the site peers know this node by.
    static func checkIdentity(
        _ connection: SQLiteConnection,
        path: String,
        site: SiteID,
        machine: String?,
        now: UInt64
    ) throws(ShoalError) -> (site: SiteID, index: Int64, identity: SiteID, change: IdentityChange?) {
        func meta(_ key: String) throws(ShoalError) -> SQLValue {
            try connection.scalar("SELECT value FROM shoal_meta WHERE key = ?", [.text(key)])
        }
        func setMeta(_ key: String, _ value: SQLValue) throws(ShoalError) {
            try connection.rows("INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)", [.text(key), value])
        }
        func current() throws(ShoalError) -> (site: SiteID, index: Int64, identity: SiteID) {
            let index = try meta("own_site_index").integerValue ?? 1
            guard case .blob(let bytes) = try meta("site_id"), let site = SiteID(bytes: bytes) else {
                throw ShoalError.corruptMetadata("no site id")
            }
            if case .blob(let identity) = try meta("identity_site"), let identity = SiteID(bytes: identity) {
                return (site, index, identity)
            }
            return (site, index, site)
        }
        guard isOnDisk(path), let inode = fileInode(path) else {
            let (site, index, identity) = try current()
            return (site, index, identity, nil)
        }
        /// Why the file must move to a fresh site, if it must, and whether its file and machine are recorded as now.
        func inspect() throws(ShoalError) -> (ownSeq: Int64, reason: IdentityChange.Reason?, recorded: Bool) {
            let (site, index, _) = try current()
            let ownSeq = try connection.scalar("SELECT max(seq) FROM shoal_log WHERE site = ?", [.integer(index)])
                .integerValue ?? 0
            let storedMachine = try meta("file_machine")
            let storedInode = try meta("file_inode").integerValue
            let recorded = storedInode == inode && (machine == nil || storedMachine == .text(machine!))
            if try meta(newNodeKeyKey) != .null { return (ownSeq, .newNodeKey, false) }
            if case .text(let stored) = storedMachine, let machine, stored != machine {
                return (ownSeq, .copiedFromAnotherMachine, recorded)
            }
            if let storedInode, storedInode != inode { return (ownSeq, .copied, recorded) }
            let sent = readSent(path)[site] ?? 0
            if sent == forkedMarker { return (ownSeq, .forked, recorded) }
            return (ownSeq, sent > UInt64(ownSeq) ? .restored : nil, recorded)
        }
        // Read first: a file opened where it was last opened, holding what it sent, is not written to at all.
        let (site, index, identity) = try current()
        if case (_, nil, true) = try inspect() { return (site, index, identity, nil) }
        do throws(ShoalError) {
            try connection.exec("BEGIN IMMEDIATE")
            // Again under the write lock: another process may have just done it.
            var (site, index, identity) = try current()
            let (ownSeq, reason, _) = try inspect()
            var change: IdentityChange?
            if let reason {
                let fresh = SiteID.random()
                let freshIndex =
                    (try connection.scalar("SELECT max(idx) FROM shoal_sites").integerValue ?? index) + 1
                try connection.rows(
                    "INSERT INTO shoal_sites(idx, site) VALUES (?, ?)", [.integer(freshIndex), .blob(fresh.bytes)]
                )
                // What the old site wrote here is its history as far as it is shared: held as another site's, claimed
                // that far. A copy shares all it holds. A restored file shares what it sent; what it holds past that
                // may be what it wrote after the restore, under numbers its peers hold with other content: issued
                // again under the fresh site once the store is open (``reissueForkedWrites()``), while peers send
                // back what the old site wrote there.
                var shared = ownSeq
                if reason == .restored || reason == .forked {
                    shared = min(ownSeq, Int64(clamping: readSentRecord(path).sent[site] ?? 0))
                }
                try connection.rows(
                    "INSERT INTO shoal_claims(site, seq) VALUES (?, ?) "
                        + "ON CONFLICT(site) DO UPDATE SET seq = max(seq, excluded.seq)",
                    [.integer(index), .integer(shared)]
                )
                if shared < ownSeq { try setMeta(reissueKey, .text("\(index) \(shared)")) }
                // The fresh site's clocks start after the old site's.
                if let last = try connection.scalar(
                    "SELECT max(hlc) FROM shoal_log WHERE site = ?", [.integer(index)]
                ).integerValue {
                    try connection.rows(
                        "UPDATE shoal_meta SET value = max(value, ?) WHERE key = 'hlc_high'", [.integer(last)]
                    )
                }
                let made = IdentityChange(reason: reason, previousSite: site, site: fresh, atMilliseconds: now)
                change = made
                try setMeta("site_id", .blob(fresh.bytes))
                try setMeta("own_site_index", .integer(freshIndex))
                // Peers know this node by the site its membership names; a copy on another machine is another node.
                if reason == .copiedFromAnotherMachine || reason == .newNodeKey { identity = fresh }
                try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text(newNodeKeyKey)])
                try setMeta("identity_site", .blob(identity.bytes))
                try setMeta("identity_change", .text(made.encoded))
                // It may hold rows its peers deleted and collected since: see
                // ``takeFreshState(table:keys:peerVector:)``.
                try setMeta(freshStateKey, .integer(Int64(clamping: now)))
                // A file that awaited its fresh state already (a copy of a restored file, taken before it took it)
                // keeps the floor it had: its own record is not beside the copy, and with no floor it took its
                // fresh state from a peer as stale as itself (another such copy), and kept rows collected meanwhile.
                var floor = vector(fromText: freshStateFloorText(readSentRecord(path), own: [site, fresh, identity]))
                if case .text(let inherited) = try connection.scalar(
                    "SELECT value FROM shoal_meta WHERE key = ?", [.text(freshStateFloorKey)]
                ) {
                    floor.merge(vector(fromText: inherited))
                }
                try setMeta(freshStateFloorKey, .text(vectorText(floor)))
                // The digest's bookkeeping follows the local site's sequence numbers: it is rebuilt.
                try connection.exec(
                    """
                    DELETE FROM shoal_digest; DELETE FROM shoal_row_hashes; DELETE FROM shoal_digest_pending;
                    DELETE FROM shoal_meta WHERE key LIKE 'digest\\_%' ESCAPE '\\' AND key != 'digest_format';
                    """
                )
                (site, index) = (fresh, freshIndex)
            }
            try setMeta("file_inode", .integer(inode))
            if let machine { try setMeta("file_machine", .text(machine)) }
            try connection.exec("COMMIT")
            return (site, index, identity, change)
        } catch {
            try? connection.exec("ROLLBACK")
            // A read-only file (a backup on a read-only mount) is read as it is: it writes nothing, so it reuses
            // nothing either.
            if error.sqlite?.isReadOnly == true { return (site, index, identity, nil) }
            throw error
        }
    }

    /// What a node that finds a peer holding more of its own site than it does is told to do.
    static let restartToMove =
        "Restart this node (or reopen the database): it then moves to a fresh site and gets back what it had sent "
        + "from its peers; shoal status says so"

    /// Records that a peer (or a stream) shows this site issued transactions up to `seq`, beyond what the database
    /// holds: the database moves to a fresh site when it next opens.
    func noteOwnSiteEvidence(_ seq: UInt64) {
        if (Self.readSent(path)[siteID] ?? 0) >= seq { return }
        recordSent(upTo: seq, heldByPeer: true)
    }

    /// The `shoal_meta` key naming the old site whose transactions past a number are to be issued again under the
    /// fresh site, and that number: `"INDEX SEQ"`.
    static let reissueKey = "reissue_after"
    /// The `shoal_meta` key that marks a database given a new node key: it moves to a site of its own at its next
    /// open (``IdentityChange/Reason/newNodeKey``).
    static let newNodeKeyKey = "new_node_key"

    /// Marks this database as given a new node key: at its next open it writes under a fresh site, which peers know it
    /// by (a new membership binds it), and what it wrote before stays the old site's (see ``identityChange()``).
    public func markNewNodeKey() throws(ShoalError) {
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.newNodeKeyKey), .integer(Int64(clamping: options.clock.nowMilliseconds()))]
        )
    }

    /// Issues again, under this database's fresh site, the transactions its old site wrote past what it had sent
    /// (see ``checkIdentity(_:path:site:machine:now:)``): each keeps its clock, its order and its rows' values, and
    /// takes the fresh site's next number. Peers hold other content under the old numbers, and send it back; this
    /// database's own writes reach them under the new ones. Nothing is lost either way. One transaction, once; a
    /// process killed before it commits does it at the next opening.
    func reissueForkedWrites() throws(ShoalError) {
        guard case .text(let spec) = try connection.scalar("SELECT value FROM shoal_meta WHERE key = ?",
            [.text(Self.reissueKey)]) else { return }
        try beginWriting()
        do throws(ShoalError) {
            let fields = spec.split(separator: " ").compactMap { Int64($0) }
            if fields.count == 2, fields[0] != ownSiteIndex {
                let (oldIndex, shared) = (fields[0], fields[1])
                try refreshSites()
                let oldSite = try sites.site(at: UInt64(oldIndex))
                var entries: [(seq: Int64, table: Int64, keys: [UInt8])] = []
                for row in try connection.rows(
                    "SELECT seq, tbl, keys FROM shoal_log WHERE site = ? AND seq > ? ORDER BY seq, tbl, part",
                    [.integer(oldIndex), .integer(shared)]
                ) {
                    guard case .integer(let seq) = row[0], case .integer(let table) = row[1],
                        case .blob(let keys) = row[2]
                    else { continue }
                    entries.append((seq, table, keys))
                }
                let tablesByID = Dictionary(uniqueKeysWithValues: capture.tables.map { ($0.id, $0) })
                let bornForked = try rowsOnlyForkedWritesTouched(
                    entries, tables: tablesByID, oldIndex: oldIndex, shared: shared
                )
                var next = try connection.scalar(
                    "SELECT coalesce(max(seq), 0) FROM shoal_log WHERE site = ?", [.integer(ownSiteIndex)]
                ).integerValue ?? 0
                var reissued: [Int64: Int64] = [:]
                for seq in Set(entries.map(\.seq)).sorted() {
                    next += 1
                    reissued[seq] = next
                    try connection.rows(
                        "UPDATE shoal_log SET site = ?, seq = ? WHERE site = ? AND seq = ?",
                        [.integer(ownSiteIndex), .integer(next), .integer(oldIndex), .integer(seq)]
                    )
                }
                for (seq, tableID, keys) in entries {
                    guard let table = tablesByID[tableID], let fresh = reissued[seq] else { continue }
                    let dot = Dot(site: oldSite, seq: UInt64(seq))
                    var reader = ByteReader(keys)
                    while !reader.isAtEnd {
                        let key = try Self.readLogKey(&reader, table: table)
                        guard var state = try loadState(table: table, key: key) else { continue }
                        // The row's life began with a reissued transaction: its counters hold nothing older.
                        let life = state.lengthStamp
                        let lifeIsReissued = life?.site == siteID || (life?.site == oldSite && life!.seq > shared)
                            || (life == nil && bornForked[tableID]?.contains(key) == true)
                        state.reissue(dot, as: Dot(site: siteID, seq: UInt64(fresh)), lifeIsReissued: lifeIsReissued)
                        try saveState(state, table: table, key: key)
                    }
                }
                if !reissued.isEmpty {
                    options.logger.error(
                        """
                        transactions written after a restore, under numbers peers hold with other content, are issued \
                        again under this database's fresh site; peers send back what they hold there
                        """,
                        metadata: ["transactions": "\(reissued.count)", "after_seq": "\(shared)"]
                    )
                }
            }
            try connection.rows("DELETE FROM shoal_meta WHERE key = ?", [.text(Self.reissueKey)])
            try connection.exec("COMMIT")
        } catch {
            abandonWrite()
            throw error
        }
    }

    /// The rows, per table, that the reissued transactions (`entries`) touch and no other logged transaction does:
    /// rows they created, in their first life (a row written before is in an earlier transaction's entry, which
    /// compaction keeps while that transaction holds a value or a counter entry of the row).
    private func rowsOnlyForkedWritesTouched(
        _ entries: [(seq: Int64, table: Int64, keys: [UInt8])],
        tables: [Int64: ReplicatedTable],
        oldIndex: Int64,
        shared: Int64
    ) throws(ShoalError) -> [Int64: Set<[SQLValue]>] {
        var candidates: [Int64: Set<[SQLValue]>] = [:]
        for (_, tableID, keys) in entries {
            guard let table = tables[tableID] else { continue }
            var reader = ByteReader(keys)
            while !reader.isAtEnd {
                candidates[tableID, default: []].insert(try Self.readLogKey(&reader, table: table))
            }
        }
        for (tableID, _) in candidates {
            guard let table = tables[tableID] else { continue }
            for row in try connection.rows(
                "SELECT keys FROM shoal_log WHERE tbl = ? AND NOT (site = ? AND seq > ?)",
                [.integer(tableID), .integer(oldIndex), .integer(shared)]
            ) {
                guard case .blob(let keys) = row[0] else { continue }
                var reader = ByteReader(keys)
                while !reader.isAtEnd { candidates[tableID]?.remove(try Self.readLogKey(&reader, table: table)) }
            }
        }
        return candidates
    }

    /// What the sent file records for a site that wrote under numbers a peer holds with other content.
    static let forkedMarker = UInt64(Int64.max)

    /// The latest transaction of `site` (up to `seq`) this database's log holds, with its clock: what a sync request
    /// or a change stream tells the other side it holds of its site, for ``checkHead(_:)`` there.
    public func loggedHead(of site: SiteID, upTo seq: UInt64 = UInt64(Int64.max)) throws(ShoalError) -> Stamp? {
        try refreshSites()
        guard let index = sites.existingIndex(of: site) else { return nil }
        let select = try statement(
            "SELECT seq, hlc FROM shoal_log WHERE site = ? AND seq <= ? ORDER BY seq DESC LIMIT 1"
        )
        try select.bind([.integer(Int64(index)), .integer(Int64(bitPattern: min(seq, UInt64(Int64.max))))])
        defer { select.reset() }
        guard try select.step() else { return nil }
        return Stamp(
            hlc: HLC(rawValue: UInt64(bitPattern: select.columnInt64(1))),
            site: site,
            seq: UInt64(select.columnInt64(0))
        )
    }

    /// Checks what a peer holds of this database's site (`head`: its latest transaction of it, with its clock)
    /// against what this database wrote under that number. A transaction's clock is the same wherever it is held:
    /// another clock means this database wrote other content under a number the peer holds (it was restored from an
    /// older copy whose record of what it sent was lost, and written to since). Then it sends nothing more, and moves
    /// to a fresh site when it next opens.
    public func checkHead(_ head: Stamp) throws(ShoalError) {
        guard head.site == siteID else { return }
        let select = try statement("SELECT hlc FROM shoal_log WHERE site = ? AND seq = ? LIMIT 1")
        try select.bind([.integer(ownSiteIndex), .integer(Int64(bitPattern: head.seq))])
        defer { select.reset() }
        guard try select.step() else { return }
        let held = HLC(rawValue: UInt64(bitPattern: select.columnInt64(0)))
        guard held != head.hlc else { return }
        recordSent(upTo: Self.forkedMarker, heldByPeer: true)
        throw ShoalError(
            code: .siteConflict,
            message: "the peer holds transaction \(head.seq) of this database's own site \(siteID.hex.prefix(8)) with "
                + "clock \(head.hlc), but this database wrote it with clock \(held): it was restored from an older copy "
                + "whose record of what it had sent was lost, and wrote other content under numbers the peer holds, so "
                + "nothing is sent. \(Self.restartToMove)"
        )
    }

    /// Records that this site's transactions up to `seq` are about to be sent (or, `heldByPeer`, that a peer showed
    /// it holds them), beside what every site this file wrote as before had sent (a backup of any age restored later
    /// is then told). Best effort: a file that cannot be written only weakens the check at open, and says so once.
    func recordSent(upTo seq: UInt64, heldByPeer: Bool = false) {
        guard Self.isOnDisk(path) else { return }
        var record = Self.readSentRecord(path)
        if heldByPeer {
            record.held[siteID] = max(record.held[siteID] ?? 0, seq)
        } else {
            record.sent[siteID] = max(record.sent[siteID] ?? 0, seq)
        }
        writeSentRecord(record, synced: true)
    }

    /// Replaces the sent file with `record` (synced to disk first with `synced`). Best effort; says once if it fails.
    func writeSentRecord(_ record: SentRecord, synced: Bool) {
        let target = Self.sentFilePath(path)
        // A name of this process's own: two processes on one file (a node and `shoal sql`) each write theirs, and
        // neither renames the other's away mid-write.
        let temporary = target + ".tmp.\(getpid())"
        var written = false
        if let file = fopen(temporary, "w") {
            written = fputs(record.text, file) >= 0 && fflush(file) == 0 && (!synced || fsync(fileno(file)) == 0)
            fclose(file)
            written = written && rename(temporary, target) == 0
        }
        if !written && !warnedSentRecord {
            warnedSentRecord = true
            options.logger.warning(
                "cannot record what this database sent beside it: a restore of an older copy will not be told at open",
                metadata: ["file": "\(target)", "errno": "\(errno)"]
            )
        }
    }

    /// Records beside the file what this database holds of every site, when that grew (no sync to disk: it is
    /// evidence, not a promise). Peers collect a delete once every member holds it, counting what this node told them
    /// it holds; a copy of this file restored later (in place, or with its own writes all sent, so that nothing else
    /// shows it) holds less, and then takes a fresh state (``noteLostHistory()``). `resetting` replaces the record with
    /// what the file holds now (once its fresh state is taken).
    func recordHolds(resetting: Bool = false) {
        // Not its own writing site: writes held back there (awaiting a fresh state) reach no peer, and once restored
        // again, from an older copy, the file's floor named that site, which no peer could ever hold (it awaited for
        // good). What it sent of its own is in the record's other lines.
        guard Self.isOnDisk(path), let all = try? readVersionVector() else { return }
        let vector = VersionVector(all.entries.filter { $0.key != siteID })
        guard resetting || !recordedHolds.dominatesOrEquals(vector) else { return }
        var record = Self.readSentRecord(path)
        if resetting {
            record.holds = vector.entries
        } else {
            record.holds.merge(vector.entries) { max($0, $1) }
        }
        recordedHolds = VersionVector(record.holds)
        writeSentRecord(record, synced: false)
    }

    /// Marks this database as awaiting a fresh state (see `Store+FreshState.swift`) when it holds less of some site
    /// than the sent file records it held (``recordHolds(resetting:)``): it is an older copy of itself.
    func noteLostHistory() throws(ShoalError) {
        guard Self.isOnDisk(path) else { return }
        let record = Self.readSentRecord(path)
        let recorded = VersionVector(record.holds)
        guard !recorded.isEmpty, try !versionVector().dominatesOrEquals(recorded), try !awaitsFreshState() else {
            return
        }
        try connection.rows(
            "INSERT OR IGNORE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.freshStateKey), .integer(Int64(clamping: options.clock.nowMilliseconds()))]
        )
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_meta(key, value) VALUES (?, ?)",
            [.text(Self.freshStateFloorKey), .text(Self.freshStateFloorText(record, own: [siteID, identitySiteID]))]
        )
        options.logger.warning(
            """
            this database holds less than it held before (restored from an older copy): it takes a fresh state \
            from its first peer before its own writes leave it
            """
        )
    }

    /// What the sent file records, per site this file wrote as: the highest transaction an answer carried, and the
    /// highest a peer showed it holds.
    struct SentRecord {
        /// How far this file's own answers (and uploads, and streams) carried the site's transactions: what it holds
        /// of them up to there is the site's shared history.
        var sent: [SiteID: UInt64] = [:]
        /// How far a peer showed it holds the site's transactions, beyond what the file holds (``forkedMarker``: a
        /// peer holds one of them with other content).
        var held: [SiteID: UInt64] = [:]
        /// What this database held of every site (``Store/recordHolds(resetting:)``).
        var holds: [SiteID: UInt64] = [:]

        /// One line per site and kind: `SITE SEQ` for what was sent, `SITE SEQ held` for what a peer holds, `SITE SEQ
        /// holds` for what this database held (older builds read the first kind only, or the first two).
        var text: String {
            sent.sorted { $0.key < $1.key }.map { "\($0.key.hex) \($0.value)\n" }.joined()
                + held.sorted { $0.key < $1.key }.map { "\($0.key.hex) \($0.value) held\n" }.joined()
                + holds.sorted { $0.key < $1.key }.map { "\($0.key.hex) \($0.value) holds\n" }.joined()
        }
    }

    /// What the sent file records.
    static func readSentRecord(_ path: String) -> SentRecord {
        guard let file = fopen(sentFilePath(path), "r") else { return SentRecord() }
        defer { fclose(file) }
        var record = SentRecord()
        var buffer = [CChar](repeating: 0, count: 128)
        while fgets(&buffer, Int32(buffer.count), file) != nil {
            let fields = String(cString: buffer).split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
            guard fields.count == 2 || (fields.count == 3 && ["held", "holds"].contains(fields[2])),
                let site = SiteID(hex: fields[0]), let seq = UInt64(fields[1])
            else { continue }
            if fields.count == 3 && fields[2] == "holds" {
                record.holds[site] = max(record.holds[site] ?? 0, seq)
                continue
            }
            // Older builds wrote what a peer showed on the same line as what was sent; the fork marker is never sent.
            if fields.count == 3 || seq == forkedMarker {
                record.held[site] = max(record.held[site] ?? 0, seq)
            } else {
                record.sent[site] = max(record.sent[site] ?? 0, seq)
            }
        }
        return record
    }

    /// Per site this file wrote as, the highest transaction an answer carried or a peer showed it holds.
    static func readSent(_ path: String) -> [SiteID: UInt64] {
        let record = readSentRecord(path)
        return record.sent.merging(record.held) { max($0, $1) }
    }

    /// Whether `path` names a file of its own (not an in-memory database, nor a URI).
    static func isOnDisk(_ path: String) -> Bool { path != ":memory:" && !path.isEmpty && !path.hasPrefix("file:") }

    /// The file's inode number: another file (a copy, or a backup copied over it) has another.
    static func fileInode(_ path: String) -> Int64? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Int64(bitPattern: UInt64(info.st_ino))
    }

    /// This machine's id (`/etc/machine-id`), when it has one.
    public static func systemMachineID() -> String? {
        guard let file = fopen("/etc/machine-id", "r") else { return nil }
        defer { fclose(file) }
        var buffer = [CChar](repeating: 0, count: 64)
        guard fgets(&buffer, Int32(buffer.count), file) != nil else { return nil }
        let id = String(String(cString: buffer).filter { !$0.isWhitespace })
        return id.isEmpty ? nil : id
    }
}
