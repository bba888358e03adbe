import Foundation
import ShoalCore
import ShoalTestSupport
import Testing

/// Tombstones collected in a cluster where a member reaches the others only through the relay: every part a real
/// process (`shoal relay serve`, `shoal serve`).
@Suite(.serialized) struct RelayCollectionTests {
    /// a and b a LAN (b dials a and has no relay link), c only through the relay; every node served with `extra`.
    private static func lanOfTwoAndARelayedMember(_ name: String, extra: [String]) async throws -> RelayWorld {
        let world = try await RelayWorld(name, nodes: ["a", "b", "c"])
        do {
            try await world.serve("a", extra: extra)
            try await world.serve("b", relay: false, peers: ["a"], extra: extra)
            try await world.serve("c", extra: extra)
        } catch {
            world.tearDown()
            throw error
        }
        return world
    }

    /// a writes rows row01…row20 (v = 1…20), every node holds them, and a has heard from c (its report row, through
    /// the relay): c can be silent to it from then on.
    private static func twentyRowsEverywhereAndCHeard(_ world: RelayWorld) async throws {
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20)
            INSERT INTO kv SELECT 'row' || printf('%02d', i), i FROM n;
            """
        )
        #expect(try await world.converge(["a", "b", "c"]))
        let heard = try await waitUntil(within: 30) {
            let members = try await world.status("a")["members"] as? [[String: Any]] ?? []
            return members.contains { $0["name"] as? String == "c" && $0["source"] as? String == "report" }
        }
        #expect(heard)
    }

    /// a and b are a LAN (b dials a, and has no relay link); c reaches them only through the relay, and a is the only
    /// LAN node with a relay link. Each member writes what it holds as a replicated row after commits, so c learns
    /// what a and b hold (b's row crosses the LAN to a, then the relay), and they learn what c holds: every node
    /// collects the deletes, and none collects before c holds them.
    @Test func aMemberReachedOnlyThroughTheRelayReportsWhatItHoldsAndDeletesAreCollectedEverywhere() async throws {
        let fast = ["--round-interval", "200"]
        let world = try await Self.lanOfTwoAndARelayedMember("relay-collect", extra: fast)
        defer { world.tearDown() }
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40)
            INSERT INTO kv SELECT 'row' || i, printf('%.2000c', 'x') FROM n;
            """
        )
        #expect(try await world.converge(["a", "b", "c"]))
        // c is stopped before the deletes: while it lacks them, nobody collects them.
        try await world.stop("c")
        try await world.write("b", "DELETE FROM kv WHERE k IN (SELECT k FROM kv ORDER BY k LIMIT 10)")
        #expect(try await world.converge(["a", "b"]))
        func collection(_ name: String) async throws -> [String: Any] {
            try await world.status(name)["collection"] as? [String: Any] ?? [:]
        }
        func tombstones(_ name: String) async throws -> Int? { try await collection(name)["tombstones"] as? Int }
        #expect(
            try await waitUntil(within: 30) {
                let (a, b) = (try await tombstones("a"), try await tombstones("b"))
                return a == 10 && b == 10
            }
        )
        // a waits for c alone (which it heard from before the deletes, if at all: a loaded run once converged after
        // c's first report was due).
        let cSite = try await world.status("c")["site"] as? String
        let waiting = try await collection("a")["waiting_for"] as? [[String: Any]] ?? []
        #expect(waiting.count == 1 && waiting.first?["site"] as? String == cSite, "\(waiting)")
        // c comes back through the relay alone: it takes the deletes and says so in its report row.
        try await world.serve("c", extra: fast)
        #expect(try await world.converge(["a", "b", "c"]))
        let collected = try await waitUntil(within: 60) {
            let (a, b, c) = (try await tombstones("a"), try await tombstones("b"), try await tombstones("c"))
            return a == 0 && b == 0 && c == 0
        }
        let states = ["a": try await collection("a"), "b": try await collection("b"), "c": try await collection("c")]
        #expect(collected, "\(states)")
        // With nothing left to collect, nobody is said to hold collection back: a member's report never covers the
        // report rows written after it, and those hold no delete back (it once listed every member for ever).
        let nobodyWaits = try await waitUntil(within: 30) {
            for name in ["a", "b", "c"] where !(try await collection(name)["waiting_for"] as? [Any] ?? [0]).isEmpty {
                return false
            }
            return true
        }
        let stillWaiting = try await collection("a")["waiting_for"] ?? []
        #expect(nobodyWaits, "\(stillWaiting)")
        // c knows a and b by their report rows (it never meets them), and a knows c by its own.
        func members(_ name: String) async throws -> [String: String] {
            let list = try await world.status(name)["members"] as? [[String: Any]] ?? []
            return Dictionary(list.compactMap { member in
                (member["name"] as? String).map { ($0, member["source"] as? String ?? "") }
            }, uniquingKeysWith: { first, _ in first })
        }
        let seenByC = try await members("c")
        #expect(seenByC["a"] == "report" && seenByC["b"] == "report", "\(seenByC)")
        #expect(try await members("a")["c"] == "report")
        // The rows, compared outside Shoal: 30 left, the same everywhere.
        var contents: [[[String]]] = []
        for name in ["a", "b", "c"] {
            let path = world.paths[name]!
            let dump = try await offPool { try sqlite3Shell(path, "SELECT k, hex(v) FROM kv ORDER BY k") }
            contents.append(dump.stdout.split(separator: "\n").map { $0.split(separator: "|").map(String.init) })
        }
        #expect(contents[0].count == 30 && contents[0] == contents[1] && contents[1] == contents[2])
    }

    /// c reaches the others only through the relay, and is away past the horizon: a and b collect deletes without it.
    /// Its app wrote meanwhile, to a row deleted and collected since and to a row that stays. a then snapshots, and the
    /// relay (keeping nothing a snapshot covers) drops the change sets that held the deletes: c gets the snapshot,
    /// which names the collected rows nowhere, so they would stay alive at c. Back through the relay alone, c pulls
    /// before it uploads, learns that it was collected without, and keeps its writes; with no peer to take a fresh
    /// state from, it reads the relay's whole state: the rows no change there names go (its write to one goes to its
    /// conflict log, restorable), and its write to the row that stays reaches everyone. It once waited for a LAN peer
    /// for good. Rows compared outside Shoal.
    @Test func aMemberBackThroughTheRelayPastTheHorizonTakesItsFreshStateThere() async throws {
        let fast = [
            "--round-interval", "200", "--gc-horizon-unchecked-ms", "1500", "--relay-snapshot-bytes", "65536",
            "--no-compression",
        ]
        let world = try await RelayWorld(
            "relay-horizon",
            nodes: ["a", "b", "c"],
            relayArguments: ["--retention-hours", "0", "--retention-bytes", "0"]
        )
        defer { world.tearDown() }
        try await world.serve("a", extra: fast)
        try await world.serve("b", relay: false, peers: ["a"], extra: fast)
        try await world.serve("c", extra: fast)
        try await Self.twentyRowsEverywhereAndCHeard(world)
        try await world.stop("c")
        let aSite = try #require(try await world.status("a")["site"] as? String)
        let cVector = try await world.status("c")["version_vector"] as? [String: Any] ?? [:]
        let cHeld = (cVector[aSite] as? Int).map(UInt64.init) ?? 0
        try await world.write("c", "UPDATE kv SET v = 'c while away' WHERE k = 'row05'; UPDATE kv SET v = 'kept' WHERE k = 'row15'")
        try await world.write("a", "DELETE FROM kv WHERE v <= 10")
        func collection(_ name: String) async throws -> [String: Any] {
            try await world.status(name)["collection"] as? [String: Any] ?? [:]
        }
        // a and b collect without c, once it is silent past the horizon.
        let collected = try await waitUntil(within: 60) {
            let (a, b) = (try await collection("a"), try await collection("b"))
            return a["tombstones"] as? Int == 0 && b["tombstones"] as? Int == 0
                && (a["suspended"] as? [[String: Any]])?.count == 1
        }
        let state = try await collection("a")
        #expect(collected, "\(state)")
        // More than a snapshot's worth: a snapshots, and the relay drops the change sets that held the deletes.
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
            INSERT INTO kv SELECT 'new' || printf('%03d', i), printf('%.1000c', 'n') FROM n;
            """
        )
        let dropped = try await waitUntil(within: 90, checkingEvery: 200) {
            (try await world.logFloor(aSite) ?? 0) > cHeld
        }
        #expect(dropped, "\(world.outputs)")
        // c comes back through the relay alone, and takes its fresh state there.
        try await world.serve("c", extra: fast)
        #expect(try await world.converge(["a", "b", "c"], within: 90), "\(world.outputs)")
        #expect(try await waitUntil(within: 30) { try await world.status("c")["awaits_fresh_state"] as? Bool == false })
        // One fresh state, not one per round (a collector that does not meet c lifts its suspension from c's record).
        let cCollection = try await collection("c")
        #expect(cCollection["fresh_states_taken"] as? Int == 1, "\(cCollection)")
        var contents: [String] = []
        for name in ["a", "b", "c"] {
            let path = world.paths[name]!
            contents.append(try await offPool { try sqlite3Shell(path, "SELECT k, hex(v) FROM kv ORDER BY k") }.stdout)
        }
        #expect(contents[0] == contents[1] && contents[1] == contents[2])
        let kept = "row15|" + Data("kept".utf8).map { String(format: "%02X", $0) }.joined()
        #expect(contents[0].contains(kept), "\(contents[0])")
        for index in 1...10 { #expect(!contents[0].contains("row\(String(format: "%02d", index))|"), "\(contents[0])") }
        let cPath = world.paths["c"]!
        let conflicts = try await offPool { try shoal(arguments: ["conflicts", "--db", cPath]) }
        #expect(conflicts.stdout.contains("orphaned while offline"), "\(conflicts.stdout)")
    }

    /// c, back through the relay, uploads what it wrote while away before anything tells it that it was suspended:
    /// the relay was down while a deleted rows and b (a LAN node with no relay link) collected them without c. a,
    /// linked to the relay, keeps them until the relay holds the deletes (a member that syncs through the relay alone
    /// reads its state there for its fresh state: a delete collected before any member uploaded it never reaches the
    /// relay, and the row stayed alive at c for good). a and b stop; c comes back through the relay and uploads its
    /// writes. b, back with a relay link, downloads c's range: c's update of a row b collected once came back on b as
    /// a row new to it, then everywhere. b leaves it out. c, back through the relay alone, takes its fresh state
    /// there; the row it began while away, which b leaves out too, it writes again when it settles. Every node ends
    /// with the same rows, compared outside Shoal.
    @Test func writesAMemberUploadedBeforeItKnewItWasSuspendedBringNoCollectedRowBack() async throws {
        let fast = ["--round-interval", "200", "--gc-horizon-unchecked-ms", "1500", "--no-compression"]
        let world = try await Self.lanOfTwoAndARelayedMember("relay-suspended-upload", extra: fast)
        defer { world.tearDown() }
        try await Self.twentyRowsEverywhereAndCHeard(world)
        try await world.stop("c")
        try await world.write(
            "c", "UPDATE kv SET v = 'c while away' WHERE k = 'row05'; INSERT INTO kv VALUES ('c-new', 'begun by c')"
        )
        // The relay goes down; a deletes. b collects without c; a waits for the relay.
        try await world.stopRelay()
        try await world.write("a", "DELETE FROM kv WHERE v <= 10")
        func collection(_ name: String) async throws -> [String: Any] {
            try await world.status(name)["collection"] as? [String: Any] ?? [:]
        }
        let collected = try await waitUntil(within: 60) {
            let (a, b) = (try await collection("a"), try await collection("b"))
            return b["tombstones"] as? Int == 0 && (b["suspended"] as? [[String: Any]])?.count == 1
                && a["waits_for_relay"] as? Bool == true
        }
        let states = [try await collection("a"), try await collection("b")]
        #expect(collected, "\(states)")
        #expect(states[0]["tombstones"] as? Int == 10, "\(states[0])")
        let text = try await world.statusText("a")
        #expect(text.contains("wait for the relay"), "\(text)")
        try await world.stop("b")
        try await world.stop("a")
        // c comes back through the relay: its pull brings nothing new, so it uploads what it wrote.
        try await world.startRelay()
        try await world.serve("c", extra: fast)
        let cUploaded = try await waitUntil(within: 30, checkingEvery: 200) {
            let relay = try await world.relayStatus("c")
            return relay["lacking"] as? Int == 0 && relay["lastPushMs"] != nil
        }
        #expect(cUploaded, "\(world.outputs)")
        #expect(try await world.status("c")["awaits_fresh_state"] as? Bool == false)
        try await world.stop("c")
        // b comes back with a relay link and downloads c's range; a uploads the deletes and collects them; c comes
        // back through the relay alone.
        try await world.serve("b", peers: ["a"], extra: fast)
        let bPulled = try await waitUntil(within: 30, checkingEvery: 200) {
            try await world.relayStatus("b")["lacking"] as? Int == 0
        }
        #expect(bPulled, "\(world.outputs)")
        try await world.serve("a", extra: fast)
        try await world.serve("c", extra: fast)
        #expect(try await world.converge(["a", "b", "c"], within: 90), "\(world.outputs)")
        #expect(try await waitUntil(within: 30) { try await world.status("c")["awaits_fresh_state"] as? Bool == false })
        #expect(world.outputs.contains("left out writes a member made while suspended"), "\(world.outputs)")
        let aCollected = try await waitUntil(within: 60) { try await collection("a")["tombstones"] as? Int == 0 }
        let aState = try await collection("a")
        #expect(aCollected, "\(aState)")
        #expect(try await world.converge(["a", "b", "c"], within: 60), "\(world.outputs)")
        var contents: [String] = []
        for name in ["a", "b", "c"] {
            let path = world.paths[name]!
            contents.append(try await offPool { try sqlite3Shell(path, "SELECT k, hex(v) FROM kv ORDER BY k") }.stdout)
        }
        #expect(contents[0] == contents[1] && contents[1] == contents[2], "\(contents)")
        let begun = "c-new|" + Data("begun by c".utf8).map { String(format: "%02X", $0) }.joined()
        #expect(contents[0].contains(begun), "\(contents[0])")
        for index in 1...10 { #expect(!contents[0].contains("row\(String(format: "%02d", index))|"), "\(contents[0])") }
        for index in 11...20 { #expect(contents[0].contains("row\(index)|"), "\(contents[0])") }
        // The relay's change log names rows 1–10 by their inserts, and holds a's delete without them (b uploaded it
        // having collected them): c took its fresh state from a snapshot uploaded for it, which leaves them out, and
        // its write to row05 is in its conflict log.
        #expect(world.outputs.contains("uploaded a snapshot"), "\(world.outputs)")
        let conflicts = try await offPool { try shoal(arguments: ["conflicts", "--db", world.paths["c"]!]) }
        #expect(conflicts.stdout.contains("orphaned while offline"), "\(conflicts.stdout)")
    }

    /// a and c meet only through the relay; c's file is restored from a backup, so it writes as a fresh site (and signs
    /// that it does). Its report rows are then written under that site: a passed them over as rows another node wrote,
    /// so c held collection back for good (it is never met on a link). a now takes them as c's, and the deletes made
    /// after the restore are collected on both.
    @Test func aMemberRestoredAndMetOnlyThroughTheRelayStillLetsDeletesBeCollected() async throws {
        let fast = ["--round-interval", "200"]
        let world = try await RelayWorld("relay-restored-reports", nodes: ["a", "c"])
        defer { world.tearDown() }
        try await world.serve("a", extra: fast)
        try await world.serve("c", extra: fast)
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20)
            INSERT INTO kv SELECT 'row' || printf('%02d', i), i FROM n;
            """
        )
        #expect(try await world.converge(["a", "c"]))
        let pathC = world.paths["c"]!
        let backup = pathC + ".backup"
        try await world.write("c", "VACUUM INTO '\(backup)'")
        // What c writes after the backup reaches a: the backup holds less than c had sent.
        try await world.write("c", "INSERT INTO kv VALUES ('after-backup', 'c')")
        #expect(try await world.converge(["a", "c"]))
        try await world.stop("c")
        let restored = try await offPool { try sqlite3Shell(pathC, ".restore '\(backup)'") }
        #expect(restored.status == 0, "\(restored.stderr)")
        try await world.serve("c", extra: fast)
        #expect(try await world.converge(["a", "c"], within: 60), "\(world.outputs)")
        let status = try await world.status("c")
        #expect((status["identity_change"] as? [String: Any])?["reason"] as? String == "restored", "\(status)")
        try await world.write("a", "DELETE FROM kv WHERE v <= 10")
        func tombstones(_ name: String) async throws -> Int? {
            (try await world.status(name)["collection"] as? [String: Any])?["tombstones"] as? Int
        }
        let collected = try await waitUntil(within: 60) {
            let (a, c) = (try await tombstones("a"), try await tombstones("c"))
            return a == 0 && c == 0
        }
        let state = try await world.status("a")["collection"] as? [String: Any] ?? [:]
        #expect(collected, "\(state)")
        #expect(try await world.converge(["a", "c"]))
        #expect(try await world.sameRows("a", "c"))
    }
}
