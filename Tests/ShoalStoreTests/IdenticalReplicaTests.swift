import CSQLite
import Foundation
import ShoalTestSupport
import Synchronization
import Testing

@testable import ShoalCore
@testable import ShoalStore

extension RawConnection {
    /// Turns triggers off on this connection: its writes then bypass Shoal's capture, as a tool that edits the file
    /// without running triggers would.
    func bypassCapture() {
        shoal_db_config_flag(handle, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
    }
}

/// The application tables of two database files, compared outside Shoal.
func sameContents(_ first: URL, _ second: URL) throws -> Bool {
    try SQLiteConnection(path: first.path).applicationTableContents()
        == SQLiteConnection(path: second.path).applicationTableContents()
}

@Suite struct IdenticalReplicaTests {
    // MARK: - The digest sees every difference

    /// Tombstones are collected at different times on different nodes: a node that keeps one and a node that never
    /// had it (or collected it) hold the same rows, and have the same digest, kept or scanned. A deleted row that
    /// comes back, or one deleted on one side only, still tells them apart.
    @Test func aTombstoneCountsForNothingInTheDigest() throws {
        let directory = try temporaryDirectory("digest-tombstones")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1), (2, 'two', 2)")
        try a.execute("INSERT INTO pairs VALUES ('k', 1, x'00ff')")
        _ = try sync(a, b)
        try a.execute("INSERT INTO items(id, name) VALUES (3, 'gone')")
        try a.execute("DELETE FROM items WHERE id = 3")
        try a.execute("DELETE FROM pairs WHERE a = 'k'")
        try b.execute("DELETE FROM pairs WHERE a = 'k'")
        #expect(try a.status().tables.first { $0.name == "items" }?.tombstones == 1)
        #expect(try b.status().tables.first { $0.name == "items" }?.tombstones == 0)
        #expect(try a.digest() == b.digest())
        #expect(try a.fullScanDigest() == b.fullScanDigest())
        #expect(try a.fullScanDigest() == a.digest())
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db")))
        // A row deleted on one side only differs.
        try b.execute("DELETE FROM items WHERE id = 2")
        #expect(try a.digest() != b.digest())
    }

