import Foundation
import ShoalTestSupport
import Testing

/// Snapshots and retention, over real processes and both storages: a node offline for longer than the relay keeps
/// change sets gets the snapshot and what follows, deletes kept; storage stays bounded however often rows change.
extension RelayProcessTests {
    /// A relay that drops covered change sets at once, and nodes that snapshot after 64 KiB.
    private static let retainNothing = ["--retention-hours", "0", "--retention-bytes", "0", "--metrics"]
    /// (Uncompressed: the test's rows of repeated letters would deflate far below the 64 KiB that starts a snapshot.)
    private static let snapshotEarly = ["--relay-snapshot-bytes", "65536", "--no-compression"]

    @Test(arguments: StorageKind.allCases)
    func aNodeOfflinePastTheRetentionConvergesThroughTheSnapshotWithItsDeletesKept(_ kind: StorageKind) async throws {
        let world = try await RelayWorld(
            "relay-snapshot-\(kind.rawValue)",
            nodes: ["a", "b", "c"],
            postgres: kind == .postgres,
            relayArguments: Self.retainNothing
        )
        defer { world.tearDown() }
        try await world.serve("a", extra: Self.snapshotEarly)
        try await world.serve("b", extra: Self.snapshotEarly)
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
            INSERT INTO kv SELECT 'r' || i, printf('%.1000c', 'a') || i FROM n;
            """
        )
        #expect(try await world.converge(["a", "b"]), "\(world.outputs)")
        try await world.stop("b")
        let bVector = try await world.status("b")["version_vector"] as? [String: Any] ?? [:]
        let aSite = try #require(try await world.status("a")["site"] as? String)
        let bHeld = (bVector[aSite] as? Int).map(UInt64.init) ?? 0
        // While b is away: deletes of rows b holds, updates (each uploaded before the next), and new rows: more
        // than the snapshot, so a snapshots again and the relay drops what b would have needed.
        try await world.write("a", "DELETE FROM kv WHERE CAST(substr(k, 2) AS INTEGER) <= 50")
        for round in 1...6 {
            try await world.write(
                "a",
                "UPDATE kv SET v = printf('%.1000c', 'u') || '\(round)' WHERE CAST(substr(k, 2) AS INTEGER) BETWEEN 51 AND 100"
            )
            #expect(try await waitUntil(within: 30, checkingEvery: 50) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        }
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 201 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
            INSERT INTO kv SELECT 'r' || i, printf('%.1000c', 'n') || i FROM n;
            """
        )
        // The relay drops what a snapshot covers: b's place in a's history is gone from its change log.
        let dropped = try await waitUntil(within: 90, checkingEvery: 200) {
            (try await world.logFloor(aSite) ?? 0) > bHeld
        }
        #expect(dropped, "\(world.outputs)")
        try await world.serve("b", extra: Self.snapshotEarly)
        #expect(try await world.converge(["a", "b"], within: 90), "\(world.outputs)")
        let bPath = world.paths["b"]!
        let rows = try await offPool {
            try sqlite3Shell(
                bPath,
                """
                SELECT count(*) FROM kv WHERE CAST(substr(k, 2) AS INTEGER) <= 50;
                SELECT count(*) FROM kv WHERE v = printf('%.1000c', 'u') || '6';
                SELECT count(*) FROM kv;
                """
            )
        }.stdout
        // No delete lost (no row 1 to 50 came back), the last update of each row won, the new rows arrived.
        #expect(rows == "0\n50\n250\n")
        // A node that was never online before gets there the same way.
        try await world.serve("c")
        #expect(try await world.converge(["a", "b", "c"], within: 90), "\(world.outputs)")
        // The relay reports the snapshot's age.
        let metrics = try await offPool {
            try runProcess(URL(fileURLWithPath: "/usr/bin/curl"), ["-sf", world.relayURL + "/metrics"])
        }.stdout
        #expect(metrics.contains("shoal_relay_snapshot_age_seconds{cluster=\"\(world.clusterID)\"}"))
    }

    @Test func theRelaysStorageStaysBoundedWhenTheSameRowsChangeOverAndOver() async throws {
        let world = try await RelayWorld("relay-bounded", nodes: ["a", "b"], relayArguments: Self.retainNothing)
        defer { world.tearDown() }
        try await world.serve("a", extra: Self.snapshotEarly)
        try await world.serve("b", extra: Self.snapshotEarly)
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
            INSERT INTO kv SELECT 'r' || i, printf('%.2000c', 'a') FROM n;
            """
        )
        // 40 rewrites of all 100 rows of 2 KB, each uploaded before the next: 8 MB of change sets for a state of 200 KB.
        for round in 1...40 {
            try await world.write("a", "UPDATE kv SET v = printf('%.2000c', 'x') || '\(round)'")
            try await world.write("b", "UPDATE kv SET v = printf('%.2000c', 'y') || '\(round)' WHERE k = 'r\(round)'")
            #expect(try await waitUntil(within: 30, checkingEvery: 50) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        }
        #expect(try await world.converge(["a", "b"], within: 90), "\(world.outputs)")
        // Once the relay holds everything, it keeps a snapshot and what the snapshot does not cover yet: both of
        // the order of the merged state (200 KB), far below what was written.
        let bounded = try await waitUntil(within: 60, checkingEvery: 200) {
            let a = try await world.relayStatus("a")
            let b = try await world.relayStatus("b")
            let bytes = try await world.storedBytes()
            let snapshots = try await world.relayQuery("SELECT count(*) FROM snapshots")
            return a["lacking"] as? Int == 0 && b["lacking"] as? Int == 0 && snapshots == "1\n" && bytes < 1_000_000
        }
        let held = try await world.storedBytes()
        #expect(bounded, "\(held) bytes held\n\(world.outputs)")
        // The relay received far more than it keeps.
        let uploaded = try await world.relayStatus("a")["uploaded"] as? Int ?? 0
        #expect(uploaded >= 40, "a uploaded \(uploaded) chunks")
    }
}
