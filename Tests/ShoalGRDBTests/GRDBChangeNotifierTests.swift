import Foundation
import GRDB
import Shoal
import ShoalGRDB
import ShoalTestSupport
import Synchronization
import Testing

/// A GRDB `ValueObservation` on a node's file, through a real `DatabasePool`, sees what a LAN peer wrote once the node
/// applied it; and what the app writes through GRDB reaches the peer.
@Suite struct GRDBChangeNotifierTests {
    /// A plaintext node on `path` (table kv replicated), dialling `peers`.
    private static func node(_ path: String, peers: [Int] = []) async throws -> SyncNode {
        let store = try Store(path: path)
        try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "kv")
        var configuration = NodeConfiguration(databasePath: path)
        configuration.clusterID = "grdb"
        configuration.insecurePlaintext = true
        configuration.rememberPeers = false
        configuration.staticPeers = peers.map { PeerAddress(host: "127.0.0.1", port: $0) }
        configuration.roundIntervalMilliseconds = 60_000  // rounds come from commits
        return try await SyncNode(configuration: configuration)
    }

    @Test func aValueObservationThroughADatabasePoolSeesWhatAPeerWrote() async throws {
        let directory = try temporaryDirectory("grdb")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (pathA, pathB) = (directory.appendingPathComponent("a.db").path, directory.appendingPathComponent("b.db").path)
        let a = try await Self.node(pathA)
        let events = EventLog<NodeEvent>()
        Task { for await event in a.events { await events.append(event) } }
        let runA = Task { try await a.run() }
        defer { runA.cancel() }
        #expect(await events.seen(within: 30) { if case .listening = $0 { true } else { false } })
        let b = try await Self.node(pathB, peers: [try #require(await a.listeningPort)])
        let runB = Task { try await b.run() }
        defer { runB.cancel() }
        #expect(await events.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })

        let pool = try DatabasePool(path: pathA)
        let notifier = Task { try await GRDBChangeNotifier(store: a.store, writer: pool).run() }
        defer { notifier.cancel() }
        let counts = EventLog<Int>()
        let observation = ValueObservation.tracking { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM kv") ?? 0 }
        let watching = Task {
            for try await count in observation.values(in: pool) { await counts.append(count) }
        }
        defer { watching.cancel() }
        #expect(await counts.seen(within: 30) { $0 == 0 })
        // Written on b, applied on a by Shoal's own connection: GRDB is told, and the observation refreshes.
        try await b.execute("INSERT INTO kv VALUES ('from b', 1)")
        #expect(await counts.seen(within: 30) { $0 == 1 })
        try await b.execute("INSERT INTO kv VALUES ('again', 2)")
        #expect(await counts.seen(within: 30) { $0 == 2 })
        // The app writes through GRDB: the observation sees it at once, and the node captures it for b.
        try await pool.write { db in try db.execute(sql: "INSERT INTO kv VALUES ('from grdb', x'00ff')") }
        #expect(await counts.seen(within: 30) { $0 == 3 })
        let reached = try await waitUntil(within: 30) {
            try await b.execute("SELECT v FROM kv WHERE k = 'from grdb'").rows == [[.blob([0, 255])]]
        }
        #expect(reached)
    }
}
