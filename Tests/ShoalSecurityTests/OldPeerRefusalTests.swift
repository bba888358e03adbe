import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalStore
@testable import ShoalTransport

/// A peer whose Shoal cannot carry schema changes (it offers protocol versions below
/// ``WireProtocol/schemaChangeVersion``, as a binary of an earlier release does) and a node of this build, over real
/// mutual-TLS links on loopback.
@Suite struct OldPeerRefusalTests {
    /// While both sides hold the same schema they sync on the older protocol; once this node's app adds a column,
    /// the older peer is refused with what to do, "upgrade Shoal on" it by name, on both sides, and gets nothing more.
    @Test func aPeerTooOldForSchemaChangesIsRefusedWithUpgradeShoalOnIt() async throws {
        let directory = try temporaryDirectory("old-peer-schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["current", "older"], in: directory)
        let older: (inout NodeConfiguration) -> Void = {
            $0.session.highestVersion = WireProtocol.schemaChangeVersion - 1
        }
        // The older node listens and this build's node dials it: the side that dials judges the other's hello.
        var old = try await startSecured(paths[1], configure: older)
        var current = try await startSecured(paths[0], peers: [old.port])
        try await current.node.execute("INSERT INTO kv VALUES ('same schema', 1)")
        let synced = try await holds(old, key: "same schema", within: 30)
        let oldFailures = await failures(old)
        #expect(synced, "\(oldFailures)")

        // This node's app update adds a column and writes it; both nodes restart, the older one with its schema.
        try await current.node.execute("ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'")
        await current.stop()
        await old.stop()
        old = try await startSecured(paths[1], configure: older)
        current = try await startSecured(paths[0], peers: [old.port])
        try await current.node.execute("INSERT INTO kv VALUES ('after the update', 2, 'red')")
        let refused = await waitUntil(within: 30, checkingEvery: 100) {
            let here = await failures(current)
            let there = await failures(old)
            return here.contains { $0.contains("upgrade Shoal on older") }
                && there.contains { $0.contains("the peer refused: upgrade Shoal on older") }
        }
        let described = "current: \(await failures(current))\nolder: \(await failures(old))"
        #expect(refused, "\(described)")
        let currentFailures = await failures(current)
        #expect(currentFailures.contains { $0.contains("too old to carry schema changes") }, "\(described)")
        let rows = try await old.node.execute("SELECT k FROM kv ORDER BY k").rows
        #expect(rows == [[.text("same schema")]])
        await old.stop()
        await current.stop()
    }
}
