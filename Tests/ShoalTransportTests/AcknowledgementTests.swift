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
}
