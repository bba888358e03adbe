import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalProtocol
@testable import ShoalTransport

/// Digests leave tombstones out from protocol version 8, and hash a row's columns in name order from version 10: an
/// older peer's digest hashes rows otherwise, so a node keeps no digest of it to compare (it would report a divergence
/// that is only a tombstone kept on one side, or two columns added in another order).
@Suite struct DigestVersionTests {
    @Test func anOlderPeerIsNeverComparedByDigestAndACurrentOneIs() async throws {
        let directory = try temporaryDirectory("digest-version")
        defer { try? FileManager.default.removeItem(at: directory) }
        // Periodic rounds every 200 ms: acknowledgements carry digests once the data is quiet.
        let a = try await startNode(in: directory, name: "a") { $0.roundIntervalMilliseconds = 200 }
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) { $0.roundIntervalMilliseconds = 200 }
        let older = try await startNode(in: directory, name: "older", peers: [a.port]) {
            $0.roundIntervalMilliseconds = 200
            $0.session.highestVersion = WireProtocol.comparableDigestVersion - 1
        }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('kept', 1), ('deleted', 2)")
        try await a.node.execute("DELETE FROM kv WHERE k = 'deleted'")
        #expect(try await converge(a, b))
        #expect(try await converge(a, older))
        // b's acknowledgements carry its digest once its data is quiet; a keeps it. Then a finishes two more rounds
        // with the older peer, whose acknowledgements carry its digest too: a keeps none of it.
        let bAcknowledged = try await waitUntil(within: 30) {
            await a.node.peerStatuses().first { $0.siteID == b.node.siteID }?.digest != nil
        }
        #expect(bAcknowledged)
        func olderRounds() async -> Int {
            await a.node.peerStatuses().first { $0.siteID == older.node.siteID }?.roundsFinished ?? 0
        }
        let before = await olderRounds()
        #expect(try await waitUntil(within: 30) { await olderRounds() >= before + 2 })
        let statuses = await a.node.peerStatuses()
        #expect(statuses.first { $0.siteID == b.node.siteID }?.digest == (try await a.node.digest()).hex)
        #expect(statuses.first { $0.siteID == older.node.siteID }?.digest == nil)
        for node in [older, b, a] { await node.stop() }
    }
}
