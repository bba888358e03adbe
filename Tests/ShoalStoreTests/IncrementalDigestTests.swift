import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// The digest kept with every write and apply equals a full scan, whatever happened in between.
@Suite struct IncrementalDigestTests {
    /// A value drawn from realistic shapes: every SQLite type, TEXT with NUL or invalid UTF-8, blobs from bytes to
    /// a few hundred KB (one of several MB now and then).
    static func value(_ random: inout SplitMix) -> SQLValue {
        switch random.next() % 9 {
        case 0: return .null
        case 1: return .integer(Int64(bitPattern: random.next()))
        case 2: return .real(Double(bitPattern: random.next() & 0x7FEF_FFFF_FFFF_FFFF))
        case 3: return .text("text \(random.next() % 1000) with\u{0}nul")
        case 4: return .text(String(repeating: "row body ", count: Int(random.next() % 600)))
        case 5:
            var bytes = [UInt8](repeating: 0, count: Int(random.next() % 300_000))
            for index in stride(from: 0, to: bytes.count, by: 97) { bytes[index] = UInt8(truncatingIfNeeded: index) }
            return .blob(bytes)
        case 6: return .blob(random.next() % 40 == 0 ? [UInt8](repeating: 7, count: 4_000_000) : [1, 2, 3])
        case 7: return .text(String(decoding: [0x61, 0xFF, 0xFE, 0x62], as: UTF8.self))
        default: return .integer(Int64(random.next() % 100))
        }
    }

    static func makeTables(_ store: Store) throws {
        try store.execute(
            "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, body BLOB, hits INTEGER DEFAULT 0); "
                + "CREATE TABLE tags(a TEXT, b BLOB, label, PRIMARY KEY(a, b)) WITHOUT ROWID"
        )
        try store.replicate(table: "items", counters: ["hits"])
        try store.replicate(table: "tags")
    }

    static func randomTransaction(_ store: Store, _ random: inout SplitMix) throws {
        let statements = 1 + Int(random.next() % 20)
        try store.transaction {
            for _ in 0..<statements {
                let id = Int64(random.next() % 60)
                switch random.next() % 6 {
                case 0, 1:
                    try store.execute(
                        "INSERT OR REPLACE INTO items(id, name, body) VALUES (?, ?, ?)",
                        [.integer(id), value(&random), value(&random)]
                    )
                case 2:
                    try store.execute(
                        "UPDATE items SET name = ?, hits = hits + 1 WHERE id = ?",
                        [value(&random), .integer(id)]
                    )
                case 3:
                    try store.execute("DELETE FROM items WHERE id = ?", [.integer(id)])
                case 4:
                    try store.execute(
                        "INSERT OR REPLACE INTO tags(a, b, label) VALUES (?, ?, ?)",
                        [.text("k\(id % 9)\u{0}x"), .blob([UInt8(id % 5)]), value(&random)]
                    )
                default:
                    try store.execute("DELETE FROM tags WHERE a = ?", [.text("k\(id % 9)\u{0}x")])
                }
            }
        }
    }

