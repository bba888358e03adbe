import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalRelayClient
@testable import ShoalRelayProtocol
@testable import ShoalSecurity
@testable import ShoalStore

/// A relay operator who edits the relay's storage by hand: each bad change set costs only its own site, and none
/// sends the nodes into a loop of pulls.
extension RelayProcessTests {
    @Test(arguments: StorageKind.allCases)
    func tamperedChunksHoldUpOnlyTheirOwnSitesAndStartNoLoopOfPulls(_ kind: StorageKind) async throws {
        let world = try await RelayWorld("relay-tamper", nodes: ["a", "b", "c"], storage: kind)
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        // Each write uploaded before the next: every transaction is a range of its own at the relay.
        for index in 0..<3 {
            for name in ["a", "b"] {
                try await world.write(name, "INSERT INTO kv VALUES ('\(name)\(index)', \(index))")
                #expect(try await waitUntil(within: 30) {
                    let relay = try await world.relayStatus(name)
                    return relay["lacking"] as? Int == 0 && relay["lastPushMs"] != nil
                })
            }
        }
        #expect(try await world.converge(["a", "b"]))
        try await world.stop("a")
        try await world.stop("b")
        let aSite = try await offPool { try Store(path: world.paths["a"]!).siteID.hex.uppercased() }
        let bSite = try await offPool { try Store(path: world.paths["b"]!).siteID.hex.uppercased() }
        let cluster = world.clusterID

        let (a, b) = (world.blob(aSite), world.blob(bSite))
        // 1. Flipped: a's last range gets unknown flags (its header still names its site).
        let last = "(SELECT max(from_seq) FROM ranges WHERE snapshot = 0 AND site = \(a))"
        let flipped = try await world.relayQuery(
            "SELECT \(world.hex("envelope")) FROM chunks WHERE site = \(a) AND from_seq = \(last)"
        )
        var bytes = Self.bytes(hex: flipped)
        bytes[5] = 0xFF
        _ = try await world.relayQuery(
            "UPDATE chunks SET envelope = \(world.blob(Self.hex(bytes))) WHERE site = \(a) AND from_seq = \(last)"
        )
        // 2. Replayed: b's first range, authentic, filed again after b's head.
        let head = try await world.relayQuery("SELECT head FROM heads WHERE site = \(b)")
            .trimmingCharacters(in: .whitespacesAndNewlines)
        _ = try await world.relayQuery(
            """
            INSERT INTO ranges(cluster, snapshot, site, from_seq, to_seq, upload, chunks, bytes, created, uploader)
                SELECT cluster, 0, site, \(head), \(head) + 1, 99, 1, bytes, created, NULL
                FROM ranges WHERE snapshot = 0 AND site = \(b) AND from_seq = 0;
            INSERT INTO chunks(cluster, snapshot, site, from_seq, upload, idx, envelope, created)
                SELECT cluster, 0, site, \(head), 99, 0, envelope, created
                FROM chunks WHERE snapshot = 0 AND site = \(b) AND from_seq = 0 AND idx = 0;
            UPDATE heads SET head = \(head) + 1 WHERE site = \(b);
            """
        )
        // 3. Foreign: a change set of another cluster, under a site of its own.
        let foreignSite = SiteID.random()
        let foreign = RelayEnvelope(
            cluster: String(repeating: "0", count: 32), epoch: 0, site: foreignSite, from: 0, to: 1, upload: 5, index: 0,
            flags: [.batchEnd, .rangeEnd], sealed: (0..<64).map { _ in UInt8.random(in: 0...255) }
        )
        let foreignBlob = world.blob(foreignSite.hex)
        _ = try await world.relayQuery(
            """
            INSERT INTO heads(cluster, site, head) VALUES ('\(cluster)', \(foreignBlob), 1);
            INSERT INTO ranges(cluster, snapshot, site, from_seq, to_seq, upload, chunks, bytes, created, uploader)
                VALUES ('\(cluster)', 0, \(foreignBlob), 0, 1, 5, 1, 100, 0, NULL);
            INSERT INTO chunks(cluster, snapshot, site, from_seq, upload, idx, envelope, created)
                VALUES ('\(cluster)', 0, \(foreignBlob), 0, 5, 0, \(world.blob(Self.hex(foreign.encoded()))), 0);
            """
        )

        // c, new, gets everything but a's last transaction; each bad site is said once, by its cause.
        let c = try await world.serve("c")
        let cPath = world.paths["c"]!
        #expect(try await waitUntil(within: 60, checkingEvery: 200) {
            try await offPool { try sqlite3Shell(cPath, "SELECT group_concat(k) FROM (SELECT k FROM kv ORDER BY k)") }
                .stdout == "a0,a1,b0,b1,b2\n"
        })
        #expect(await c.line(within: 30) { $0.contains("does not decode") && $0.contains(aSite.lowercased().prefix(8)) } != nil)
        #expect(await c.line(within: 30) { $0.contains("replayed or misfiled") && $0.contains(bSite.lowercased().prefix(8)) } != nil)
        #expect(await c.line(within: 30) { $0.contains("of another cluster") } != nil)
        // Nothing asks again at once: a loop of pulls would have received the replayed chunk hundreds of times by
        // the first pull that ends after every cause was said (a long-poll with nothing left to send).
        let said = SystemWallClock().nowMilliseconds()
        #expect(try await waitUntil(within: 60) {
            ((try await world.relayStatus("c"))["lastPullMs"] as? Int).map { UInt64($0) > said } == true
        })
        let received = (try await world.relayStatus("c"))["received"] as? Int ?? .max
        #expect(received < 40, "c received \(received) change sets")
    }

    private static func bytes(hex: String) -> [UInt8] {
        let digits = Array(hex.trimmingCharacters(in: .whitespacesAndNewlines).utf8)
        return stride(from: 0, to: digits.count - 1, by: 2).map { UInt8(String(decoding: digits[$0...$0 + 1], as: UTF8.self), radix: 16)! }
    }

    private static func hex(_ bytes: [UInt8]) -> String {
        bytes.map { String(format: "%02X", $0) }.joined()
    }
}