    @Test func theDigestAndVerifySeeDataRowsThatDisagreeWithTheirMetadata() throws {
        let directory = try temporaryDirectory("digest-presence")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try a.execute("INSERT INTO pairs VALUES ('k', 1, NULL)")
        try a.execute("DELETE FROM items WHERE id = 3")
        try sync(a, b)
        #expect(try a.digest() == b.digest())
        #expect(try a.fullScanDigest() == b.fullScanDigest())
        #expect(try a.verify().isConsistent)

        // A live row whose data row is gone differs from one whose values are NULL, and from the peer's.
        let raw = try RawConnection(path: directory.appendingPathComponent("a.db").path)
        raw.bypassCapture()
        try raw.exec("DELETE FROM pairs WHERE a = 'k'")
        #expect(try a.fullScanDigest() != b.fullScanDigest())
        try raw.exec("DELETE FROM items WHERE id = 1")
        try raw.exec("INSERT INTO items(id, name) VALUES (3, 'ghost')")
        try raw.exec("INSERT INTO items(id, name) VALUES (4, 'stray')")
        #expect(try a.fullScanDigest() != b.fullScanDigest())
        let report = try a.verify()
        #expect(!report.isConsistent)
        #expect(report.mismatchCount == 4)
        #expect(
            Set(report.mismatches) == [
                RowMismatch(table: "pairs", primaryKey: [.text("k"), .integer(1)], kind: .liveRowWithoutData),
                RowMismatch(table: "items", primaryKey: [.integer(1)], kind: .liveRowWithoutData),
                RowMismatch(table: "items", primaryKey: [.integer(3)], kind: .deletedRowWithData),
                RowMismatch(table: "items", primaryKey: [.integer(4)], kind: .dataWithoutMetadata),
            ]
        )
        #expect(report.mismatches.allSatisfy { !$0.remedy.isEmpty })
        #expect(try b.verify().isConsistent)
        // A value changed behind Shoal's back is named too, with the row.
        try raw.exec("UPDATE items SET name = 'tampered' WHERE id = 2")
        let changed = try a.verify()
        #expect(changed.mismatches.contains(RowMismatch(table: "items", primaryKey: [.integer(2)], kind: .valuesChangedUncaptured)))
        #expect(changed.mismatchCount == 5)
        // Once the maintained digest looks at the rows again (a write to them), it differs as well.
        try a.execute("UPDATE items SET qty = 7 WHERE id IN (1, 2)")
        try b.execute("UPDATE items SET qty = 7 WHERE id IN (1, 2)")
        #expect(try a.digest() != b.digest())
    }

    /// `verify` reads one snapshot in which every change is folded into the digest: a node (another Shoal
    /// connection on the file) and the app committing all the while never make a row look changed without being
    /// captured. It once folded, then scanned, and a commit in between showed as such a mismatch (horizon chaos runs
    /// found it on the floors and member reports a running node writes after convergence).
    @Test func verifyBesideANodeAndTheAppWritingFindsNoMismatch() throws {
        let directory = try temporaryDirectory("verify-snapshot")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try makeFileStore(directory, "a")
        try store.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1), (2, 'two', 2)")
        let path = directory.appendingPathComponent("a.db").path
        let stop = Mutex(false)
        let commits = Mutex(0)
        let failures = Mutex<[String]>([])
        let writers = DispatchGroup()
        let writes: [@Sendable (Int) throws -> Void] = [
            { _ in
                // A node's connection: captured as it commits.
                let node = try Store(path: path)
                while !stop.withLock({ $0 }) {
                    try node.execute("UPDATE items SET qty = qty + 1 WHERE id = 1")
                    commits.withLock { $0 += 1 }
                }
            },
            { _ in
                // The app's connection: captured by whichever Shoal connection looks next.
                let app = try RawConnection(path: path)
                var round = 0
                while !stop.withLock({ $0 }) {
                    round += 1
                    try app.exec("UPDATE items SET name = 'app \(round)' WHERE id = 2")
                    commits.withLock { $0 += 1 }
                }
            },
        ]
        for (index, write) in writes.enumerated() {
            DispatchQueue.global().async(group: writers) {
                do { try write(index) } catch { failures.withLock { $0.append("\(error)") } }
            }
        }
        var inconsistent: [RowMismatch] = []
        var looks = 0
        while looks < 40 || commits.withLock({ $0 }) < 40 {
            looks += 1
            let report = try store.verify(limit: 5)
            if !report.isConsistent { inconsistent += report.mismatches }
            if looks > 2_000 { break }
        }
        stop.withLock { $0 = true }
        writers.wait()
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
        #expect(commits.withLock { $0 } >= 40)
        #expect(inconsistent.isEmpty, "\(inconsistent)")
        #expect(try store.verify().isConsistent)
    }

    // MARK: - Apply stamps the app's writes first

    @Test func anOfflineApplyBesideTheAppsOwnWritesLosesNothing() throws {
        let directory = try temporaryDirectory("offline-apply-stamps")
        defer { try? FileManager.default.removeItem(at: directory) }
        let aURL = directory.appendingPathComponent("a.db")
        let bURL = directory.appendingPathComponent("b.db")
        do {
            let a = try makeFileStore(directory, "a")
            let b = try makeFileStore(directory, "b")
            try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1), (2, 'two', 2)")
            try sync(a, b)
            // The peer writes first, offline.
            try b.execute("UPDATE items SET name = 'remote' WHERE id = 1")
            try b.execute("DELETE FROM items WHERE id = 2")
        }
        // Later, the app writes through its own connection; no Shoal process has stamped it yet.
        let app = try RawConnection(path: aURL.path)
        try app.exec("UPDATE items SET name = 'app' WHERE id = 1")
        try app.exec("UPDATE items SET qty = 99 WHERE id = 2")
        // Then the peer's changes are applied with the real binaries, and back.
        try pipeChanges(from: bURL, to: aURL)
        try pipeChanges(from: aURL, to: bURL)
        try pipeChanges(from: bURL, to: aURL)
        #expect(try sameContents(aURL, bURL))
        let a = try Store(path: aURL.path)
        // The later write (the app's) wins on both nodes, and the conflict is on record.
        #expect(try rows(a, "SELECT name FROM items WHERE id = 1") == [[.text("app")]])
        #expect(try a.conflicts().contains { Set([$0.localValue, $0.remoteValue]) == [.text("app"), .text("remote")] })
        // The delete wins over the concurrent update: no row of NULLs comes back anywhere.
        #expect(try rows(a, "SELECT count(*) FROM items WHERE id = 2") == [[.integer(0)]])
        #expect(try a.verify().isConsistent)
        #expect(try Store(path: bURL.path).verify().isConsistent)
    }

    @Test func aStampNeverBringsBackARowWhoseDataIsGone() throws {
        let directory = try temporaryDirectory("stamp-gone-row")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try sync(a, b)
        let app = try RawConnection(path: directory.appendingPathComponent("a.db").path)
        try app.exec("UPDATE items SET qty = 5 WHERE id = 1")
        // The row then goes behind Shoal's back, before the update was stamped.
        let tool = try RawConnection(path: directory.appendingPathComponent("a.db").path)
        tool.bypassCapture()
        try tool.exec("DELETE FROM items WHERE id = 1")
        #expect(try a.captureForeignWrites())
        try sync(a, b)
        try sync(b, a)
        // The update of a row that is gone is its delete: no row of NULLs on the other node.
        #expect(try rows(b, "SELECT count(*) FROM items") == [[.integer(0)]])
        #expect(
            try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db"))
        )
        #expect(try a.digest() == b.digest())
    }

    // MARK: - What a sender claims is what it sent

    /// Who rewrites a row while the answer is read: the app's own connection (this store stamps it), or another
    /// process's store on the same file (`shoal sql` beside `shoal serve`: it stamps the write itself).
    enum Rewriter: CaseIterable { case appConnection, otherStore }

    @Test(arguments: Rewriter.allCases)
    func anAnswerNeverClaimsATransactionPartOfWhichWasOverwrittenWhileItWasRead(_ rewriter: Rewriter) throws {
        let directory = try temporaryDirectory("claim-snapshot")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        let d = try makeFileStore(directory, "d")
        for id in 1...20 { try a.execute("INSERT INTO items(id, name, qty) VALUES (\(id), 'row \(id)', \(id))") }
        // d holds all of a's writes so far.
        try sync(a, d)
        // a answers b a batch at a time; between two batches the app overwrites a row of a later transaction.
        let cursor = try a.deltaCursor(since: try b.versionVector())
        var batches: [ChangeBatch] = []
        if let first = try a.nextBatch(cursor, maxChanges: 9) { batches.append(first) }
        switch rewriter {
        case .appConnection:
            let app = try RawConnection(path: directory.appendingPathComponent("a.db").path)
            try app.exec("UPDATE items SET name = 'app' WHERE id = 15")
            #expect(try a.captureForeignWrites())
        case .otherStore:
            let other = try Store(path: directory.appendingPathComponent("a.db").path)
            try other.execute("UPDATE items SET name = 'app' WHERE id = 15")
        }
        while let batch = try a.nextBatch(cursor, maxChanges: 9) { batches.append(batch) }
        var received: [SiteID: UInt64] = [:]
        for batch in batches {
            // Every change sent lies within what the answer claims in the end.
            for change in batch.changes { #expect(change.stamp.seq <= batches.last!.claim[change.stamp.site]) }
            received.merge(try b.apply(batch.changes, claim: batch.claim, received: received).acceptedHighest) {
                max($0, $1)
            }
        }
        // a is lost before the next round: b and d, which both hold a's first 20 writes or a claim of them, meet.
        try sync(b, d)
        try sync(d, b)
        #expect(try sameContents(directory.appendingPathComponent("b.db"), directory.appendingPathComponent("d.db")))
        #expect(try b.digest() == d.digest())
        // The answer carried the rewrite (its site came after the batch that was cut): b holds it, and claims it.
        #expect(try rows(b, "SELECT name FROM items WHERE id = 15") == [[.text("app")]])
        #expect(try b.versionVector()[a.siteID] == 21)
    }

    /// Who keeps rewriting a hot row during a catch-up: the app's connection, or a third peer's batches.
    enum HotWriter: CaseIterable { case appConnection, thirdPeer }

    @Test(arguments: HotWriter.allCases)
    func aCatchUpFromANodeWhoseRowKeepsBeingRewrittenClaimsWhatItSent(_ writer: HotWriter) throws {
        let directory = try temporaryDirectory("claim-hot-row")
        defer { try? FileManager.default.removeItem(at: directory) }
        let sender = try makeFileStore(directory, "sender")
        let receiver = try makeFileStore(directory, "receiver")
        let peer = try makeFileStore(directory, "peer")
        // 300 transactions write the hot row, every tenth a row of its own too; compaction drops the overwritten.
        for id in 1...300 {
            let own = id % 10 == 0 ? "INSERT INTO items(id, name, qty) VALUES (\(id), 'row \(id)', \(id)); " : ""
            try sender.execute(
                "BEGIN; INSERT OR REPLACE INTO items(id, name, qty) VALUES (0, 'hot \(id)', \(id)); \(own)COMMIT"
            )
        }
        #expect(try sender.compactLog().removed > 0)
        try sync(sender, peer)
        let app = try RawConnection(path: directory.appendingPathComponent("sender.db").path)
        let start = try sender.versionVector()
        // Several rounds, each a catch-up of 40 changes a batch; the hot row is rewritten between any two batches.
        var write = 0
        for _ in 0..<3 {
            let cursor = try sender.deltaCursor(since: try receiver.versionVector())
            var received: [SiteID: UInt64] = [:]
            while let batch = try sender.nextBatch(cursor, maxChanges: 40) {
                let report = try receiver.apply(batch.changes, claim: batch.claim, received: received)
                received.merge(report.acceptedHighest) { max($0, $1) }
                write += 1
                switch writer {
                case .appConnection:
                    try app.exec("UPDATE items SET name = 'app \(write)' WHERE id = 0")
                case .thirdPeer:
                    try peer.execute("UPDATE items SET name = 'peer \(write)' WHERE id = 0")
                    try sync(peer, sender)
                }
            }
            // Each answer claims at least what the sender held when it opened, however often the row was rewritten.
            #expect(try receiver.versionVector().dominatesOrEquals(start))
        }
        // With the writes paused, one more round leaves both files the same, outside Shoal too.
        try sync(sender, receiver)
        #expect(try receiver.versionVector() == sender.versionVector())
        #expect(try receiver.digest() == sender.digest())
        #expect(
            try sameContents(directory.appendingPathComponent("receiver.db"), directory.appendingPathComponent("sender.db"))
        )
    }

    /// How a later transaction of another site overwrites part of an earlier one.
    enum Overwrite: CaseIterable {
        /// A later write of one of its columns (the earlier transaction still holds the rest of the row).
        case column
        /// A delete and a new insert (a new life resets every cell), then compaction drops the earlier transaction
        /// from the log altogether.
        case newLifeAndCompaction
    }

    @Test func anAnswerNeverClaimsATransactionOverwrittenByAWriteItHoldsWithoutItsClaim() throws {
        let directory = try temporaryDirectory("claim-unclaimed-overwriter")
        defer { try? FileManager.default.removeItem(at: directory) }
        let first = try makeFileStore(directory, "first")
        let second = try makeFileStore(directory, "second")
        let sender = try makeFileStore(directory, "sender")
        let receiver = try makeFileStore(directory, "receiver")
        let bystander = try makeFileStore(directory, "bystander")
        try first.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        for store in [second, sender, bystander] { try sync(first, store) }
        // The second writer deletes the row; the sender holds the delete without its claim (a catch-up still under
        // way, whose claim comes with a later batch).
        try second.execute("DELETE FROM items WHERE id = 1")
        try sender.apply(try second.changes(since: try sender.versionVector()).flatMap(\.changes))
        #expect(!(try sender.versionVector()).covers(Dot(site: second.siteID, seq: 1)))
        // The sender answers the receiver: when it claims the first writer's insert, which the delete overwrote, the
        // receiver holds the delete (sent beside it, unclaimed): never a claim of a write it holds neither itself nor
        // what beat it.
        try sync(sender, receiver)
        if try receiver.versionVector().covers(Dot(site: first.siteID, seq: 1)) {
            #expect(try rows(receiver, "SELECT name FROM items WHERE id = 1").isEmpty)
        }
        // Once the deleting writer is heard, everyone ends the same.
        for store in [receiver, bystander, sender] { try sync(second, store) }
        try sync(receiver, bystander)
        try sync(bystander, receiver)
        #expect(
            try sameContents(directory.appendingPathComponent("receiver.db"), directory.appendingPathComponent("bystander.db"))
        )
        #expect(try receiver.digest() == bystander.digest())
        #expect(try rows(receiver, "SELECT name FROM items WHERE id = 1").isEmpty)
    }

    @Test(arguments: Overwrite.allCases)
    func aBatchNeverClaimsATransactionWhoseOverwriterItHasNotSentYet(_ overwrite: Overwrite) throws {
        let directory = try temporaryDirectory("claim-overwriter")
        defer { try? FileManager.default.removeItem(at: directory) }
        // The writer whose site an answer reaches first writes first, so that what overwrites it comes later.
        let pair = [try makeFileStore(directory, "w1"), try makeFileStore(directory, "w2")].sorted {
            $0.siteID < $1.siteID
        }
        let (first, second) = (pair[0], pair[1])
        let sender = try makeFileStore(directory, "sender")
        let receiver = try makeFileStore(directory, "receiver")
        let bystander = try makeFileStore(directory, "bystander")
        try first.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        try first.execute("INSERT INTO items(id, name, qty) VALUES (2, 'two', 2)")
        try sync(first, bystander)
        try sync(first, second)
        switch overwrite {
        case .column:
            try second.execute("UPDATE items SET name = 'ONE' WHERE id = 1")
        case .newLifeAndCompaction:
            try second.execute("DELETE FROM items WHERE id = 1")
            try second.execute("INSERT INTO items(id, name, qty) VALUES (1, 'uno', 10)")
        }
        try sync(first, sender)
        try sync(second, sender)
        if overwrite == .newLifeAndCompaction {
            #expect(try sender.compactLog().removed == 1)
        }
        // The sender answers the receiver one transaction per batch, and is lost after the first batch.
        let cursor = try sender.deltaCursor(since: try receiver.versionVector())
        let batch = try #require(try sender.nextBatch(cursor, maxChanges: 1))
        let firstReport = try receiver.apply(batch.changes, claim: batch.claim)
        #expect(!batch.claim.covers(Dot(site: first.siteID, seq: 1)))
        // The receiver meets the bystander, which holds the first writer's transactions and not what overwrote them.
        try sync(bystander, receiver)
        try sync(receiver, bystander)
        #expect(
            try sameContents(
                directory.appendingPathComponent("receiver.db"),
                directory.appendingPathComponent("bystander.db")
            )
        )
        #expect(try receiver.digest() == bystander.digest())
        #expect(try receiver.verify(limit: 10).isConsistent)
        // The rest of the answer, once the sender is back, brings everyone to the overwrite.
        var received = firstReport.acceptedHighest
        while let batch = try sender.nextBatch(cursor, maxChanges: 1) {
            received.merge(try receiver.apply(batch.changes, claim: batch.claim, received: received).acceptedHighest) {
                max($0, $1)
            }
        }
        #expect(try receiver.versionVector() == sender.versionVector())
        #expect(try receiver.digest() == sender.digest())
        #expect(
            try sameContents(directory.appendingPathComponent("receiver.db"), directory.appendingPathComponent("sender.db"))
        )
    }

    /// Which nodes take a table out of replication and back.
    enum ReReplicated: CaseIterable {
        case everyNode
        case oneNode
    }

    @Test(arguments: ReReplicated.allCases)
    func replicatingATableAgainNeverMultipliesItsCounters(_ who: ReReplicated) throws {
        let directory = try temporaryDirectory("re-replicate")
        defer { try? FileManager.default.removeItem(at: directory) }
        let names = ["a", "b", "c"]
        let stores = try names.map { name in
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
            try store.execute("CREATE TABLE tally(k INTEGER PRIMARY KEY, label TEXT, n INTEGER NOT NULL DEFAULT 0)")
            try store.replicate(table: "tally", counters: ["n"])
            return store
        }
        func syncAll() throws {
            for _ in 0..<2 {
                for from in stores { for to in stores where to !== from { try sync(from, to) } }
            }
        }
        try stores[0].execute("INSERT INTO tally(k, label) VALUES (1, 'one'), (2, 'two'), (3, 'three')")
        try syncAll()
        // Contributions from every node: row 1 reads 4, row 2 reads 2.
        try stores[0].execute("UPDATE tally SET n = n + 1 WHERE k = 1")
        try stores[1].execute("UPDATE tally SET n = n + 2 WHERE k = 1")
        try stores[2].execute("UPDATE tally SET n = n + 1 WHERE k IN (1, 2)")
        try stores[1].execute("UPDATE tally SET n = n + 1 WHERE k = 2")
        try syncAll()
        let again = who == .everyNode ? stores : [stores[1]]
        for store in again { try store.unreplicate(table: "tally") }
        // While it is not replicated, the app on the node taken out adds 10 to row 1, deletes row 3 and adds row 4.
        let app = try RawConnection(path: directory.appendingPathComponent("b.db").path)
        try app.exec("UPDATE tally SET n = n + 10 WHERE k = 1")
        try app.exec("DELETE FROM tally WHERE k = 3")
        try app.exec("INSERT INTO tally(k, label, n) VALUES (4, 'four', 7)")
        for store in again { try store.replicate(table: "tally", counters: ["n"]) }
        try syncAll()
        for (name, store) in zip(names, stores) {
            #expect(
                try rows(store, "SELECT k, n FROM tally ORDER BY k")
                    == [[.integer(1), .integer(14)], [.integer(2), .integer(2)], [.integer(4), .integer(7)]],
                "node \(name)"
            )
            #expect(try store.verify(limit: 10).isConsistent, "node \(name)")
            #expect(try store.digest() == stores[0].digest(), "node \(name)")
        }
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db")))
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("c.db")))
        // Later increments still add up once.
        try stores[2].execute("UPDATE tally SET n = n + 1 WHERE k = 1")
        try stores[0].execute("UPDATE tally SET n = n + 1 WHERE k = 4")
        try syncAll()
        for store in stores {
            #expect(
                try rows(store, "SELECT k, n FROM tally ORDER BY k")
                    == [[.integer(1), .integer(15)], [.integer(2), .integer(2)], [.integer(4), .integer(8)]]
            )
        }
    }

    @Test func replicatingAgainWithOtherCountersIsRefusedUntilTheHistoryIsForgotten() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE tally(k INTEGER PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)")
        try store.replicate(table: "tally", counters: ["n"])
        try store.execute("INSERT INTO tally(k, n) VALUES (1, 11)")
        try store.unreplicate(table: "tally")
        // Without the counter, n's per-site contributions would be lost, and a later replicate with it would count
        // the whole value as this node's.
        let refusal = try #require(shoalError { try store.replicate(table: "tally") })
        #expect(refusal.code == .unsupportedSchema && refusal.message.contains("--counter n"), "\(refusal.message)")
        _ = try store.replicate(table: "tally", counters: ["n"])
        try store.unreplicate(table: "tally")
        #expect(try store.forgetReplicationHistory(of: "tally"))
        _ = try store.replicate(table: "tally")
        #expect(try rows(store, "SELECT n FROM tally") == [[.integer(11)]])
    }

    @Test func nodesSeededWithTheSameCounterValuesCountThemOnce() throws {
        let directory = try temporaryDirectory("counter-seeds")
        defer { try? FileManager.default.removeItem(at: directory) }
        // Three devices start from the same file (stock counts shipped with the app), one from other counts, one
        // empty; each replicates the table on its own, offline.
        func device(_ name: String, seed: String?) throws -> Store {
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
            try store.execute("CREATE TABLE stock(item TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0, label TEXT)")
            if let seed { try store.execute("INSERT INTO stock(item, n, label) VALUES \(seed)") }
            #expect(try store.replicate(table: "stock", counters: ["n"]).isEmpty)
            return store
        }
        let shipped = "('apple', 4, 'Apple'), ('pear', 0, 'Pear'), ('fig', -2, 'Fig')"
        let alike = try ["a", "b", "c"].map { try device($0, seed: shipped) }
        let other = try device("other", seed: "('apple', 10, 'Apple')")
        let empty = try device("empty", seed: nil)
        #expect(try rows(alike[0], "SELECT item, n FROM stock ORDER BY item") == rows(alike[1], "SELECT item, n FROM stock ORDER BY item"))
        try alike[1].execute("UPDATE stock SET n = n + 1 WHERE item = 'apple'")
        try alike[2].execute("UPDATE stock SET n = n - 1 WHERE item = 'fig'")
        // The devices seeded alike meet (and the empty one): the seed counts once, the increments add.
        let group = alike + [empty]
        for _ in 0..<2 { for from in group { for to in group where to !== from { try sync(from, to) } } }
        for store in group {
            #expect(
                try rows(store, "SELECT item, n FROM stock ORDER BY item")
                    == [[.text("apple"), .integer(5)], [.text("fig"), .integer(-3)], [.text("pear"), .integer(0)]]
            )
            #expect(try store.digest() == alike[0].digest())
            #expect(try store.verify().isConsistent)
        }
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("empty.db")))
        // A device seeded with other counts contributes them, as any device's own counts add up.
        try sync(other, alike[0])
        try sync(alike[0], other)
        #expect(try rows(other, "SELECT n FROM stock WHERE item = 'apple'") == [[.integer(15)]])
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("other.db")))
        #expect(try other.digest() == alike[0].digest())
    }

    // MARK: - What a merge can break is refused at replicate

    @Test func checksAFieldLevelMergeCouldBreakAreRefusedAtReplicate() throws {
        let store = try makeStore()
        try store.execute("CREATE TABLE ranges(id INTEGER PRIMARY KEY, lo INTEGER, hi INTEGER, CHECK (lo <= hi))")
        let across = try #require(shoalError { try store.replicate(table: "ranges") })
        #expect(across.code == .unsupportedSchema)
        #expect(across.message.contains("lo <= hi") && across.message.contains("hi, lo"))
        try store.execute(
            "CREATE TABLE stock(id INTEGER PRIMARY KEY, left INTEGER NOT NULL DEFAULT 0 CHECK (\"left\" >= 0))"
        )
        let counter = try #require(shoalError { try store.replicate(table: "stock", counters: ["left"]) })
        #expect(counter.message.contains("counter"))
        // A CHECK of one plain column holds for every value a node wrote, and so for any merge of them.
        try store.execute("CREATE TABLE sizes(id INTEGER PRIMARY KEY, size INTEGER CHECK (size >= 0), label TEXT)")
        try store.replicate(table: "sizes")
        // Nothing was left half replicated by the refusals.
        #expect(try store.replicatedTables() == ["sizes"])
    }

    // MARK: - The app's triggers

    @Test func appTriggersRunWhereTheAppWritesAndNeverAgainOnApply() throws {
        let directory = try temporaryDirectory("app-triggers")
        defer { try? FileManager.default.removeItem(at: directory) }
        var stores: [Store] = []
        for name in ["a", "b"] {
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
            try store.execute(
                """
                CREATE TABLE orders(id TEXT PRIMARY KEY, qty INTEGER NOT NULL DEFAULT 0, note TEXT,
                    edits INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE audit(id TEXT PRIMARY KEY, order_id TEXT, what TEXT);
                CREATE TABLE totals(k INTEGER PRIMARY KEY, total INTEGER NOT NULL DEFAULT 0);
                INSERT INTO totals(k, total) VALUES (1, 0);
                """
            )
            try store.replicate(table: "orders")
            try store.replicate(table: "audit")
            try store.replicate(table: "totals", counters: ["total"])
            stores.append(store)
        }
        let (a, b) = (stores[0], stores[1])
        try a.execute("INSERT OR IGNORE INTO totals(k) VALUES (1)")
        try sync(a, b)
        try sync(b, a)
        for store in stores {
            try store.execute(
                """
                CREATE TRIGGER orders_audit AFTER INSERT ON orders BEGIN
                    INSERT INTO audit VALUES (lower(hex(randomblob(16))), NEW.id, 'insert'); END;
                CREATE TRIGGER orders_total AFTER INSERT ON orders BEGIN
                    UPDATE totals SET total = total + NEW.qty WHERE k = 1; END;
                CREATE TRIGGER orders_edits AFTER UPDATE OF note ON orders BEGIN
                    UPDATE orders SET edits = edits + 1 WHERE id = NEW.id; END;
                """
            )
        }
        // Writes through Shoal's connection on a and b, and through the app's own connection on a.
        try a.execute("INSERT INTO orders(id, qty) VALUES ('a1', 3), ('a2', 4)")
        try b.execute("INSERT INTO orders(id, qty) VALUES ('b1', 10)")
        let app = try RawConnection(path: directory.appendingPathComponent("a.db").path)
        try app.exec("INSERT INTO orders(id, qty) VALUES ('app1', 100)")
        try app.exec("UPDATE orders SET note = 'checked' WHERE id = 'a1'")
        try a.execute("UPDATE orders SET note = 'again' WHERE id = 'a1'")
        for _ in 0..<2 {
            try sync(a, b)
            try sync(b, a)
        }
        #expect(
            try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db"))
        )
        #expect(try a.digest() == b.digest())
        // One audit row per insert, the running total counts each insert once, one edit counted per update.
        #expect(try rows(b, "SELECT count(*) FROM audit") == [[.integer(4)]])
        #expect(try rows(b, "SELECT total FROM totals") == [[.integer(117)]])
        #expect(try rows(b, "SELECT edits FROM orders WHERE id = 'a1'") == [[.integer(2)]])
        #expect(try a.verify().isConsistent && b.verify().isConsistent)
    }

    @Test func aRaiseTriggerAMergeWouldTripNeverWedgesTheLink() throws {
        let a = try makeStore()
        let b = try makeStore()
        for store in [a, b] {
            try store.execute("CREATE TABLE ranges(id INTEGER PRIMARY KEY, lo INTEGER, hi INTEGER)")
            try store.replicate(table: "ranges")
            try store.execute(
                "CREATE TRIGGER ranges_order BEFORE UPDATE ON ranges WHEN NEW.lo > NEW.hi "
                    + "BEGIN SELECT RAISE(ABORT, 'lo must not exceed hi'); END"
            )
        }
        try a.execute("INSERT INTO ranges VALUES (1, 0, 10)")
        try sync(a, b)
        // Two valid edits, each checked where it was made; their field-level merge is (lo 8, hi 4).
        try a.execute("UPDATE ranges SET lo = 8 WHERE id = 1")
        try b.execute("UPDATE ranges SET hi = 4 WHERE id = 1")
        try sync(a, b)
        try sync(b, a)
        #expect(try rows(a, "SELECT lo, hi FROM ranges") == [[.integer(8), .integer(4)]])
        #expect(try rows(b, "SELECT lo, hi FROM ranges") == [[.integer(8), .integer(4)]])
        #expect(try a.digest() == b.digest())
        // Later changes keep flowing both ways.
        try a.execute("INSERT INTO ranges VALUES (2, 1, 2)")
        try b.execute("INSERT INTO ranges VALUES (3, 1, 2)")
        try sync(a, b)
        try sync(b, a)
        #expect(try rows(a, "SELECT count(*) FROM ranges") == [[.integer(3)]])
        #expect(try a.digest() == b.digest())
        // The app's own writes still meet its trigger.
        #expect(throws: ShoalError.self) { try a.execute("UPDATE ranges SET lo = 9 WHERE id = 2") }
    }

    // MARK: - Counters past Int64

    @Test func counterSumsBeyondInt64AreHeldAtItsBoundsOnEveryNode() throws {
        let a = try makeStore()
        let b = try makeStore()
        let c = try makeStore()
        for store in [a, b, c] { try makeItems(store) }
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'x')")
        try sync(a, b)
        try sync(a, c)
        try a.execute("UPDATE items SET hits = hits + 9223372036854775800 WHERE id = 1")
        try b.execute("UPDATE items SET hits = hits + 100 WHERE id = 1")
        try c.execute("UPDATE items SET hits = hits - 50 WHERE id = 1")
        // Every order of delivery gives the same value: the exact sum, held at Int64.max, never wrapped.
        try sync(b, a)
        try sync(c, a)
        try sync(c, b)
        try sync(a, b)
        try sync(a, c)
        try sync(b, c)
        let expected: [[SQLValue]] = [[.integer(Int64.max)]]
        for store in [a, b, c] { #expect(try rows(store, "SELECT hits FROM items") == expected) }
        #expect(try a.digest() == b.digest() && b.digest() == c.digest())
        // Moving back below the bound shows the exact sum again.
        try c.execute("UPDATE items SET hits = hits - 100 WHERE id = 1")
        try sync(c, a)
        #expect(try rows(a, "SELECT hits FROM items") == [[.integer(9223372036854775750)]])
    }

    // MARK: - Keys

    @Test func keysSQLiteComparesLooselyOrAssignsAreRefusedAtReplicate() throws {
        let store = try makeStore()
        let cases: [(String, String)] = [
            ("CREATE TABLE a1(id INTEGER PRIMARY KEY AUTOINCREMENT, v)", "AUTOINCREMENT"),
            ("CREATE TABLE a2(email TEXT COLLATE NOCASE PRIMARY KEY, v)", "NOCASE"),
            ("CREATE TABLE a3(k TEXT COLLATE RTRIM, n INTEGER, v, PRIMARY KEY(k, n))", "RTRIM"),
            ("CREATE TABLE a4(k REAL PRIMARY KEY, v)", "1.0"),
            ("CREATE TABLE a5(k NUMERIC PRIMARY KEY, v)", "1.0"),
            ("CREATE TABLE a6(email TEXT, name TEXT, PRIMARY KEY(email COLLATE NOCASE))", "NOCASE"),
            ("CREATE TABLE a7(id TEXT, a INT, PRIMARY KEY(id COLLATE RTRIM)) WITHOUT ROWID", "RTRIM"),
        ]
        for (sql, words) in cases {
            try store.execute(sql)
            let name = String(sql.dropFirst("CREATE TABLE ".count).prefix(2))
            let error = try #require(shoalError { try store.replicate(table: name) }, "\(sql)")
            #expect(error.code == .unsupportedSchema)
            #expect(error.message.contains(words), "\(error.message)")
        }
        #expect(try store.replicatedTables().isEmpty)
    }

    @Test func aKeyWithANullPartIsRefusedAtWriteTimeAndOtherTablesKeepFlowing() throws {
        let directory = try temporaryDirectory("null-key")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let b = try makeFileStore(directory, "b")
        for store in [a, b] {
            try store.execute("CREATE TABLE loose(k PRIMARY KEY, v)")
            try store.replicate(table: "loose")
            // A rowid table: SQLite lets its composite key hold a NULL.
            try store.execute("CREATE TABLE duo(a TEXT, b INTEGER, v, PRIMARY KEY(a, b))")
            try store.replicate(table: "duo")
        }
        let app = try RawConnection(path: directory.appendingPathComponent("a.db").path)
        func refused(_ sql: String) -> Bool {
            do {
                try app.exec(sql)
                return false
            } catch {
                return (error as? ShoalError)?.message.hasPrefix("shoal: ") ?? false
            }
        }
        // No node could name a row whose key has a NULL part.
        #expect(refused("INSERT INTO duo VALUES (NULL, 1, 'x')"))
        try app.exec("INSERT INTO duo VALUES ('k', 1, 'x')")
        #expect(refused("UPDATE duo SET b = NULL"))
        let own = try #require(shoalError { try a.execute("INSERT INTO duo VALUES ('k', NULL, 'x')") })
        #expect(own.code == .unsupportedSchema)
        // A REAL equal to an integer in an untyped key would be one key to SQLite and two to Shoal.
        #expect(refused("INSERT INTO loose VALUES (1.0, 'x')"))
        #expect(try shoalError { try a.execute("INSERT INTO loose VALUES (2.0, 'x')") }?.code == .unsupportedSchema)
        try app.exec("INSERT INTO loose VALUES (1.5, 'fraction'), (1, 'integer')")
        // Every other write keeps being captured and replicated.
        try app.exec("INSERT INTO items(id, name) VALUES (1, 'app')")
        try app.exec("INSERT INTO duo VALUES ('k', 2, 'ok')")
        try sync(a, b)
        #expect(try rows(b, "SELECT name FROM items") == [[.text("app")]])
        #expect(try rows(b, "SELECT count(*) FROM loose") == [[.integer(2)]])
        #expect(try rows(b, "SELECT count(*) FROM duo") == [[.integer(2)]])
        #expect(
            try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("b.db"))
        )
    }

    // MARK: - Peers with different table shapes never store each other's values as something else

    @Test func tablesThatWouldStoreOtherRowsHaveOtherFingerprintsAndValuesBetweenThemAreHeld() throws {
        let directory = try temporaryDirectory("shape-fingerprint")
        defer { try? FileManager.default.removeItem(at: directory) }
        let shapes = [
            "CREATE TABLE t(k INTEGER PRIMARY KEY, c TEXT)",
            "CREATE TABLE t(k INTEGER PRIMARY KEY, c TEXT NOT NULL DEFAULT 'x')",
            "CREATE TABLE t(k INTEGER PRIMARY KEY, c INTEGER)",
            "CREATE TABLE t(k INTEGER PRIMARY KEY, c TEXT CHECK (length(c) < 3))",
            "CREATE TABLE t(k INTEGER PRIMARY KEY, c TEXT) STRICT",
            "CREATE TABLE t(k INT PRIMARY KEY, c TEXT)",
        ]
        var fingerprints: [String] = []
        for (index, sql) in shapes.enumerated() {
            let store = try Store(path: directory.appendingPathComponent("\(index).db").path)
            try store.execute(sql)
            try store.replicate(table: "t")
            fingerprints.append(try store.schemaFingerprint())
        }
        #expect(Set(fingerprints).count == shapes.count)
        // The same shape laid out differently is the same shape.
        let same = try makeStore()
        try same.execute("CREATE TABLE t(k INTEGER PRIMARY KEY,   c VARCHAR(20) CHECK(length(c)<3))")
        try same.replicate(table: "t")
        #expect(try same.schemaFingerprint() == fingerprints[3])
        // Offline: the receiver whose column would store 'x' where the sender holds NULL holds that value as it came
        // (schemas differ; the rest applies), never storing 'x' as if it were the sender's write.
        do {
            let sender = try Store(path: directory.appendingPathComponent("0.db").path)
            try sender.execute("INSERT INTO t VALUES (1, NULL)")
        }
        try pipeChanges(from: directory.appendingPathComponent("0.db"), to: directory.appendingPathComponent("1.db"))
        let receiver = try Store(path: directory.appendingPathComponent("1.db").path)
        #expect(try receiver.heldChanges() == ["t": 1])
        #expect(try receiver.digest() == receiver.fullScanDigest())
    }

    // MARK: - One identity, one history

    /// How an older copy of a database comes back.
    enum Restore: CaseIterable {
        /// A backup file copied over the database (another file, another inode).
        case backupCopiedOver
        /// The backup's bytes written into the database file itself (as SQLite's `.restore` does).
        case backupWrittenInPlace
        /// The same, with the file recording what was sent lost too: the first peer to ask tells.
        case backupWrittenInPlaceAndSentRecordLost
    }

    /// A file whose folder was restored in place from an older backup (its record of what was sent with it), then
    /// written to past what its peer `b` holds of its site: nothing at hand shows it.
    private func forkedFile(in directory: URL) throws -> (b: Store, original: SiteID, path: String) {
        let path = directory.appendingPathComponent("a.db").path
        let b = try makeFileStore(directory, "b")
        let original: SiteID
        let backup = directory.appendingPathComponent("backup")
        try FileManager.default.createDirectory(at: backup, withIntermediateDirectories: true)
        do {
            let a = try makeFileStore(directory, "a")
            original = a.siteID
            try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
            try sync(a, b)
            // The whole folder is backed up: the database and its record of what was sent.
            try RawConnection(path: path).exec("VACUUM INTO '\(backup.path)/a.db'")
            try FileManager.default.copyItem(atPath: path + ".shoal-sent", toPath: backup.path + "/a.db.shoal-sent")
            try a.execute("INSERT INTO items(id, name) VALUES (2, 'two')")
            try a.execute("INSERT INTO items(id, name) VALUES (3, 'three')")
            try sync(a, b)
        }
        // The folder is restored in place (the same file, so the same inode), its old record with it.
        try? FileManager.default.removeItem(atPath: path + ".shoal-sent")
        try restoreInPlace(path, from: backup.appendingPathComponent("a.db").path)
        try FileManager.default.copyItem(atPath: backup.path + "/a.db.shoal-sent", toPath: path + ".shoal-sent")
        let restored = try Store(path: path)
        #expect(try restored.identityChange() == nil)
        for id in [20, 30, 40] { try restored.execute("INSERT INTO items(id, name) VALUES (\(id), 'forked')") }
        return (b, original, path)
    }

    @Test func aFileRestoredWithItsOldRecordAndWrittenPastThePeerIsToldByThePeersHead() throws {
        let directory = try temporaryDirectory("forked")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (b, original, path) = try forkedFile(in: directory)
        do {
            let restored = try Store(path: path)
            // The peer's request carries its latest transaction of this site, with its clock: not the one written here.
            let head = try #require(try b.loggedHead(of: original))
            #expect(head.seq == 3)
            let refusal = try #require(shoalError { try restored.checkHead(head) })
            #expect(refusal.code == .siteConflict)
            #expect(refusal.message.contains("restored from an older copy") && refusal.message.contains("Restart"))
            // The peer's own head of its own site, or a head this file agrees with, is no evidence.
            try restored.checkHead(try #require(try restored.loggedHead(of: original)))
        }
        // Reopened, it writes as a fresh site and says why.
        let moved = try Store(path: path)
        let change = try #require(try moved.identityChange())
        #expect(change.reason == .forked && change.previousSite == original && moved.siteID != original)
        #expect(change.description.contains("issued again") && change.description.contains("nothing is lost"))
        try moved.execute("INSERT INTO items(id, name) VALUES (50, 'after the move')")
        try sync(b, moved)
        try takeFreshState(moved, from: b)
        try sync(moved, b)
        try sync(b, moved)
        #expect(try rows(b, "SELECT name FROM items WHERE id = 50") == [[.text("after the move")]])
        // What the file wrote after the restore reached the peer under the fresh site, and what the peer held under
        // those numbers came back: both hold every row, compared outside Shoal.
        #expect(try rows(b, "SELECT id FROM items ORDER BY id") == [1, 2, 3, 20, 30, 40, 50].map { [.integer($0)] })
        #expect(try moved.versionVector() == b.versionVector())
        #expect(try moved.digest() == b.digest())
        #expect(try sameContents(URL(fileURLWithPath: path), directory.appendingPathComponent("b.db")))
    }

    @Test func aFileRestoredWithItsOldRecordAndWrittenPastThePeerRefusesThePeersStream() throws {
        let directory = try temporaryDirectory("forked-stream")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (_, original, path) = try forkedFile(in: directory)
        // Offline: the peer writes a stream for the restored file's version; its header names what the peer holds of
        // each site, with clocks.
        let vector = "{" + (try Store(path: path).versionVector()).entries.map { "\"\($0.key.hex)\":\($0.value)" }
            .joined(separator: ",") + "}"
        let stream = try shoal("changes", "--db", directory.appendingPathComponent("b.db").path, "--since", vector)
        #expect(stream.status == 0, "\(stream.stderr)")
        #expect(stream.stdout.split(separator: "\n").first?.contains("\"heads\"") == true)
        let applied = try shoal("apply", "--db", path, input: Data(stream.stdout.utf8))
        #expect(applied.status != 0)
        #expect(applied.stderr.contains("restored from an older copy") && applied.stderr.contains("Restart"), "\(applied.stderr)")
        // Nothing of the stream was applied, and the next opening moves the file.
        let moved = try Store(path: path)
        #expect(try moved.identityChange()?.reason == .forked && moved.siteID != original)
        #expect(try rows(moved, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(20)], [.integer(30)], [.integer(40)]])
    }

    @Test(arguments: Restore.allCases)
    func aFileRestoredFromAnOlderCopyMovesToAFreshSiteAndLosesNothing(_ restore: Restore) throws {
        let directory = try temporaryDirectory("restored-copy")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db")
        let backup = directory.appendingPathComponent("a-backup.db")
        let b = try makeFileStore(directory, "b")
        let original: SiteID
        do {
            let a = try makeFileStore(directory, "a")
            original = a.siteID
            try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
            // A backup taken with SQLite's own API while the node runs.
            let raw = try RawConnection(path: path.path)
            try raw.exec("VACUUM INTO '\(backup.path)'")
            try a.execute("INSERT INTO items(id, name) VALUES (2, 'two')")
            try a.execute("INSERT INTO items(id, name) VALUES (3, 'three')")
            try sync(a, b)
        }
        // The backup comes back over the file.
        try? FileManager.default.removeItem(atPath: path.path + "-wal")
        try? FileManager.default.removeItem(atPath: path.path + "-shm")
        switch restore {
        case .backupCopiedOver:
            try FileManager.default.removeItem(at: path)
            try FileManager.default.copyItem(at: backup, to: path)
        case .backupWrittenInPlace, .backupWrittenInPlaceAndSentRecordLost:
            if restore == .backupWrittenInPlaceAndSentRecordLost {
                try FileManager.default.removeItem(atPath: path.path + ".shoal-sent")
            }
            try restoreInPlace(path.path, from: backup.path)
        }
        let firstFresh: SiteID
        do {
            var restored = try Store(path: path.path)
            if restore == .backupWrittenInPlaceAndSentRecordLost {
                // Nothing at hand shows it: it answers the first peer that asks with a refusal saying what to do.
                #expect(try restored.identityChange() == nil)
                let refusal = try #require(shoalError { _ = try restored.changes(since: try b.versionVector()) })
                #expect(refusal.code == .siteConflict)
                #expect(refusal.message.contains("restored from an older copy") && refusal.message.contains("Restart"))
                restored = try Store(path: path.path)
            }
            // Before it writes anything, it moves to a fresh site; peers still know the node by its first one.
            let change = try #require(try restored.identityChange())
            // A file copied over is another file, unless the file system gave it the freed inode number again: then the
            // record of what was sent tells.
            #expect(restore == .backupCopiedOver ? change.reason != .copiedFromAnotherMachine : change.reason == .restored)
            #expect(change.previousSite == original && change.site == restored.siteID)
            #expect(restored.siteID != original)
            #expect(restored.identitySiteID == original)
            #expect(try restored.status().identityChange == change)
            // The app writes on: a new row and an edit of one the backup holds.
            try restored.execute("INSERT INTO items(id, name) VALUES (4, 'after the restore')")
            try restored.execute("UPDATE items SET name = 'one, edited after the restore' WHERE id = 1")
            // Its own writes wait until it took a fresh state from a peer (nothing was collected here: nothing goes).
            try sync(restored, b)
            #expect(try b.versionVector()[restored.siteID] == 0)
            try sync(b, restored)
            #expect(try takeFreshState(restored, from: b) == FreshStateReport())
            // Nothing is refused and nothing is lost: the peer sends back what the old site wrote after the backup.
            try sync(restored, b)
            try sync(b, restored)
            for store in [restored, b] {
                #expect(
                    try rows(store, "SELECT id, name FROM items ORDER BY id") == [
                        [.integer(1), .text("one, edited after the restore")], [.integer(2), .text("two")],
                        [.integer(3), .text("three")], [.integer(4), .text("after the restore")],
                    ]
                )
                #expect(try store.verify(limit: 10).isConsistent)
            }
            #expect(try restored.digest() == b.digest())
            #expect(try restored.versionVector() == b.versionVector())
            #expect(try sameContents(path, directory.appendingPathComponent("b.db")))
            // Opened again, it stays who it became.
            let again = try Store(path: path.path)
            #expect(again.siteID == restored.siteID)
            firstFresh = restored.siteID
            guard restore == .backupWrittenInPlace else { return }
            // The same backup restored a second time (the record of what was sent keeps every site the file wrote as).
            try again.execute("INSERT INTO items(id, name) VALUES (5, 'five')")
            try sync(again, b)
        }
        guard restore == .backupWrittenInPlace else { return }
        try restoreInPlace(path.path, from: backup.path)
        let twice = try Store(path: path.path)
        #expect(try twice.identityChange()?.reason == .restored)
        #expect(twice.siteID != original && twice.siteID != firstFresh)
        try twice.execute("INSERT INTO items(id, name) VALUES (6, 'six')")
        try sync(b, twice)
        try takeFreshState(twice, from: b)
        try sync(twice, b)
        try sync(b, twice)
        #expect(try rows(twice, "SELECT id FROM items ORDER BY id") == (1...6).map { [.integer(Int64($0))] })
        #expect(try sameContents(path, directory.appendingPathComponent("b.db")))
    }

    @Test func aDatabaseOpenedThroughASymbolicLinkRecordsWhatItSentBesideTheFileItself() throws {
        let directory = try temporaryDirectory("symlinked")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        let link = directory.appendingPathComponent("link.db").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: directory.appendingPathComponent("a.db").path)
        let throughLink = try Store(path: link)
        _ = try throughLink.changes(since: VersionVector())
        #expect(FileManager.default.fileExists(atPath: directory.appendingPathComponent("a.db").path + ".shoal-sent"))
        #expect(!FileManager.default.fileExists(atPath: link + ".shoal-sent"))
    }

    @Test func aFileCopiedFromAnotherMachineIsAnotherNodeWithAFreshSite() throws {
        let directory = try temporaryDirectory("other-machine")
        defer { try? FileManager.default.removeItem(at: directory) }
        var here = StoreOptions()
        here.machineID = "machine-one"
        let path = directory.appendingPathComponent("a.db").path
        let original: SiteID
        do {
            let a = try Store(path: path, options: here)
            try makeItems(a)
            try a.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
            original = a.siteID
        }
        // The same file opened on another machine (moved there whole, with the same inode on its disk image).
        var there = StoreOptions()
        there.machineID = "machine-two"
        let moved = try Store(path: path, options: there)
        let change = try #require(try moved.identityChange())
        #expect(change.reason == .copiedFromAnotherMachine)
        #expect(moved.siteID != original && moved.identitySiteID == moved.siteID)
        #expect(change.description.contains("shoal join"))
        // Opened there again, it stays who it became.
        #expect(try Store(path: path, options: there).siteID == moved.siteID)
    }

    @Test func aCopiedFileAndItsOriginalNeverWriteUnderTheSameNumbers() throws {
        let directory = try temporaryDirectory("copied-file")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try makeFileStore(directory, "a")
        let peer = try makeFileStore(directory, "peer")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (1, 'one', 1)")
        // The file is copied while its node runs (SQLite's VACUUM INTO makes a consistent copy).
        let copyPath = directory.appendingPathComponent("copy.db")
        try RawConnection(path: directory.appendingPathComponent("a.db").path).exec("VACUUM INTO '\(copyPath.path)'")
        let copy = try Store(path: copyPath.path)
        #expect(try copy.identityChange()?.reason == .copied)
        #expect(copy.siteID != a.siteID)
        // Both write their next transaction: under the same site it would be the same dot with other content.
        try a.execute("UPDATE items SET name = 'original' WHERE id = 1")
        try a.execute("INSERT INTO items(id, name, qty) VALUES (2, 'from the original', 2)")
        try copy.execute("INSERT INTO items(id, name, qty) VALUES (3, 'from the copy', 3)")
        try sync(a, peer)
        // The copy sends its own writes once it took its fresh state from a peer (nothing to remove here).
        try sync(peer, copy)
        #expect(try takeFreshState(copy, from: peer) == FreshStateReport())
        try sync(copy, peer)
        try sync(peer, a)
        try sync(peer, copy)
        for store in [a, copy, peer] {
            #expect(try rows(store, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(2)], [.integer(3)]])
            #expect(try store.digest() == peer.digest())
        }
        #expect(try sameContents(copyPath, directory.appendingPathComponent("peer.db")))
        #expect(try sameContents(directory.appendingPathComponent("a.db"), directory.appendingPathComponent("peer.db")))
    }

    // MARK: - One bad clock

    @Test func aSiteWhoseClockRanAheadHoldsBackOnlyItsOwnChanges() throws {
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let ahead = try makeStore(ManualWallClock(milliseconds: 1_700_000_000_000 + 86_400_000))
        let good = try makeStore(clock)
        let forwarder = try makeStore(ManualWallClock(milliseconds: 1_700_000_000_000 + 86_400_000))
        let receiver = try makeStore(clock)
        for store in [ahead, good, forwarder, receiver] { try makeItems(store) }
        try ahead.execute("INSERT INTO items(id, name) VALUES (1, 'written a day ahead')")
        try good.execute("INSERT INTO items(id, name) VALUES (2, 'on time')")
        // A node whose clock agrees with the one ahead takes both, and forwards both in the same batches.
        try sync(ahead, forwarder)
        try sync(good, forwarder)
        let report = try sync(forwarder, receiver)
        #expect(report.clockRefusals.keys.sorted() == [ahead.siteID])
        #expect(try rows(receiver, "SELECT id FROM items") == [[.integer(2)]])
        #expect(try receiver.versionVector() == VersionVector([good.siteID: 1]))
        // Once time catches up, the held-back changes arrive.
        clock.advance(by: 86_400_000)
        #expect(try sync(forwarder, receiver).clockRefusals.isEmpty)
        #expect(try rows(receiver, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(2)]])
        #expect(try receiver.digest() == forwarder.digest())
    }

    @Test func aWallClockThatJumpsAheadDoesNotStampWritesInTheFuture() throws {
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let store = try makeStore(clock)
        let peer = try makeStore(ManualWallClock(milliseconds: 1_700_000_000_000))
        for node in [store, peer] { try makeItems(node) }
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'before')")
        // The wall clock is set a day ahead (and later back), while time itself runs on by a second.
        clock.advance(by: 1_000)
        clock.jump(by: 86_400_000)
        try store.execute("INSERT INTO items(id, name) VALUES (2, 'during')")
        let during = try #require(try store.changes(since: VersionVector()).flatMap(\.changes).last?.stamp)
        #expect(during.hlc.milliseconds < 1_700_000_000_000 + 60_000)
        // The peer takes every write: nothing was stamped in the future.
        #expect(try sync(store, peer).clockRefusals.isEmpty)
        #expect(try rows(peer, "SELECT id FROM items ORDER BY id") == [[.integer(1)], [.integer(2)]])
        clock.jump(by: -86_400_000)
        try store.execute("INSERT INTO items(id, name) VALUES (3, 'after')")
        #expect(try sync(store, peer).clockRefusals.isEmpty)
        #expect(try peer.digest() == store.digest())
    }

    @Test func aNodeStartedWithItsClockAheadStampsWithItsPeersTimeOnceItHearsThem() throws {
        let real: UInt64 = 1_700_000_000_000
        let day: UInt64 = 86_400_000
        // This machine's clock is a day ahead from the start: no earlier reading shows a jump.
        let clock = ManualWallClock(milliseconds: real + day)
        let store = try makeStore(clock)
        let peer = try makeStore(ManualWallClock(milliseconds: real))
        let late = try makeStore(ManualWallClock(milliseconds: real - day))
        for node in [store, peer, late] { try makeItems(node) }
        #expect(store.clockAheadOfPeersMilliseconds == nil)
        // A request from a peer carries its clock. One peer a day behind is no evidence (either clock may be wrong).
        let (p1, p2, p3) = (SiteID(high: 1, low: 1), SiteID(high: 2, low: 2), SiteID(high: 3, low: 3))
        #expect(store.notePeerClock(real, from: p1) == Int64(day))
        #expect(store.clockAheadOfPeersMilliseconds == nil)
        // Two peers that agree are; a third further behind (a day late) holds no one back: the most advanced counts.
        #expect(store.notePeerClock(real - day, from: p3) == Int64(2 * day))
        #expect(store.clockAheadOfPeersMilliseconds == day)
        store.notePeerClock(real, from: p2)
        #expect(store.clockAheadOfPeersMilliseconds == day)
        try store.execute("INSERT INTO items(id, name) VALUES (1, 'written after hearing the peer')")
        let stamp = try #require(try store.changes(since: VersionVector()).flatMap(\.changes).last?.stamp)
        #expect(stamp.hlc.milliseconds >= real && stamp.hlc.milliseconds < real + 1_000)
        // The peers take the write: it was not stamped in the future.
        #expect(try sync(store, peer).clockRefusals.isEmpty)
        #expect(try sync(store, late).clockRefusals.isEmpty == false)  // a day late, it refuses even real time
        #expect(try rows(peer, "SELECT id, name FROM items") == rows(store, "SELECT id, name FROM items"))
        #expect(try peer.digest() == store.digest())
        // Once the clock is set right, it stamps with its own clock again.
        clock.jump(by: -Int64(day) + 10_000)
        #expect(store.clockAheadOfPeersMilliseconds == nil)
        try store.execute("INSERT INTO items(id, name) VALUES (2, 'after the clock was set right')")
        let later = try #require(try store.changes(since: VersionVector()).flatMap(\.changes).last?.stamp)
        #expect(later.hlc.milliseconds == real + 10_000)
    }

    @Test func writesMadeAheadBeforeHearingAnyPeerAndNeverSentAreStampedAgainWithThePeersTime() throws {
        let directory = try temporaryDirectory("restamp")
        defer { try? FileManager.default.removeItem(at: directory) }
        let real: UInt64 = 1_700_000_000_000
        let day: UInt64 = 86_400_000
        func fileStore(_ name: String, _ clock: ManualWallClock) throws -> Store {
            var options = StoreOptions()
            options.clock = clock
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path, options: options)
            try makeItems(store)
            return store
        }
        // The machine starts a day ahead and the app writes at once, before any peer is heard.
        let clock = ManualWallClock(milliseconds: real + day)
        let a = try fileStore("a", clock)
        let b = try fileStore("b", ManualWallClock(milliseconds: real))
        try a.execute("INSERT INTO items(id, name, hits) VALUES (1, 'one', 1)")
        try a.execute("BEGIN; UPDATE items SET name = 'uno', hits = hits + 2 WHERE id = 1; INSERT INTO items(id, name) VALUES (2, 'two'); COMMIT")
        try a.execute("DELETE FROM items WHERE id = 2")
        #expect(try sync(a, b).clockRefusals[a.siteID] != nil)  // as things stand, the peer refuses them
        // Hearing two peers, it would stamp again what it never sent, but the refused answer above carried them.
        let (p1, p2) = (SiteID(high: 1, low: 1), SiteID(high: 2, low: 2))
        a.notePeerClock(real, from: p1)
        a.notePeerClock(real, from: p2)
        #expect(try sync(a, b).clockRefusals[a.siteID] != nil)
        // A file that never sent them: the same writes on a second machine started ahead.
        let c = try fileStore("c", ManualWallClock(milliseconds: real + day))
        try c.execute("INSERT INTO items(id, name, hits) VALUES (11, 'eleven', 1)")
        try c.execute("BEGIN; UPDATE items SET name = 'once', hits = hits + 2 WHERE id = 11; INSERT INTO items(id, name) VALUES (12, 'twelve'); COMMIT")
        try c.execute("DELETE FROM items WHERE id = 12")
        // (Read with a plain connection: asking the store for its changes would count as sending them.)
        func logged() throws -> [(seq: Int64, hlc: HLC)] {
            try SQLiteConnection(path: directory.appendingPathComponent("c.db").path)
                .rows("SELECT DISTINCT seq, hlc FROM shoal_log ORDER BY seq")
                .map { ($0[0].integerValue!, HLC(rawValue: UInt64(bitPattern: $0[1].integerValue!))) }
        }
        let before = try logged()
        #expect(before.count == 3 && before.allSatisfy { $0.hlc.milliseconds >= real + day })
        c.notePeerClock(real, from: p1)
        #expect(try logged().map(\.hlc) == before.map(\.hlc))  // one peer: no evidence yet
        c.notePeerClock(real, from: p2)
        let after = try logged()
        #expect(after.allSatisfy { $0.hlc.milliseconds >= real && $0.hlc.milliseconds < real + 1_000 }, "\(after)")
        // Same numbers, same order, and the incremental digest follows the new clocks.
        #expect(after.map(\.seq) == before.map(\.seq))
        #expect(after.map(\.hlc) == after.map(\.hlc).sorted())
        let changes = try c.changes(since: VersionVector()).flatMap(\.changes)
        #expect(changes.allSatisfy { change in after.contains { $0.seq == Int64(change.stamp.seq) && $0.hlc == change.stamp.hlc } })
        #expect(try c.digest() == c.fullScanDigest())
        #expect(try c.verify().isConsistent)
        // The peer takes them all now, and the two files hold the same rows.
        let d = try fileStore("d", ManualWallClock(milliseconds: real))
        #expect(try sync(c, d).clockRefusals.isEmpty)
        #expect(try rows(d, "SELECT id, name, hits FROM items ORDER BY id") == [[.integer(11), .text("once"), .integer(3)]])
        #expect(try sameContents(directory.appendingPathComponent("c.db"), directory.appendingPathComponent("d.db")))
        #expect(try c.digest() == d.digest())
        // Its next write follows them, at the peers' time.
        try c.execute("UPDATE items SET name = 'later' WHERE id = 11")
        let latest = try #require(try c.changes(since: VersionVector()).flatMap(\.changes).map(\.stamp).max())
        #expect(latest.hlc > after.last!.hlc && latest.hlc.milliseconds < real + 1_000)
        #expect(try sync(c, d).clockRefusals.isEmpty)
        #expect(try c.digest() == d.digest())
    }

    // MARK: - The site table survives a rolled-back apply

    @Test func aSiteAllocatedByARolledBackApplyIsNeverReadAsAnother() throws {
        let directory = try temporaryDirectory("site-rollback")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        let a = try Store(path: path)
        // (A row a CHECK refuses is held; a CHECK that fails to evaluate, here on an integer overflow, fails the
        // apply, which rolls back.)
        try a.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER CHECK (abs(v) >= 0))")
        try a.replicate(table: "t")
        // A peer whose table lacks the CHECK sends a value this one cannot check: the apply rolls back.
        let x = try makeStore()
        try x.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)")
        try x.replicate(table: "t")
        try x.execute("INSERT INTO t VALUES (1, -9223372036854775808)")
        #expect(throws: ShoalError.self) { try sync(x, a) }
        // Meanwhile another process on the same file learns of a different site.
        let y = try makeStore()
        try y.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)")
        try y.replicate(table: "t")
        try y.execute("INSERT INTO t VALUES (2, 2)")
        do {
            let other = try Store(path: path)
            try sync(y, other)
        }
        // The first store names y's write as y's.
        let sent = try a.changes(since: VersionVector()).flatMap(\.changes)
        #expect(sent.contains { $0.stamp.site == y.siteID })
        #expect(!sent.contains { $0.stamp.site == x.siteID })
        #expect(try a.versionVector()[y.siteID] == 1)
    }
}

private func shoalError(_ body: () throws -> Void) -> ShoalError? {
    do {
        try body()
        return nil
    } catch let error as ShoalError {
        return error
    } catch {
        return ShoalError(code: .invalidArgument, message: "\(error)")
    }
}
