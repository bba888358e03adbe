import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalStore

extension RelayProcessTests {
    /// A member of a mutual-TLS cluster (real `shoal serve` processes) whose database is restored from a backup
    /// taken before its last writes, which its peer already holds: it comes back as a fresh site under the same
    /// membership, says so in `shoal status`, gets back what it had sent, and its new writes reach the peer. Both
    /// files end with the same rows, read with plain SQLite.
    @Test func aMemberRestoredFromABackupRejoinsAsAFreshSiteAndLosesNothing() async throws {
        let world = try await RelayWorld("restored-member", nodes: ["a", "b"])
        defer { world.tearDown() }
        let interval = ["--round-interval", "200"]
        try await world.write("a", "INSERT INTO kv VALUES ('k1', 'one')")
        let pathA = world.paths["a"]!
        let backup = pathA + ".backup"
        try await world.write("a", "VACUUM INTO '\(backup)'")
        try await world.write("a", "INSERT INTO kv VALUES ('k2', 'two'), ('k3', 'three')")
        try await world.serve("a", relay: false, extra: interval)
        try await world.serve("b", relay: false, peers: ["a"], extra: interval)
        #expect(try await world.converge(["a", "b"]))
        let siteBefore = try #require(try await world.status("a")["site"] as? String)

        // a stops; its file is restored from the backup (the app's operator runs sqlite3 .restore).
        try await world.stop("a")
        try await world.stop("b")
        let restored = try await offPool { try sqlite3Shell(pathA, ".restore '\(backup)'") }
        #expect(restored.status == 0, "\(restored.stderr)")
        try await world.write("a", "INSERT INTO kv VALUES ('k4', 'after the restore')")

        try await world.serve("a", relay: false, extra: interval)
        try await world.serve("b", relay: false, peers: ["a"], extra: interval)
        let status = try await world.status("a")
        let change = try #require(status["identity_change"] as? [String: Any], "\(status)")
        #expect(change["reason"] as? String == "restored")
        #expect(change["previous_site"] as? String == siteBefore)
        #expect(status["site"] as? String != siteBefore)
        let text = try await offPool { try shoal("status", "--db", pathA) }.stdout
        #expect(text.contains("identity:   this database holds fewer of its own writes than it had already sent"))

        #expect(try await world.converge(["a", "b"]), "\(world.outputs)")
        for name in ["a", "b"] {
            let rows = try await offPool { try sqlite3Shell(world.paths[name]!, "SELECT k, v FROM kv ORDER BY k") }
            #expect(rows.stdout == "k1|one\nk2|two\nk3|three\nk4|after the restore\n", "node \(name)")
        }
        let same = try await offPool {
            try SQLiteConnection(path: world.paths["a"]!).applicationTableContents()
                == SQLiteConnection(path: world.paths["b"]!).applicationTableContents()
        }
        #expect(same)
    }
}