/// A relay that loses its storage, or is restored from a copy older than a key rotation, learns the cluster's epochs
/// back from the members: no member starts a different epoch under the same number, and none is told it was removed.
extension RelayProcessTests {
    @Test(arguments: StorageKind.allCases)
    func aRelayThatLostOrRolledBackItsStorageAcrossARotationLearnsTheEpochsBackFromTheMembers(
        _ kind: StorageKind
    ) async throws {
        let world = try await RelayWorld("relay-rollback", nodes: ["a", "b", "c"], storage: kind)
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        try await world.serve("c")
        try await world.write("a", "INSERT INTO kv VALUES ('before', 1)")
        #expect(try await world.converge(["a", "b", "c"]))
        let copy = try await world.copyRelayStorage("relay-before")
        // a removes c: the key moves to epoch 1.
        let (aPath, cPath) = (world.paths["a"]!, world.paths["c"]!)
        let cID = try await offPool { try shoal("id", "--db", cPath) }.stdout.split(separator: "\n").last.map(String.init) ?? ""
        #expect(try await offPool { try shoal("trust", "remove", cID, "--db", aPath) }.status == 0)
        for name in ["a", "b"] {
            #expect(try await waitUntil(within: 30) { (try await world.relayStatus(name))["epoch"] as? Int == 1 })
        }
        try await world.stop("c")
        try await world.write("a", "INSERT INTO kv VALUES ('after the rotation', 1)")
        #expect(try await world.converge(["a", "b"]))

        // Rolled back: the relay restored from the copy made before the rotation.
        try await world.stopRelay()
        try await world.restoreRelayStorage(copy)
        #expect(try await world.relayQuery("SELECT count(*) FROM epochs") == "0\n")
        try await world.startRelay()
        try await world.write("b", "INSERT INTO kv VALUES ('after the rollback', 2)")
        #expect(try await world.converge(["a", "b"], within: 90), "\(world.outputs)")
        #expect(try await waitUntil(within: 60) { try await world.relayQuery("SELECT max(epoch) FROM epochs") == "1\n" })
        for name in ["a", "b"] {
            #expect(try await waitUntil(within: 60) {
                let relay = try await world.relayStatus(name)
                return relay["epoch"] as? Int == 1 && relay["unauthorized"] as? Bool != true && relay["lacking"] as? Int == 0
            })
        }

        // Lost: the relay's storage is gone; its operator makes a new token and the nodes restart with it.
        try await world.stopRelay()
        try await world.loseRelayStorage()
        let storage = world.storageArguments
        let cluster = world.clusterID
        let made = try await offPool {
            try shoal(arguments: ["relay", "token", "create"] + storage + ["--cluster", cluster])
        }
        let fresh = try #require(made.stdout.split(separator: "\n").last.map(String.init), "\(made.stderr)")
        try await world.startRelay()
        try await world.stop("a")
        try await world.stop("b")
        try await world.serve("a", token: fresh)
        try await world.serve("b", token: fresh)
        try await world.write("a", "INSERT INTO kv VALUES ('after the loss', 3)")
        #expect(try await world.converge(["a", "b"], within: 90), "\(world.outputs)")
        #expect(try await waitUntil(within: 60) { try await world.relayQuery("SELECT max(epoch) FROM epochs") == "1\n" })
        // What is sealed now does not open with what c holds.
        let cSeal = RelaySeal(clusterSecret: try KeyFile.load(forDatabase: cPath).cluster.secret)
        let sealed = try await world.relayQuery(
            "SELECT \(world.hex("envelope")) FROM chunks WHERE created = (SELECT max(created) FROM chunks)"
        )
        for line in sealed.split(separator: "\n") {
            let envelope = try RelayEnvelope.decode(ArraySlice(Self.bytes(hex: String(line))))
            #expect(envelope.epoch == 1)
            #expect(throws: ShoalError.self) { try cSeal.open(envelope) }
        }
    }

    /// A relay restored from an older copy (no rotation in between) is sent again what it lost by nodes that write
    /// nothing: they read its heads as soon as it answers again, not at their next write.
    @Test func idleNodesSendARelayRestoredFromAnOlderCopyWhatItLostAsSoonAsItAnswers() async throws {
        let world = try await RelayWorld("relay-restored-idle", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        try await world.write("a", "INSERT INTO kv VALUES ('before the copy', 1)")
        #expect(try await world.converge(["a", "b"]))
        let copy = world.directory.appendingPathComponent("relay-older.sqlite").path
        _ = try await world.relayQuery("VACUUM INTO '\(copy)'")
        try await world.write("b", "INSERT INTO kv VALUES ('after the copy', 2)")
        #expect(try await world.converge(["a", "b"]))
        let heads = try await world.relayQuery("SELECT hex(site) || ':' || head FROM heads ORDER BY site")
        try await world.stopRelay()
        let live = world.relayData + "/relay.sqlite"
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: live + suffix) }
        try FileManager.default.copyItem(atPath: copy, toPath: live)
        #expect(try await world.relayQuery("SELECT hex(site) || ':' || head FROM heads ORDER BY site") != heads)
        try await world.startRelay()
        // The app writes nothing: the relay gets back what it lost well before the uploaders' periodic look at its
        // heads (30 s). (Every head at least what it was: the nodes may write their member reports meanwhile.)
        func parsed(_ text: String) -> [Substring: Int] {
            var result: [Substring: Int] = [:]
            for line in text.split(separator: "\n") {
                let parts = line.split(separator: ":")
                if parts.count == 2, let head = Int(parts[1]) { result[parts[0]] = head }
            }
            return result
        }
        let lost = parsed(heads)
        var seen = ""
        let restored = try await waitUntil(within: 20) {
            seen = try await world.relayQuery("SELECT hex(site) || ':' || head FROM heads ORDER BY site")
            let now = parsed(seen)
            return lost.allSatisfy { now[$0.key, default: 0] >= $0.value }
        }
        let statuses = (try await world.relayStatus("a"), try await world.relayStatus("b"))
        let why =
            "heads \(seen), before the copy was restored \(heads)\n\(world.outputs)\nnode a's relay status: "
            + "\(statuses.0)\nnode b's: \(statuses.1)"
        #expect(restored, Comment(rawValue: why))
    }
}