    @Test func incrementalDigestEqualsTheFullScanAfterWritesDeletesAppliesAndCompaction() throws {
        let directory = try temporaryDirectory("digest")
        defer { try? FileManager.default.removeItem(at: directory) }
        var random = SplitMix(state: 0x5EED_D16E)
        let stores = try (0..<3).map { index in
            var options = StoreOptions()
            options.clock = ManualWallClock(milliseconds: 1_700_000_000_000 + UInt64(index) * 7)
            return try Store(path: directory.appendingPathComponent("\(index).db").path, options: options)
        }
        for store in stores { try Self.makeTables(store) }
        for step in 0..<120 {
            let store = stores[Int(random.next() % 3)]
            switch random.next() % 5 {
            case 0, 1, 2:
                try Self.randomTransaction(store, &random)
            case 3:
                let other = stores[Int(random.next() % 3)]
                if other !== store { try sync(other, store) }
            default:
                var pass = CompactionReport()
                repeat { pass = try store.compactLog(maxEntries: 7) } while !pass.reachedEnd
            }
            // Read the digest only now and then, so the rows changed in between pile up before they are folded in.
            if random.next() % 4 == 0 {
                #expect(try store.digest() == store.fullScanDigest(), "step \(step)")
            }
        }
        for store in stores { #expect(try store.digest() == store.fullScanDigest()) }
        // Converged replicas agree on the digest too.
        for _ in 0..<2 {
            for from in stores { for to in stores where from !== to { try sync(from, to) } }
        }
        let digests = try stores.map { try $0.digest() }
        #expect(Set(digests).count == 1)
        #expect(digests[0] == (try stores[0].fullScanDigest()))
        // A fresh connection (another process's view) reads the same maintained digest without a scan.
        let reopened = try Store(path: stores[1].path)
        #expect(try reopened.digest() == digests[1])
        let pending = try reopened.execute("SELECT count(*) FROM shoal_digest_pending").rows[0][0]
        #expect(pending == .integer(0))
    }

    @Test func aDatabaseOfAnEarlierDigestFormatDropsItsRowHashesOnceAndAgreesWithAFreshCopy() throws {
        // Format 4 took a row's columns in the table's order; a database kept by it holds row hashes format 5 does
        // not compute. Opened again, it drops them once and scans: its digest is a full scan's, and a copy's.
        let directory = try temporaryDirectory("digest-format")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("old.db").path
        do {
            let store = try Store(path: path)
            try store.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, z TEXT, a BLOB, m REAL)")
            try store.replicate(table: "t")
            for key in 0..<50 {
                try store.execute("INSERT INTO t(k, z, a, m) VALUES (?, ?, ?, ?)", [
                    .integer(Int64(key)), .text("z\(key)"), .blob([UInt8(key), 0, 255]), .real(Double(key) / 7),
                ])
            }
            _ = try store.digest()
        }
        // What a build of format 4 left: its format, and row hashes that differ from this build's.
        let plain = try SQLiteConnection(path: path)
        try plain.exec("UPDATE shoal_row_hashes SET hash = zeroblob(32); UPDATE shoal_meta SET value = 4 WHERE key = 'digest_format'")
        let reopened = try Store(path: path)
        #expect(try reopened.connection.scalar("SELECT value FROM shoal_meta WHERE key = 'digest_format'").integerValue == 5)
        #expect(try reopened.digest() == reopened.fullScanDigest())
        let copy = try Store(path: directory.appendingPathComponent("copy.db").path)
        try copy.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, z TEXT, a BLOB, m REAL)")
        try copy.replicate(table: "t")
        try sync(reopened, copy)
        #expect(try copy.digest() == reopened.digest())
        #expect(try SQLiteConnection(path: path).applicationTableContents()
            == SQLiteConnection(path: directory.appendingPathComponent("copy.db").path).applicationTableContents())
        // Opened once more, nothing is dropped again: the digest is read, not scanned.
        #expect(try Store(path: path).connection.scalar("SELECT count(*) FROM shoal_row_hashes").integerValue == 50)
    }

    @Test func aDigestReadIsNotAScanAndAnIdleReadWritesNothing() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE big(id INTEGER PRIMARY KEY, v TEXT)")
        try store.replicate(table: "big")
        try store.transaction {
            let insert = try store.prepare("INSERT INTO big(id, v) VALUES (?, ?)")
            for id in 0..<20_000 { try insert.execute([.integer(Int64(id)), .text("value \(id)")]) }
        }
        let first = try store.digest()
        #expect(first.rowCount == 20_000)
        let hashes = try store.execute("SELECT count(*) FROM shoal_row_hashes").rows[0][0]
        #expect(hashes == .integer(20_000))
        // One local write: nothing extra is written for the digest (its log entry is found by sequence number),
        // and the next read folds in that one row.
        try store.execute("UPDATE big SET v = 'changed' WHERE id = 7")
        let pending = try store.execute("SELECT count(*) FROM shoal_digest_pending").rows[0][0]
        #expect(pending == .integer(0))
        let changed = try store.digest()
        #expect(changed != first && changed.rowCount == 20_000)
        #expect(changed == (try store.fullScanDigest()))
        // Nothing changed: reading again does not write (SQLite's change counter stays).
        let before = try store.execute("SELECT total_changes()").rows[0][0]
        _ = try store.digest()
        #expect(try store.execute("SELECT total_changes()").rows[0][0] == before)
        // A delete takes the row's old hash out and adds its tombstone's.
        try store.execute("DELETE FROM big WHERE id = 7")
        #expect(try store.digest() == store.fullScanDigest())
    }

    @Test func unreplicateAndReplicateAgainKeepTheDigestRight() throws {
        let store = try makeStore()
        try Self.makeTables(store)
        var random = SplitMix(state: 42)
        for _ in 0..<10 { try Self.randomTransaction(store, &random) }
        _ = try store.digest()
        try store.unreplicate(table: "tags")
        #expect(try store.digest() == store.fullScanDigest())
        try store.replicate(table: "tags")
        for _ in 0..<10 { try Self.randomTransaction(store, &random) }
        #expect(try store.digest() == store.fullScanDigest())
    }

    @Test func aFirstScanInSlicesEndsEqualToAFullScanWhateverHappensBetweenSlices() throws {
        let directory = try temporaryDirectory("digest-slices")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try Store(path: directory.appendingPathComponent("a.db").path)
        let peer = try Store(path: directory.appendingPathComponent("b.db").path)
        for target in [store, peer] {
            try target.execute(
                "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, hits INTEGER DEFAULT 0); "
                    + "CREATE TABLE tags(a TEXT, b BLOB, label, PRIMARY KEY(a, b)) WITHOUT ROWID"
            )
            try target.replicate(table: "items", counters: ["hits"])
            try target.replicate(table: "tags")
        }
        // Rows written before the digest was ever read: the first read must scan them.
        try store.execute(
            "WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < 2000) "
                + "INSERT INTO items(id, name) SELECT v * 2, 'row ' || v FROM n"
        )
        try store.execute(
            "WITH RECURSIVE n(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM n WHERE v < 300) "
                + "INSERT INTO tags(a, b, label) SELECT 'k' || (v % 7), randomblob(4), v FROM n"
        )
        var random = SplitMix(state: 8)
        var slices = 0
        // Between slices: updates, inserts below and above the scan's position, deletes, applied changes.
        while try !store.settleDigest(maxRows: 9) {
            slices += 1
            let id = Int64(random.next() % 4100)
            try store.execute("UPDATE items SET name = 'edited', hits = hits + 1 WHERE id = ?", [.integer(id)])
            try store.execute("INSERT OR IGNORE INTO items(id, name) VALUES (?, 'new')", [.integer(id | 1)])
            try store.execute("DELETE FROM items WHERE id = ?", [.integer(Int64(random.next() % 4100))])
            try peer.execute(
                "INSERT OR REPLACE INTO tags(a, b, label) VALUES (?, x'00', ?)",
                [.text("k\(random.next() % 9)"), Self.value(&random)]
            )
            for batch in try peer.changes(since: store.versionVector()) {
                try store.apply(batch.changes, claim: batch.claim)
            }
        }
        #expect(slices > 10, "the first scan took \(slices) slices")
        #expect(try store.digest() == store.fullScanDigest())
    }
}
