import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

/// Backs up node `path`'s folder (its database and its record of what it sent) into `backup`.
private func backUpFolder(of path: String, into backup: URL) throws {
    try FileManager.default.createDirectory(at: backup, withIntermediateDirectories: true)
    _ = try SQLiteConnection(path: path).rows("VACUUM INTO '\(backup.path)/a.db'")
    try FileManager.default.copyItem(atPath: path + ".shoal-sent", toPath: backup.path + "/a.db.shoal-sent")
}

/// Restores node `path`'s folder in place from `backup` (see ``backUpFolder(of:into:)``).
private func restoreFolder(of path: String, from backup: URL) throws {
    try? FileManager.default.removeItem(atPath: path + ".shoal-sent")
    try restoreInPlace(path, from: backup.appendingPathComponent("a.db").path)
    try FileManager.default.copyItem(atPath: backup.path + "/a.db.shoal-sent", toPath: path + ".shoal-sent")
}

/// Runs node `a` (in `directory`, dialling `peer`) for `body`, and lets it go before its file is touched again (its
/// connection closes with it).
private func runA(in directory: URL, peer: RunningNode, _ body: (RunningNode) async throws -> Void) async throws {
    let a = try await startNode(in: directory, name: "a", peers: [peer.port])
    try await body(a)
    await a.stop()
}

@Suite struct ForkedHistoryTests {
    /// A node's folder restored from an older backup (the database and its record of what was sent, in place), then
    /// written to past what its peer holds while the node was down: its file shows nothing, and it would write on
    /// under numbers the peer holds with other content. The peer's request tells it.
    @Test func aNodeRestoredWithItsOldRecordIsToldByItsPeerAndMovesOnRestart() async throws {
        let directory = try temporaryDirectory("forked-node")
        defer { try? FileManager.default.removeItem(at: directory) }
        let b = try await startNode(in: directory, name: "b")
        let path = directory.appendingPathComponent("a.db").path
        func run(_ body: (RunningNode) async throws -> Void) async throws {
            try await runA(in: directory, peer: b, body)
        }
        var site = SiteID(high: 0, low: 0)
        try await run { a in
            site = a.node.siteID
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('one', 1)")
            #expect(try await converge(a, b))
        }
        let backup = directory.appendingPathComponent("backup")
        try backUpFolder(of: path, into: backup)
        try await run { a in
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('two', 2)")
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('three', 3)")
            #expect(try await converge(a, b))
        }
        // Restored in place, with its old record; the app writes three rows while the node is down.
        try restoreFolder(of: path, from: backup)
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

    /// A node restored from a backup of its folder whose app writes while the node is down (through the library and
    /// through the sqlite3 shell: a row inserted, its counter moved, another row's value changed, a third row deleted)
    /// reuses its site's numbers that its peer holds with other content. Told by its peer, it moves to a fresh site on
    /// restart, claims the old site only as far as it had sent it, and issues its own later writes again under the
    /// fresh site: the peer's transactions under those numbers come back, and its own leave. With the record of what
    /// it sent gone too, it claims nothing of the old site and issues all its writes again (the same values at the
    /// same clocks: they change nothing where they are held).
    @Test(arguments: [true, false])
    func aRestoredNodeWhoseAppWroteWhileItWasDownLosesNothingEitherWay(keepsRecord: Bool) async throws {
        let directory = try temporaryDirectory("forked-app-write")
        defer { try? FileManager.default.removeItem(at: directory) }
        let b = try await startNode(in: directory, name: "b")
        let path = directory.appendingPathComponent("a.db").path
        func run(_ body: (RunningNode) async throws -> Void) async throws {
            try await runA(in: directory, peer: b, body)
        }
        var site = SiteID(high: 0, low: 0)
        try await run { a in
            site = a.node.siteID
            for k in 1...3 { try await a.node.execute("INSERT INTO kv(k, v) VALUES ('a\(k)', \(k))") }
            #expect(try await converge(a, b))
        }
        let backup = directory.appendingPathComponent("backup")
        try backUpFolder(of: path, into: backup)
        try await run { a in
            for k in 4...6 { try await a.node.execute("INSERT INTO kv(k, v) VALUES ('a\(k)', \(k))") }
            #expect(try await converge(a, b))
        }
        // Restored in place; the app writes while the node is down.
        try restoreFolder(of: path, from: backup)
        if !keepsRecord { try FileManager.default.removeItem(atPath: path + ".shoal-sent") }
        do {
            let app = try Store(path: path)
            try app.execute("INSERT INTO kv(k, v) VALUES ('restored', 0)")
            try app.execute("UPDATE kv SET n = n + 2 WHERE k = 'restored'")
            try app.execute("UPDATE kv SET v = 'changed' WHERE k = 'a2'")
        }
        _ = try sqlite3Shell(path, "DELETE FROM kv WHERE k = 'a3'")
        // Told by its peer, then restarted: it moves to a fresh site. Every row ends the same on both sides.
        let told = try await startNode(in: directory, name: "a", peers: [b.port])
        _ = await told.log.seen(within: 30) { event in
            guard case .peerDisconnected(_, let reason) = event else { return false }
            return reason.contains("restored from an older copy")
        }
        await told.stop()
        let moved = try await startNode(in: directory, name: "a", peers: [b.port])
        #expect(moved.node.siteID != site)
        #expect(try await converge(moved, b))
        await moved.stop()
        await b.stop()
        #expect(try Store(path: path).identityChange()?.previousSite == site)
        let rows = "SELECT k, quote(v), n FROM kv ORDER BY k"
        let expected = "a1|1|0\na2|'changed'|0\na4|4|0\na5|5|0\na6|6|0\nrestored|0|2\n"
        #expect(try sqlite3Shell(path, rows).stdout == expected)
        #expect(try sqlite3Shell(b.path, rows).stdout == expected)
    }
}
