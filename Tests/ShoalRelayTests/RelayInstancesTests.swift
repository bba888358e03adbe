import Foundation
import ShoalTestSupport
import Testing

/// Relays on PostgreSQL: several stateless instances on one database serve one cluster, and a node whose instance is
/// killed goes on with another. Every part is a real process and a real PostgreSQL server.
extension RelayProcessTests {
    @Test func nodesOnTwoInstancesConvergeLiveAndAPullResumesOnTheOtherWhenItsInstanceIsKilled() async throws {
        let world = try await RelayWorld("relay-instances", nodes: ["a", "b", "c"], postgres: true)
        defer { world.tearDown() }
        let first = world.relayURL
        let second = try await world.startInstance()
        try await world.serve("a", relays: [first])
        try await world.serve("b", relays: [second])
        try await world.write("a", "INSERT INTO kv VALUES ('from a through the first', 1)")
        try await world.write("b", "INSERT INTO kv VALUES ('from b through the second', 2)")
        #expect(try await world.converge(["a", "b"], within: 60), "\(world.outputs)")
        // Live across instances: b's pull waits at the second instance (25 s long-polls), a uploads to the first; the
        // first's NOTIFY wakes it, well before its long-poll would have ended.
        #expect(try await waitUntil(within: 20) { (try await world.relayStatus("b"))["lastPullMs"] != nil })
        let bPath = world.paths["b"]!
        try await world.write("a", "INSERT INTO kv VALUES ('live', 'crossed')")
        #expect(try await waitUntil(within: 15, checkingEvery: 50) {
            try await offPool { try sqlite3Shell(bPath, "SELECT v FROM kv WHERE k = 'live'") }.stdout == "crossed\n"
        })
        // A transaction of 30,000 rows of 2 KB (about 60 MB, random so it does not compress): c, new, catches up
        // through the second instance, which is killed mid-pull; c goes on with the first from its version vector.
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000)
            INSERT INTO kv SELECT 'bulk' || i, randomblob(2000) FROM n;
            """
        )
        #expect(try await waitUntil(within: 120) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        try await world.serve("c", relays: [second, first])
        #expect(try await waitUntil(within: 60, checkingEvery: 20) {
            (try await world.relayStatus("c"))["received"] as? Int ?? 0 > 0
        })
        let cPath = world.paths["c"]!
        let before = try await offPool { try sqlite3Shell(cPath, "SELECT count(*) FROM kv") }.stdout
        try await world.killInstance(second)
        #expect(before != "30003\n", "c had caught up before its instance was killed: the test proved nothing")
        #expect(try await world.converge(["a", "c"], within: 120), "\(world.outputs)")
        let status = try await world.relayStatus("c")
        #expect(status["url"] as? String == first)
        #expect(status["reachable"] as? Bool == true)
        // b, left with no instance at all, says so; the data stays whole on the one left.
        #expect(try await waitUntil(within: 60) { (try await world.relayStatus("b"))["reachable"] as? Bool == false })
        let postgres = try #require(world.postgres)
        let duplicates = try await offPool {
            try TestPostgres.query(
                postgres,
                "SELECT count(*) FROM (SELECT site, to_seq FROM shoal_relay.ranges WHERE snapshot = 0 GROUP BY cluster, site, to_seq HAVING count(*) > 1) d"
            )
        }
        #expect(duplicates == "0\n")
    }

    @Test func tokensMadeOnPostgresWorkOnEveryInstanceAndRevocationReachesThemAll() async throws {
        let world = try await RelayWorld("relay-pg-tokens", nodes: ["a"], postgres: true)
        defer { world.tearDown() }
        let second = try await world.startInstance()
        let node = try await world.serve("a", relays: [second])
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["reachable"] as? Bool == true })
        let storage = world.storageArguments
        let token = world.token
        let listed = try await offPool { try shoal(arguments: ["relay", "token", "list"] + storage) }
        #expect(listed.stdout.contains(world.clusterID))
        let revoked = try await offPool { try shoal(arguments: ["relay", "token", "revoke"] + storage + [token]) }
        #expect(revoked.status == 0, "\(revoked.stderr)")
        try await world.write("a", "INSERT INTO kv VALUES ('after revocation', 1)")
        #expect(await node.line(within: 30) { $0.contains("refused the token") }?.contains("revoked") == true)
        // A mistyped URL is one clear error, not a hang.
        let wrong = try await offPool {
            try shoal("relay", "token", "list", "--postgres", "postgres://shoal@127.0.0.1:1/shoal?sslmode=disable")
        }
        #expect(wrong.status != 0)
        #expect(wrong.stderr.contains("cannot connect to PostgreSQL"))
        let both = try await offPool { try shoal("relay", "token", "list", "--postgres", "postgres://x@y/z", "--data", "/tmp") }
        #expect(both.status != 0)
        #expect(both.stderr.contains("one of them"))
    }
}
