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

    /// A backup taken while a write of the app's own connection waited unstamped in the outbox (no node ran since):
    /// the original stamped it when it next ran, and a peer overwrote it since. The restored file stamps it again,
    /// under its fresh site, at the time the app made it: the peer's later write stays on both, and no old value comes
    /// back over it. Rows compared outside Shoal.
    @Test func aRestoredBackupHoldingAWriteNotStampedYetLeavesWhatAPeerWroteSince() async throws {
        let world = try await RelayWorld("restored-outbox", nodes: ["a", "b"])
        defer { world.tearDown() }
        let pathA = world.paths["a"]!
        let backup = pathA + ".backup"
        try await world.write("a", "INSERT INTO kv VALUES ('x', 'old')")
        try await world.write("a", "VACUUM INTO '\(backup)'")
        try await world.serve("b", relay: false)
        try await world.serve("a", relay: false, peers: ["b"])
        #expect(try await world.holds("b", "old"))
        try await world.write("b", "UPDATE kv SET v = 'newer' WHERE k = 'x'")
        #expect(try await world.holds("a", "newer"))
        try await world.stop("a")
        let restored = try await offPool { try sqlite3Shell(pathA, ".restore '\(backup)'") }
        #expect(restored.status == 0, "\(restored.stderr)")
        try await world.serve("a", relay: false, peers: ["b"])
        #expect(try await world.converge(["a", "b"]), "\(world.outputs)")
        for path in [pathA, world.paths["b"]!] {
            #expect(try await offPool { try sqlite3Shell(path, "SELECT k, quote(v) FROM kv") }.stdout == "x|'newer'\n")
        }
        #expect(try await world.sameRows("a", "b"))
    }

    /// A member restored from a backup that reaches its cluster through the relay alone, whose last transaction
    /// before the restore another member overwrote before sending it on: the relay's range of its former site ends
    /// with a transaction none of its changes carry, so its version vector never claims it (that site never writes
    /// again). What the relay's ranges brought counts for its fresh state, which it takes; rows compared outside
    /// Shoal.
    @Test func aRestoredMemberWhoseLastWriteWasOverwrittenBeforeItReachedTheRelayTakesItsFreshStateThere()
        async throws
    {
        let world = try await RelayWorld("restored-overwritten", nodes: ["a", "b"])
        defer { world.tearDown() }
        let pathA = world.paths["a"]!
        let backup = pathA + ".backup"
        // a writes x and sends it to b over the LAN alone; a's file is backed up once it stopped.
        try await world.serve("b", relay: false)
        try await world.serve("a", relay: false, peers: ["b"])
        let siteA = try #require(try await world.status("a")["site"] as? String)
        try await world.write("a", "INSERT INTO kv VALUES ('x', 'zero')")
        #expect(try await world.holds("b", "zero"))
        try await world.stop("a")
        try await world.write("a", "VACUUM INTO '\(backup)'")
        // a updates x and sends that to b; b overwrites it, then uploads both sites to the relay.
        try await world.serve("a", relay: false, peers: ["b"])
        try await world.write("a", "UPDATE kv SET v = 'from a' WHERE k = 'x'")
        #expect(try await world.holds("b", "from a"))
        let last = try #require((try await world.status("a")["version_vector"] as? [String: Any])?[siteA] as? Int)
        try await world.stop("a")
        try await world.write("b", "UPDATE kv SET v = 'from b' WHERE k = 'x'")
        try await world.stop("b")
        try await world.serve("b")
        let head = "SELECT head FROM heads WHERE site = \(world.blob(siteA.uppercased()))"
        #expect(try await waitUntil(within: 30, checkingEvery: 100) { try await world.relayQuery(head) == "\(last)\n" })
        // a is restored from before its update, and comes back through the relay alone.
        let restored = try await offPool { try sqlite3Shell(pathA, ".restore '\(backup)'") }
        #expect(restored.status == 0, "\(restored.stderr)")
        try await world.serve("a")
        #expect(
            try await waitUntil(within: 30) { try await world.status("a")["awaits_fresh_state"] as? Bool == false },
            "\(world.outputs)"
        )
        try await world.write("a", "INSERT INTO kv VALUES ('y', 'after the restore')")
        #expect(try await world.converge(["a", "b"]), "\(world.outputs)")
        let rows = "SELECT k, quote(v) FROM kv ORDER BY k"
        let rowsA = try await offPool { try sqlite3Shell(pathA, rows) }.stdout
        #expect(rowsA == "x|'from b'\ny|'after the restore'\n")
        #expect(try await world.sameRows("a", "b"))
    }

    /// A member restored from a backup is asked to remove another member before it took its fresh state (members
    /// meet only through the relay, or only on direct links to b). Its removal would carry what the restored file
    /// held of the removed member, less than b holds, and it sends none of its writes before its fresh state: no
    /// other member could raise that line. So the command refuses it, with a typed error, and writes nothing; b
    /// removes it instead, and the restored member takes its fresh state, learns the removal, and both end with the
    /// same fences and rows.
    @Test(arguments: [true, false])
    func aRestoredMemberRefusesARemovalUntilItsFreshStateAndTakesTheLineAnotherMemberDraws(
        throughRelay: Bool
    ) async throws {
        let world = try await RelayWorld("restored-remover", nodes: ["a", "b", "c"])
        defer { world.tearDown() }
        let interval = ["--round-interval", "200"]
        let serve = { (name: String) async throws in
            if throughRelay {
                try await world.serve(name, extra: interval)
            } else {
                try await world.serve(name, relay: false, peers: name == "b" ? [] : ["b"], extra: interval)
            }
        }
        try await serve("b")
        try await serve("a")
        try await serve("c")
        try await world.write("c", "INSERT INTO kv VALUES ('c1', 'from c')")
        #expect(try await world.converge(["a", "b", "c"]))
        let pathA = world.paths["a"]!
        let backup = pathA + ".backup"
        try await world.write("a", "VACUUM INTO '\(backup)'")
        try await world.write("a", "INSERT INTO kv VALUES ('a1', 'sent, then lost to the restore')")
        #expect(try await world.converge(["a", "b", "c"]))
        try await world.stop("a")
        // c writes more while a is away: b gets it, a's restored file never had it.
        try await world.write("c", "INSERT INTO kv VALUES ('c2', 'after the backup'), ('c3', 'also')")
        #expect(try await world.converge(["b", "c"]))
        try await world.stop("c")
        let restored = try await offPool { try sqlite3Shell(pathA, ".restore '\(backup)'") }
        #expect(restored.status == 0, "\(restored.stderr)")
        let cID = try await offPool { try shoal("id", "--db", world.paths["c"]!) }.stdout
            .split(separator: "\n").last.map(String.init) ?? ""
        let fences = { (name: String) async throws -> String in
            let path = world.paths[name]!
            return try await offPool { try sqlite3Shell(path, "SELECT hex(site), seq FROM shoal_fences ORDER BY site") }
                .stdout
        }
        let refused = try await offPool { try shoal("trust", "remove", cID, "--db", pathA) }
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("awaits its fresh state"), "\(refused.stderr)")
        #expect(refused.stderr.contains("on another member"), "\(refused.stderr)")
        #expect(try await fences("a").isEmpty, "nothing was written: no line drawn")
        let removed = try await offPool { try shoal("trust", "remove", cID, "--db", world.paths["b"]!) }
        #expect(removed.status == 0, "\(removed.stderr)")

        try await serve("a")
        let change = try #require(try await world.status("a")["identity_change"] as? [String: Any])
        #expect(change["reason"] as? String == "restored")
        let converged = try await world.converge(["a", "b"], within: 90)
        let statuses = converged ? [:] : ["a": try await world.status("a"), "b": try await world.status("b")]
        #expect(converged, "\(world.outputs)\n\(statuses)")
        #expect(try await waitUntil(within: 30, checkingEvery: 200) {
            let (a, b) = (try await fences("a"), try await fences("b"))
            return a == b && !a.isEmpty
        })
        for name in ["a", "b"] {
            let rows = try await offPool { try sqlite3Shell(world.paths[name]!, "SELECT k, v FROM kv ORDER BY k") }
            #expect(
                rows.stdout == "a1|sent, then lost to the restore\nc1|from c\nc2|after the backup\nc3|also\n",
                "node \(name)"
            )
        }
        let same = try await offPool {
            try SQLiteConnection(path: world.paths["a"]!).applicationTableContents()
                == SQLiteConnection(path: world.paths["b"]!).applicationTableContents()
        }
        #expect(same)
    }
}
