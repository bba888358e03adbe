import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

@Suite struct ForkedHistoryTests {
    /// A node's folder restored from an older backup (the database and its record of what was sent, in place), then
    /// written to past what its peer holds while the node was down: its file shows nothing, and it would write on
    /// under numbers the peer holds with other content. The peer's request tells it.
    @Test func aNodeRestoredWithItsOldRecordIsToldByItsPeerAndMovesOnRestart() async throws {
        let directory = try temporaryDirectory("forked-node")
        defer { try? FileManager.default.removeItem(at: directory) }
        let b = try await startNode(in: directory, name: "b")
        let path = directory.appendingPathComponent("a.db").path
        // Each run of the node is let go before its file is touched (its connection closes with it).
        func run(_ body: (RunningNode) async throws -> Void) async throws {
            let a = try await startNode(in: directory, name: "a", peers: [b.port])
            try await body(a)
            await a.stop()
        }
        var site = SiteID(high: 0, low: 0)
        try await run { a in
            site = a.node.siteID
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('one', 1)")
            #expect(try await converge(a, b))
        }
        let backup = directory.appendingPathComponent("backup")
        try FileManager.default.createDirectory(at: backup, withIntermediateDirectories: true)
        _ = try SQLiteConnection(path: path).rows("VACUUM INTO '\(backup.path)/a.db'")
        try FileManager.default.copyItem(atPath: path + ".shoal-sent", toPath: backup.path + "/a.db.shoal-sent")
        try await run { a in
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('two', 2)")
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('three', 3)")
            #expect(try await converge(a, b))
        }
        // Restored in place, with its old record; the app writes three rows while the node is down.
        try? FileManager.default.removeItem(atPath: path + ".shoal-sent")
        try restoreInPlace(path, from: backup.appendingPathComponent("a.db").path)
        try FileManager.default.copyItem(atPath: backup.path + "/a.db.shoal-sent", toPath: path + ".shoal-sent")
        do {
            let app = try Store(path: path)
            #expect(try app.identityChange() == nil)
            for k in ["x", "y", "z"] { try app.execute("INSERT INTO kv(k, v) VALUES ('\(k)', 0)") }
        }
        // Back up: the peer's request names what it holds of this site; the node refuses to answer, and says why.
        try await run { a in
            #expect(a.node.siteID == site)
            let told = await a.log.seen(within: 30) { event in
                if case .peerDisconnected(_, let reason) = event { reason.contains("restored from an older copy") } else { false }
            }
            let statuses = await a.node.peerStatuses()
            #expect(told || statuses.contains { $0.lastError?.contains("restored from an older copy") == true }, "\(statuses)")
            // The peer never took the transactions written under its numbers.
            let held = try await b.node.versionVector()
            #expect(held[site] == 3)
        }
        // Restarted, it writes as a fresh site and says why.
        try await run { a in
            #expect(a.node.siteID != site)
            let change = try Store(path: path).identityChange()
            #expect(change?.reason == .forked)
        }
        await b.stop()
    }
}
