import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

/// "Has peer X got my write?": what a peer acknowledged, awaited with a deadline, woken by its acknowledgement.
@Suite struct AcknowledgementTests {
    @Test func aWriteIsAwaitedUntilThePeerHoldsItAndAGonePeerIsSaidToLackIt() async throws {
        let directory = try temporaryDirectory("ack")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await a.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('one', 1)")
        let written = Dot(site: a.node.siteID, seq: try await a.node.versionVector()[a.node.siteID])
        #expect(try await a.node.waitUntilAcknowledged(by: .peer(b.node.siteID), timeoutMilliseconds: 30_000))
        #expect(await a.node.holds(written, by: .peer(b.node.siteID)))
        #expect(await a.node.holds(written, by: .anyone))
        #expect(await !a.node.holds(written, by: .relay), "no relay here")
        #expect(await a.node.lacking(by: .peer(b.node.siteID)) == 0)
        // Outside Shoal: b's file holds the row.
        #expect(try sqlite3Shell(b.path, "SELECT k, v FROM kv").stdout == "one|1\n")
        // b gone: a later write is not acknowledged by the deadline, and b is said to lack it.
        await b.stop()
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('two', 2)")
        #expect(try await !a.node.waitUntilAcknowledged(by: .peer(b.node.siteID), timeoutMilliseconds: 300))
        #expect(await a.node.lacking(by: .peer(b.node.siteID)) == 1)
        #expect(await a.node.pendingLocalChanges() == 1)
        await a.stop()
    }

    /// A transaction overwritten, then dropped from the log by compaction, before a third node first synced is never
    /// sent to it; the answer's final claim covers it, and the third node takes it once the answer arrived whole. The
    /// vectors become equal, not only the digests (before, that site stayed lower there until it wrote again, and
    /// the link never counted as settled).
    @Test func aPeerThatNeverSawAnOverwrittenTransactionStillEndsWithAnEqualVector() async throws {
        let directory = try temporaryDirectory("claimgap")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('k1', 'first'), ('k2', 'kept')")
        try await a.node.execute("UPDATE kv SET v = 'second' WHERE k = 'k1'")
        let overwritten = Dot(site: a.node.siteID, seq: try await a.node.versionVector()[a.node.siteID])
        #expect(try await a.node.waitUntilAcknowledged(by: .peer(b.node.siteID), timeoutMilliseconds: 30_000))
        try await b.node.execute("UPDATE kv SET v = 'third' WHERE k = 'k1'")
        #expect(try await b.node.waitUntilAcknowledged(by: .peer(a.node.siteID), timeoutMilliseconds: 30_000))
        // Compaction through another connection to a's file, as the node's own pass would run it.
        let compactor = try Store(path: a.path)
        var pass = CompactionReport()
        repeat { pass = try compactor.compactLog() } while !pass.reachedEnd
        let answer = try compactor.changes(since: VersionVector()).flatMap(\.changes)
        #expect(!answer.contains { $0.stamp.dot == overwritten }, "the overwritten transaction was dropped")

        let c = try await startNode(in: directory, name: "c", peers: [a.port])
        #expect(try await converge(a, c))
        let target = try await a.node.versionVector()
        #expect(target[overwritten.site] == overwritten.seq)
        var vector = try await c.node.versionVector()
        let deadline = Date().addingTimeInterval(30)
        while vector != target, Date() < deadline {
            _ = await c.log.next(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
            vector = try await c.node.versionVector()
        }
        #expect(vector == target)
        for node in [a, b, c] { await node.stop() }
    }
}
