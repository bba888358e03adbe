import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// A write of the app's own connection made while no node ran (or held in a file copied or restored since) was
/// stamped at the time Shoal next found it, so it won over a peer's write made in between, and an old value came
/// back on every node. The capture triggers now record when each write was made, and the store stamps writes it
/// finds alone at that time. The triggers read SQLite's own clock, so these tests run their stores' clocks from the
/// machine's time (an injected clock decides only when the store looks).
@Suite struct WriteTimeCaptureTests {
    /// The machine's wall clock now, in milliseconds.
    private func machineMilliseconds() -> UInt64 { UInt64(Date().timeIntervalSince1970 * 1000) }

    private func stores(_ directory: URL, _ clock: ManualWallClock, _ names: [String]) throws -> [Store] {
        var options = StoreOptions()
        options.clock = clock
        return try names.map { name in
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path, options: options)
            try makeItems(store)
            return store
        }
    }

    /// The seqs of a store's own transactions in its change log, read outside Shoal.
    private func ownSeqs(_ store: Store) throws -> [[SQLValue]] {
        try SQLiteConnection(path: store.path).rows(
            "SELECT DISTINCT seq FROM shoal_log WHERE site = ? ORDER BY seq", [.integer(store.ownSiteIndex)]
        )
    }

    /// The clock of a store's latest own transaction, read outside Shoal.
    private func latestOwnClock(_ store: Store) throws -> HLC {
        let value = try SQLiteConnection(path: store.path).scalar(
            "SELECT hlc FROM shoal_log WHERE site = ? ORDER BY seq DESC LIMIT 1", [.integer(store.ownSiteIndex)]
        )
        return HLC(rawValue: UInt64(bitPattern: try #require(value.integerValue)))
    }

    /// The app writes while its node is down; a peer writes the same cell a minute later; the node comes back a
    /// minute after that and finds the app's write. The peer's later write stays on both, compared outside Shoal.
    @Test func aWriteMadeWhileNoNodeRanLosesToAPeersLaterWrite() throws {
        let directory = try temporaryDirectory("write-time")
        defer { try? FileManager.default.removeItem(at: directory) }
        let clock = ManualWallClock(milliseconds: machineMilliseconds())
        let stores = try stores(directory, clock, ["a", "peer"])
        let (a, peer) = (stores[0], stores[1])
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try sync(a, peer)
        let before = machineMilliseconds()
        try SQLiteConnection(path: a.path).exec("UPDATE items SET name = 'by the app' WHERE id = 1")
        let after = machineMilliseconds()
        clock.advance(by: 60_000)
        try peer.execute("UPDATE items SET name = 'by the peer' WHERE id = 1")
        clock.advance(by: 60_000)
        #expect(try a.captureForeignWrites())
        let stamped = try latestOwnClock(a).milliseconds
        #expect(stamped >= before && stamped <= after, "stamped at \(stamped), written in \(before)...\(after)")
        try sync(a, peer)
        try sync(peer, a)
        for store in [a, peer] {
            #expect(try rows(store, "SELECT name FROM items") == [[.text("by the peer")]])
        }
        #expect(try a.digest() == peer.digest())
        #expect(try sameContents(URL(fileURLWithPath: a.path), URL(fileURLWithPath: peer.path)))
    }

    /// A copy holding a write of the app's own connection not stamped yet: the original stamps it when it next
    /// writes, a peer overwrites it later. The copy stamps it, under its fresh site, at the time it was made, so the
    /// peer's later write stays on every node.
    @Test func aCopyStampsTheAppsUnstampedWriteWhenItWasMadeNotOverAPeersLaterWrite() throws {
        let directory = try temporaryDirectory("write-time-copy")
        defer { try? FileManager.default.removeItem(at: directory) }
        let clock = ManualWallClock(milliseconds: machineMilliseconds())
        let stores = try stores(directory, clock, ["a", "peer"])
        let (a, peer) = (stores[0], stores[1])
        let copyPath = directory.appendingPathComponent("copy.db")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        let app = try SQLiteConnection(path: a.path)
        try app.exec("UPDATE items SET name = 'by the app' WHERE id = 1")
        try app.exec("VACUUM INTO '\(copyPath.path)'")
        clock.advance(by: 60_000)
        #expect(try a.captureForeignWrites())
        try sync(a, peer)
        clock.advance(by: 60_000)
        try peer.execute("UPDATE items SET name = 'by the peer' WHERE id = 1")
        clock.advance(by: 60_000)
        var options = StoreOptions()
        options.clock = clock
        let copy = try Store(path: copyPath.path, options: options)
        #expect(try copy.identityChange()?.reason == .copied)
        try sync(peer, copy)
        #expect(try takeFreshState(copy, from: peer) == FreshStateReport())
        try sync(copy, peer)
        try sync(peer, a)
        for store in [a, copy, peer] {
            #expect(try rows(store, "SELECT name FROM items") == [[.text("by the peer")]])
            #expect(try store.digest() == peer.digest())
        }
        #expect(try sameContents(copyPath, URL(fileURLWithPath: peer.path)))
    }

    /// The write time moves a stamp back only: a writer whose clock ran ahead is stamped now, a row recorded by an
    /// earlier build's trigger (no time) is stamped when found, and a stamp never goes before the site's last one.
    /// Writes found when the node writes are stamped apart from its own, before them.
    @Test func aRecordedTimeOnlyEverMovesAStampBackAndNeverBeforeWhatTheFileHadSeen() throws {
        let directory = try temporaryDirectory("write-time-bounds")
        defer { try? FileManager.default.removeItem(at: directory) }
        let clock = ManualWallClock(milliseconds: machineMilliseconds())
        let a = try stores(directory, clock, ["a"])[0]
        let app = try SQLiteConnection(path: a.path)
        let found = try app.scalar("SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'shoal_outbox_%'")
        guard case .text(let outbox) = found else {
            Issue.record("no outbox: \(found)")
            return
        }
        // Ahead of the node's clock by an hour: stamped at the node's time.
        try app.exec("INSERT INTO items(id, name, qty) VALUES (1, 'ahead', 1)")
        try app.exec("UPDATE \(outbox) SET t = t + 3600000")
        clock.advance(by: 60_000)
        #expect(try a.captureForeignWrites())
        #expect(try latestOwnClock(a).milliseconds == clock.nowMilliseconds())
        // No time (an earlier build's trigger): stamped when found.
        try app.exec("INSERT INTO items(id, name, qty) VALUES (2, 'untimed', 1)")
        try app.exec("UPDATE \(outbox) SET t = NULL")
        clock.advance(by: 60_000)
        #expect(try a.captureForeignWrites())
        #expect(try latestOwnClock(a).milliseconds == clock.nowMilliseconds())
        // Made before the site's last stamp (the clock above ran two minutes ahead of the machine's): just after it.
        let last = try latestOwnClock(a)
        try app.exec("INSERT INTO items(id, name, qty) VALUES (3, 'earlier', 1)")
        clock.advance(by: 60_000)
        #expect(try a.captureForeignWrites())
        #expect(try latestOwnClock(a) == HLC(rawValue: last.rawValue + 1))
        // Found by a write of the node's own: a transaction of their own, before it and stamped when made (here, just
        // after the site's last stamp); the node's write is stamped now.
        let beforeOwn = try latestOwnClock(a)
        let seq = try #require(a.versionVector()[a.siteID])
        try app.exec("INSERT INTO items(id, name, qty) VALUES (4, 'beside', 1)")
        clock.advance(by: 60_000)
        try a.execute("INSERT INTO items(id, name, qty) VALUES (5, 'own', 1)")
        let log = try SQLiteConnection(path: a.path).rows(
            "SELECT seq, hlc FROM shoal_log WHERE site = ? AND seq > ? ORDER BY seq",
            [.integer(a.ownSiteIndex), .integer(Int64(seq))]
        )
        #expect(
            log == [
                [.integer(Int64(seq) + 1), .integer(Int64(bitPattern: beforeOwn.rawValue + 1))],
                [.integer(Int64(seq) + 2), .integer(Int64(bitPattern: HLC(milliseconds: clock.nowMilliseconds(), logical: 0).rawValue))],
            ]
        )
    }

    // MARK: - Files of earlier builds, and transactions that fail or roll back

    /// The id of table `items` in `path`.
    private func itemsID(_ path: String) throws -> Int64 {
        try #require(try SQLiteConnection(path: path).scalar("SELECT id FROM shoal_tables WHERE name = 'items'").integerValue)
    }

    /// Turns table `items` of `path` back into what capture version 2 made: no write-time column, triggers without it.
    private func makeVersion2(_ path: String) throws {
        let id = try itemsID(path)
        let raw = try RawConnection(path: path)
        let triggers = try SQLiteConnection(path: path).rows(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND name LIKE 'shoal_capture_\(id)_%' "
                + "AND instr(sql, ?) > 0",
            [.text(Store.writeTime)]
        )
        #expect(triggers.count >= 3)
        for row in triggers {
            guard case .text(let name) = row[0], case .text(let sql) = row[1] else { continue }
            try raw.exec("DROP TRIGGER \"\(name)\"")
            try raw.exec(
                sql.replacingOccurrences(of: ", t,", with: ",").replacingOccurrences(of: ", t)", with: ")")
                    .replacingOccurrences(of: ", \(Store.writeTime)", with: "")
            )
        }
        try raw.exec("ALTER TABLE shoal_outbox_\(id) DROP COLUMN t")
        try raw.exec("UPDATE shoal_meta SET value = 2 WHERE key = 'capture_version'")
    }

    /// A file of the build before (capture version 2) still opens read-only, and is upgraded when opened to write.
    @Test func aFileOfTheBuildBeforeOpensReadOnlyAndIsUpgradedWhenItMayBeWritten() throws {
        let directory = try temporaryDirectory("write-time-read-only")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        try makeItems(try Store(path: path))
        try makeVersion2(path)
        try RawConnection(path: path).exec("INSERT INTO items(id, name, qty) VALUES (1, 'by the app', 1)")
        let readOnly = try Store(path: "file:\(path)?mode=ro")
        #expect(try rows(readOnly, "SELECT name FROM items") == [[.text("by the app")]])
        let version = { () throws -> SQLValue in
            try SQLiteConnection(path: path).scalar("SELECT value FROM shoal_meta WHERE key = 'capture_version'")
        }
        #expect(try version() == .integer(2))
        let store = try Store(path: path)
        #expect(try version() == .integer(Store.captureVersion))
        // The row the earlier trigger recorded has no time: stamped when found.
        #expect(try store.captureForeignWrites())
        try RawConnection(path: path).exec("UPDATE items SET name = 'again' WHERE id = 1")
        let recorded = try SQLiteConnection(path: path).scalar("SELECT t FROM shoal_outbox_\(try itemsID(path))")
        #expect(recorded.integerValue != nil)
    }

    /// A table paused when its file was upgraded (a unique index added behind Shoal's back) kept its earlier triggers
    /// and outbox; replicated again (the index dropped), it captures and stamps the app's writes, at their time.
    @Test func aTablePausedWhenTheFileWasUpgradedCapturesWithTimesOnceItIsReplicatedAgain() throws {
        let directory = try temporaryDirectory("write-time-paused")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        try makeItems(try Store(path: path))
        try makeVersion2(path)
        let raw = try RawConnection(path: path)
        try raw.exec("CREATE UNIQUE INDEX items_name ON items(name)")
        do {
            let store = try Store(path: path)
            #expect(store.pausedTableList.map(\.name) == ["items"])
        }
        try raw.exec("DROP INDEX items_name")
        let store = try Store(path: path)
        #expect(store.pausedTableList.isEmpty)
        try raw.exec("INSERT INTO items(id, name, qty) VALUES (1, 'by the app', 1)")
        let recorded = try SQLiteConnection(path: path).scalar("SELECT t FROM shoal_outbox_\(try itemsID(path))")
        #expect(recorded.integerValue != nil)
        #expect(try store.captureForeignWrites())
        try store.execute("INSERT INTO items(id, name, qty) VALUES (2, 'own', 1)")
        #expect(try rows(store, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(2)]])
        #expect(try outboxRows(store) == 0)
    }

    /// A transaction of the node's own whose COMMIT finds an outbox it cannot stamp (a row no trigger writes) fails,
    /// and fails again when retried, its writes still waiting for their metadata: never committed without it.
    @Test func aCommitThatCannotStampTheOutboxNeverCommitsItsOwnWritesWithoutMetadata() throws {
        let directory = try temporaryDirectory("write-time-drain-error")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let outbox = Store.outboxTable(try itemsID(a.path))
        try RawConnection(path: a.path).exec("INSERT INTO \(outbox)(op, k0, changed) VALUES (9, 1, NULL)")
        try a.execute("BEGIN")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (5, 'own', 1)")
        for _ in 1...2 {
            #expect(throws: ShoalError.self) { try a.execute("COMMIT") }
            #expect(!a.connection.isAutocommit)
            #expect(a.capture.hasPendingWrites)
        }
        try a.execute("ROLLBACK")
        #expect(try rows(a, "SELECT id FROM items").isEmpty)
    }

    /// ROLLBACK TO a savepoint taken before a flush that stamped the outbox's writes apart from the transaction's own:
    /// both are undone, the outbox's writes are found again, and the node's transactions keep consecutive numbers.
    @Test func rollingBackToASavepointUndoesBothChangeSetsAndNumbersAfresh() throws {
        let directory = try temporaryDirectory("write-time-rollback-to")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try RawConnection(path: a.path).exec("UPDATE items SET name = 'by the app' WHERE id = 1")
        try a.execute("BEGIN")
        try a.execute("SAVEPOINT outer_point")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (2, 'rolled back', 1)")
        try a.execute("SAVEPOINT inner_point")
        try a.execute("ROLLBACK TO outer_point")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (3, 'kept', 1)")
        try a.execute("COMMIT")
        #expect(try outboxRows(a) == 0)
        let seqs = try ownSeqs(a)
        #expect(seqs == (1...3).map { [.integer($0)] })
        try sync(a, b)
        #expect(
            try rows(b, "SELECT id, name FROM items ORDER BY id")
                == [[.integer(1), .text("by the app")], [.integer(3), .text("kept")]]
        )
        #expect(try a.digest() == b.digest())
        #expect(try sameContents(URL(fileURLWithPath: a.path), URL(fileURLWithPath: b.path)))
    }

    /// Makes the next inserts into `a`'s change log fail (a TEMP trigger on its own connection) until `heal` is called.
    private func failLogInserts(_ a: Store) throws -> () throws -> Void {
        try a.connection.exec("CREATE TEMP TABLE failing(x)")
        try a.connection.exec("INSERT INTO temp.failing VALUES (1)")
        try a.connection.exec(
            "CREATE TEMP TRIGGER fail_log BEFORE INSERT ON main.shoal_log WHEN (SELECT count(*) FROM temp.failing) > 0 "
                + "BEGIN SELECT RAISE(ABORT, 'the disk is full'); END"
        )
        return { try a.connection.exec("DELETE FROM temp.failing") }
    }

    /// A flush that fails part-way (here its change log insert, as a full disk would) undoes what it wrote and
    /// drained: the COMMIT fails, and retried once the cause is gone, it commits the transaction's writes and the
    /// app's with their metadata. Both nodes end with the same rows, compared outside Shoal.
    @Test(arguments: [false, true])
    func aFlushThatFailsPartWayLeavesEveryWriteToTheRetriedCommit(appWrote: Bool) throws {
        let directory = try temporaryDirectory("write-time-partial-flush")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try sync(a, b)
        if appWrote { try RawConnection(path: a.path).exec("INSERT INTO items(id, name, qty) VALUES (10, 'by the app', 1)") }
        let heal = try failLogInserts(a)
        try a.execute("BEGIN")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (5, 'own', 1)")
        #expect(throws: ShoalError.self) { try a.execute("COMMIT") }
        try heal()
        try a.execute("COMMIT")
        #expect(try outboxRows(a) == 0)
        try sync(a, b)
        let expected: [[SQLValue]] = [[.integer(1)], [.integer(5)]] + (appWrote ? [[.integer(10)]] : [])
        #expect(try rows(b, "SELECT id FROM items ORDER BY id") == expected)
        #expect(try a.digest() == b.digest())
        #expect(try sameContents(URL(fileURLWithPath: a.path), URL(fileURLWithPath: b.path)))
    }

    /// ROLLBACK TO a savepoint taken after the transaction's writes were stamped (at the SAVEPOINT) undoes none of
    /// that stamp: the transaction stays one change set.
    @Test func rollingBackToASavepointAfterTheStampKeepsTheTransactionOneChangeSet() throws {
        let directory = try temporaryDirectory("write-time-rollback-to-after")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        try a.execute("BEGIN")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try a.execute("SAVEPOINT after_stamp")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (2, 'rolled back', 1)")
        try a.execute("ROLLBACK TO after_stamp")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (3, 'three', 1)")
        try a.execute("COMMIT")
        let seqs = try ownSeqs(a)
        #expect(seqs == [[.integer(1)]])
        #expect(try rows(a, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(3)]])
    }
}
