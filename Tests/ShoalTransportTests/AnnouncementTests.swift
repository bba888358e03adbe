import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalTransport

/// A commit is announced ("I now hold V", protocol version 7), not pulled for: the peers that lack it pull at once,
/// and nobody starts a round to learn that a peer already holds what it holds.
@Suite struct AnnouncementTests {
    /// Rounds finished by `node`, summed over its peers.
    private func rounds(_ node: RunningNode) async -> Int {
        await node.node.peerStatuses().reduce(0) { $0 + $1.roundsFinished }
    }

    /// Rounds finished by `node` with each of `peers`, in their order.
    private func rounds(_ node: RunningNode, with peers: [RunningNode]) async -> [Int] {
        let statuses = await node.node.peerStatuses()
        var counts: [Int] = []
        for peer in peers {
            let site = peer.node.siteID
            counts.append(statuses.filter { $0.siteID == site }.reduce(0) { $0 + $1.roundsFinished })
        }
        return counts
    }

    /// Every row of `kv`, read by the sqlite3 shell: values with their types, outside Shoal.
    private func rows(_ node: RunningNode) throws -> String {
        try sqlite3Shell(node.path, "SELECT k, typeof(v), quote(v), n FROM kv ORDER BY k").stdout
    }

    @Test func aWriteReachesAMeshWithoutEchoRoundsAndAPeerOfVersion6StillGetsItAtOnce() async throws {
        let directory = try temporaryDirectory("announce")
        defer { try? FileManager.default.removeItem(at: directory) }
        // a, b and c in a full mesh; d speaks version 6 (it gets rounds, as before), with a only. No periodic rounds.
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        let c = try await startNode(in: directory, name: "c", peers: [a.port, b.port])
        let d = try await startNode(in: directory, name: "d", peers: [a.port]) {
            $0.session.highestVersion = WireProtocol.holdingVersion - 1
        }
        let connected = try await waitUntil(within: 30) {
            let counts = [
                await a.node.peerStatuses().filter(\.isConnected).count,
                await b.node.peerStatuses().filter(\.isConnected).count,
                await c.node.peerStatuses().filter(\.isConnected).count,
            ]
            return counts == [3, 2, 2]
        }
        #expect(connected)
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('first', 1)")
        for peer in [b, c, d] { #expect(try await converge(a, peer)) }
        // The links' first rounds and the first write's are over once nothing moves for a while: measure from here.
        var before = [await rounds(a), await rounds(b), await rounds(c), await rounds(d)]
        for _ in 0..<50 {
            let now = [await rounds(a), await rounds(b), await rounds(c), await rounds(d)]
            let quiet = await !a.log.next(within: 0.3) { if case .roundFinished = $0 { true } else { false } }
            if now == before && quiet { break }
            before = now
        }
        before = [await rounds(a), await rounds(b), await rounds(c), await rounds(d)]
        let aBefore = await rounds(a, with: [b, c, d])

        let writes = 10
        for index in 0..<writes {
            try await a.node.execute("INSERT INTO kv(k, v, n) VALUES ('w\(index)', x'00ff\(index)0', \(index))")
            let target = try await a.node.versionVector()
            for peer in [b, c, d] {
                let arrived = try await waitUntil(within: 15) {
                    try await peer.node.versionVector().dominatesOrEquals(target)
                }
                #expect(arrived, "write \(index) did not reach \(peer.path) with periodic rounds off")
            }
        }
        for peer in [b, c, d] { #expect(try await converge(a, peer)) }
        let after = [await rounds(a), await rounds(b), await rounds(c), await rounds(d)]
        let made = zip(after, before).map { $0 - $1 }
        let aMade = zip(await rounds(a, with: [b, c, d]), aBefore).map { $0 - $1 }
        print("rounds finished by a, b, c, d during \(writes) writes at a: \(made); by a with b, c, d: \(aMade)")
        // a pulled only from d, which still starts a round at each of its commits (an apply is one), and a answers
        // it with a round of its own; never from b or c, which announce to a nothing it lacks. (How many with d
        // depends on timing: a commit of d's while a's round with it runs is answered by one more round.)
        #expect(aMade[0] == 0 && aMade[1] == 0, "rounds a finished with b, c, d: \(aMade)")
        #expect(aMade[2] >= 1 && aMade[2] <= 2 * writes, "rounds a finished with b, c, d: \(aMade)")
        // b and c each pulled every write from a (or one from the other, when its announcement came first).
        #expect(made[1] >= writes && made[1] <= 2 * writes && made[2] >= writes && made[2] <= 2 * writes, "\(made)")
        #expect(made[3] >= writes, "\(made)")
        let expected = try rows(a)
        #expect(expected.split(separator: "\n").count == writes + 1)
        for peer in [b, c, d] { #expect(try rows(peer) == expected) }
        for node in [d, c, b, a] { await node.stop() }
    }
}
