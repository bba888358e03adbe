import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

private func logEntries(_ store: Store) throws -> Int64 {
    guard case .integer(let count) = try store.execute("SELECT count(*) FROM shoal_log").rows[0][0] else { return -1 }
    return count
}

@Suite struct CompactionTests {
    /// A change-log key of one integer is kept short (a zero length, then the zigzag varint); lists written before,
    /// each key its whole encoding, are still read: a database with both serves, folds and compacts alike.
    @Test func integerLogKeysAreShortAndListsWrittenBeforeStillRead() throws {
        let table = try #require(try {
            let store = try makeStore()
            try makeItems(store)
            return store.capture.tables.first { $0.name == "items" }
        }())
        let store = try makeStore()
        for value: Int64 in [0, 1, -1, 63, -64, 1_000_000, .max, .min] {
            var list: [UInt8] = []
            store.appendLogKey([.integer(value)], to: &list)
            store.appendLogKey(.rowid(value), to: &list)
            // The form written before: the length of the whole encoding, then the encoding.
            let whole = SQLValue.encodeKey([.integer(value)])
            list.appendVarint(UInt64(whole.count))
            list += whole
            var reader = ByteReader(list)
            for _ in 0..<3 { #expect(try Store.readLogKey(&reader, table: table) == [.integer(value)]) }
            #expect(reader.isAtEnd)
        }
        var short: [UInt8] = []
        store.appendLogKey([.integer(999_999)], to: &short)
        #expect(short.count == 4)

        // A database whose lists were all written the old way reads the same as one written the new way.
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let source = try makeStore(clock)
        try makeItems(source)
        for id in 1...50 {
            clock.advance(by: 1)
            try source.execute("INSERT INTO items(id, name) VALUES (?, 'v')", [.integer(Int64(id) * 1_000 - 25_000)])
        }
        try source.execute("UPDATE items SET name = 'again' WHERE id % 2 = 0")
        let sourceTable = try #require(source.capture.tables.first { $0.name == "items" })
        let expected = try source.changes(since: VersionVector()).flatMap(\.changes)
        let digest = try source.digest()
        for row in try source.execute("SELECT site, seq, tbl, part, keys FROM shoal_log").rows {
            guard case .blob(let keys) = row[4], row[2] == .integer(sourceTable.id) else { continue }
            var reader = ByteReader(keys)
            var old: [UInt8] = []
            while !reader.isAtEnd {
                let whole = SQLValue.encodeKey(try Store.readLogKey(&reader, table: sourceTable))
                old.appendVarint(UInt64(whole.count))
                old += whole
            }
            try source.connection.rows(
                "UPDATE shoal_log SET keys = ? WHERE site = ? AND seq = ? AND tbl = ? AND part = ?",
                [.blob(old), row[0], row[1], row[2], row[3]]
            )
        }
        #expect(try source.changes(since: VersionVector()).flatMap(\.changes) == expected)
        _ = try source.compactLog()
        #expect(try source.changes(since: VersionVector()).flatMap(\.changes) == expected)
        try source.execute("UPDATE items SET qty = 7 WHERE id < 0")
        let peer = try makeStore()
        try makeItems(peer)
        for batch in try source.changes(since: VersionVector()) { try peer.apply(batch.changes, claim: batch.claim) }
        #expect(try peer.digest() == source.digest())
        #expect(digest != (try source.digest()))
    }

    @Test func overwrittenEntriesGoAndEveryAnswerStaysTheSame() throws {
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let source = try makeStore(clock)
        try makeItems(source)
        // One row rewritten 200 times, one counter bumped 50 times, a row inserted then deleted, and a
        // transaction touching two rows of which only one is overwritten later.
        try source.execute("INSERT INTO items(id, name) VALUES (1, 'v0')")
        for version in 1...200 {
            clock.advance(by: 1)
            try source.execute(
                "UPDATE items SET name = ?, qty = ? WHERE id = 1",
                [.text("v\(version)"), .integer(Int64(version))]
            )
        }
        try source.execute("INSERT INTO items(id, name) VALUES (2, 'counted')")
        for _ in 0..<50 { try source.execute("UPDATE items SET hits = hits + 1 WHERE id = 2") }
        try source.execute("INSERT INTO items(id, name) VALUES (3, 'short-lived')")
        try source.execute("DELETE FROM items WHERE id = 3")
        try source.execute("INSERT INTO items(id, name) VALUES (4, 'stays'), (5, 'moves')")
        try source.execute("UPDATE items SET name = 'moved' WHERE id = 5")

        let before = try logEntries(source)
        let vector = try source.versionVector()
        // A peer that saw the first half, and one that saw nothing: what each is sent must not change.
        let half = try makeStore()
        try makeItems(half)
        let batches = try source.changes(since: VersionVector())
        let firstHalf = batches.flatMap(\.changes).filter { $0.stamp.seq <= 100 }
        try half.apply(firstHalf)
        let halfVector = try half.versionVector()
        let answers = try [VersionVector(), halfVector].map { try source.changes(since: $0).flatMap(\.changes) }

        var passes = 0
        var report = CompactionReport()
        repeat {
            report = try source.compactLog(maxEntries: 16)
            passes += 1
        } while !report.reachedEnd
        #expect(passes > 1)
        let after = try logEntries(source)
        #expect(after < before / 4, "log entries: \(before) before, \(after) after")
        #expect(try source.versionVector() == vector)
        let compactedAnswers = try [VersionVector(), halfVector].map {
            try source.changes(since: $0).flatMap(\.changes)
        }
        #expect(compactedAnswers == answers)

        // New local writes continue the sequence (the newest entry of the site was kept), and peers converge.
        try source.execute("UPDATE items SET name = 'after compaction' WHERE id = 4")
        #expect(try source.versionVector()[source.siteID] == vector[source.siteID] + 1)
        let fresh = try makeStore()
        try makeItems(fresh)
        try sync(source, fresh)
        try sync(source, half)
        #expect(try fresh.digest() == source.digest())
        #expect(try half.digest() == source.digest())
        #expect(try fresh.versionVector() == source.versionVector())
        // A second full pass finds nothing more to drop.
        var again = CompactionReport()
        repeat { again = try source.compactLog() } while !again.reachedEnd
        #expect(again.removed == 0 && again.keysDropped == 0)
    }

    @Test func compactionRefusesToRunInsideAnOpenTransaction() throws {
        let store = try makeStore()
        try makeItems(store)
        try store.execute("BEGIN")
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'pending')")
        #expect(throws: ShoalError.self) { try store.compactLog() }
        try store.execute("COMMIT")
        #expect(try logEntries(store) == 1)
    }

    @Test func aReopenedDatabaseCompactsToo() throws {
        let path = "/tmp/shoal-compaction-\(UInt32.random(in: 0...UInt32.max)).db"
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        do {
            let store = try Store(path: path)
            try makeItems(store)
            for version in 0..<10 {
                try store.execute("INSERT OR REPLACE INTO items(id, name) VALUES (1, 'v\(version)')")
            }
        }
        let reopened = try Store(path: path)
        let digest = try reopened.digest()
        let answer = try reopened.changes(since: VersionVector()).flatMap(\.changes)
        let report = try reopened.compactLog()
        // Of the ten transactions, the first still holds the row's counter entry (no later one wrote it) and the
        // last holds everything else: the eight between go.
        #expect(report.reachedEnd && report.removed == 8, "\(report)")
        #expect(try logEntries(reopened) == 2)
        #expect(try reopened.digest() == digest)
        let reopenedAnswer: [Change] = try reopened.changes(since: VersionVector()).flatMap { $0.changes }
        #expect(reopenedAnswer == answer)
    }

    /// A transaction overwritten and dropped from the log before a peer saw it is never sent to that peer. The answer's
    /// final claim covers it; once the answer arrived whole, the peer takes that claim, and the two vectors are equal
    /// (before, the peer kept that site lower until it wrote again, and the link never settled).
    @Test func aTransactionDroppedBeforeAPeerSawItIsClaimedThereOnceTheAnswerArrivesWhole() throws {
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let (a, b, c, late) = try (makeStore(clock), makeStore(clock), makeStore(clock), makeStore(clock))
        for store in [a, b, c, late] { try makeItems(store) }
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'first'), (2, 'kept')")  // a:1
        clock.advance(by: 1)
        try a.execute("UPDATE items SET name = 'second' WHERE id = 1")  // a:2, overwritten below
        try sync(a, b)
        clock.advance(by: 1)
        try b.execute("UPDATE items SET name = 'third' WHERE id = 1")  // b:1
        try sync(b, a)
        var report = CompactionReport()
        repeat { report = try a.compactLog() } while !report.reachedEnd
        let answer = try a.changes(since: VersionVector())
        #expect(!answer.flatMap(\.changes).contains { $0.stamp.dot == Dot(site: a.siteID, seq: 2) })
        #expect(answer.last?.claim[a.siteID] == 2)

        try sync(a, c)
        #expect(try c.versionVector() == a.versionVector())
        #expect(try c.digest() == a.digest())

        // The same answer not known to be whole (its end never came) claims only what its changes prove.
        for batch in answer { try late.apply(batch.changes, claim: batch.claim) }
        #expect(try late.versionVector()[a.siteID] == 1)
        #expect(try late.digest() == a.digest())
    }

    /// A database whose change log was written before entries had parts opens with every entry as its part 0, and
    /// answers exactly as before.
    @Test func aChangeLogWithoutPartsIsMigratedOnOpen() throws {
        let directory = try temporaryDirectory("log-parts")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("old.db").path
        let answer: [Change]
        let digest: StateDigest
        do {
            let store = try makeFileStore(directory, "old")
            try store.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
            try store.execute("UPDATE items SET qty = 3 WHERE id = 2")
            answer = try store.changes(since: VersionVector()).flatMap { $0.changes }
            digest = try store.digest()
        }
        let raw = try RawConnection(path: path)
        try raw.exec(
            """
            BEGIN;
            CREATE TABLE old_log(
                site INTEGER NOT NULL, seq INTEGER NOT NULL, tbl INTEGER NOT NULL, hlc INTEGER NOT NULL,
                keys BLOB NOT NULL, PRIMARY KEY(site, seq, tbl)) WITHOUT ROWID;
            INSERT INTO old_log SELECT site, seq, tbl, hlc, keys FROM shoal_log;
            DROP TABLE shoal_log;
            ALTER TABLE old_log RENAME TO shoal_log;
            COMMIT;
            """
        )
        let reopened = try Store(path: path)
        let parts = try reopened.execute("SELECT count(*) FROM pragma_table_info('shoal_log') WHERE name = 'part'")
        #expect(parts.rows == [[SQLValue.integer(1)]])
        let reopenedAnswer: [Change] = try reopened.changes(since: VersionVector()).flatMap { $0.changes }
        #expect(reopenedAnswer == answer)
        #expect(try reopened.digest() == digest)
        try reopened.execute("UPDATE items SET name = 'later' WHERE id = 1")
        #expect(try reopened.versionVector()[reopened.siteID] == 3)
    }
}
