import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalSecurity
@testable import ShoalStore
@testable import ShoalTransport

/// Writes `count` JSON documents of a few KB into `kv` of the database at `path` (keys `doc-0`…), in transactions of
/// 100, before its node starts; returns the documents' bytes.
private func writeDocuments(_ count: Int, to path: String, seed: UInt64) throws -> Int {
    let store = try Store(path: path)
    let insert = try store.prepare("INSERT INTO kv(k, v) VALUES (?, ?)")
    var generator = SplitMix(state: seed)
    var bytes = 0
    for start in stride(from: 0, to: count, by: 100) {
        try store.transaction {
            for index in start..<min(count, start + 100) {
                let document = JSONDocuments.document(index, &generator)
                bytes += document.utf8.count
                try insert.execute([.text("doc-\(index)"), .text(document)])
            }
        }
    }
    return bytes
}

/// Every application table of the database at `path` (the `sqlite3` shell's dump of each, rows ordered by key), read
/// outside Shoal.
private func tableDumps(_ path: String) throws -> [String: String] {
    let names = try sqlite3Shell(
        path,
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'shoal%' AND name NOT LIKE 'sqlite%' "
            + "ORDER BY name"
    ).stdout.split(separator: "\n").map(String.init)
    var dumps: [String: String] = [:]
    for name in names {
        let dump = try sqlite3Shell(path, "SELECT quote(k), quote(v) FROM \"\(name)\" ORDER BY k")
        guard dump.status == 0 else { throw TestSetupError("sqlite3 failed: \(dump.stderr)") }
        dumps[name] = dump.stdout
    }
    return dumps
}

/// Whether `node` holds everything `other` holds, within `seconds` (checked as rounds finish).
private func caughtUp(_ node: SecuredNode, with other: SecuredNode, within seconds: Double = 120) async throws -> Bool {
    let goal = try await other.node.versionVector()
    return try await waitUntil(within: seconds, checkingEvery: 100) {
        try await node.node.versionVector().dominatesOrEquals(goal)
    }
}

/// Catch-ups of text-heavy rows over real mutual-TLS links on loopback, counted with the nodes' own counters (TLS hides
/// the frames from anything outside them).
@Suite(.serialized) struct CompressedLinkTests {
    @Test func aCatchUpOfJSONRowsSendsAtMostFortyPercentOfTheRawBytesAndTheRowsAreEqual() async throws {
        let directory = try temporaryDirectory("compressed-link")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let documentBytes = try writeDocuments(1_500, to: paths[0], seed: 5)
        // Loopback stands in for the LAN: links to this machine are compressed only when asked.
        let a = try await startSecured(paths[0]) { $0.compressesLoopback = true }
        let b = try await startSecured(paths[1], peers: [a.port]) { $0.compressesLoopback = true }
        #expect(try await caughtUp(b, with: a))
        let traffic = a.node.changeTraffic
        await b.stop()
        await a.stop()

        #expect(traffic.compressedFrames > 0)
        // What crossed the link against what the batches held, and against the documents themselves.
        #expect(Double(traffic.bytesSent) <= 0.4 * Double(traffic.uncompressedBytes), "\(traffic)")
        #expect(Double(traffic.bytesSent) <= 0.4 * Double(documentBytes), "\(traffic), documents \(documentBytes)")
        let (left, right) = (try tableDumps(paths[0]), try tableDumps(paths[1]))
        #expect(left.keys.sorted() == ["kv"])
        #expect(left == right)
        #expect(left["kv"]?.split(separator: "\n").count == 1_500)
    }

    /// By default a link to a peer on this machine is not compressed: its bytes never cross a network.
    @Test func aLinkOnThisMachineIsNotCompressedUnlessAsked() async throws {
        let directory = try temporaryDirectory("compressed-link-loopback")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        _ = try writeDocuments(300, to: paths[0], seed: 7)
        let a = try await startSecured(paths[0])
        let b = try await startSecured(paths[1], peers: [a.port])
        #expect(try await caughtUp(b, with: a))
        let traffic = a.node.changeTraffic
        await b.stop()
        await a.stop()
        #expect(traffic.frames > 0 && traffic.compressedFrames == 0)
        #expect(SyncNode.isLoopback("127.0.0.1") && SyncNode.isLoopback("127.3.4.5") && SyncNode.isLoopback("::1"))
        #expect(!SyncNode.isLoopback("10.0.0.7") && !SyncNode.isLoopback("fe80::1") && !SyncNode.isLoopback(nil))
    }

    /// A node of this build and one that offers only version 5 (the version before compression): the link negotiates
    /// 5, nothing is compressed either way, and both catch up.
    @Test func aPeerOfThePreviousVersionGetsPlainFramesAndBothSidesCatchUp() async throws {
        let directory = try temporaryDirectory("compressed-link-old-peer")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        _ = try writeDocuments(300, to: paths[0], seed: 6)
        let a = try await startSecured(paths[0]) { $0.compressesLoopback = true }
        let old = try await startSecured(paths[1], peers: [a.port]) {
            $0.compressesLoopback = true
            $0.session.highestVersion = 5
        }
        try await old.node.execute("INSERT INTO kv(k, v) VALUES ('from the old peer', ?)", [.text(String(repeating: "ab", count: 5_000))])
        #expect(try await caughtUp(old, with: a))
        #expect(try await caughtUp(a, with: old))
        let (sent, received) = (a.node.changeTraffic, old.node.changeTraffic)
        await old.stop()
        await a.stop()

        #expect(sent.frames > 0 && received.frames > 0)
        #expect(sent.compressedFrames == 0 && sent.bytesSent == sent.uncompressedBytes)
        #expect(received.compressedFrames == 0 && received.bytesSent == received.uncompressedBytes)
        let (left, right) = (try tableDumps(paths[0]), try tableDumps(paths[1]))
        #expect(left == right)
        #expect(left["kv"]?.split(separator: "\n").count == 301)
    }
}
