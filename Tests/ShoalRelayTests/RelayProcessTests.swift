import Foundation
import ShoalCore
import ShoalRelayClient
import ShoalRelayProtocol
import ShoalSecurity
import ShoalStore
import ShoalTestSupport
import Testing

/// Nodes that sync only through a relay, every part a real process: `shoal relay serve` and `shoal serve`. One
/// test at a time: each runs a relay and up to five nodes, on a machine of two cores.
@Suite(.serialized) struct RelayProcessTests {
    @Test func twoNodesThatNeverSeeEachOtherConvergeAndTheRelayHoldsNoByteOfTheirData() async throws {
        let world = try await RelayWorld("relay-two", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        let marker = "MARKER-\(UInt64.random(in: 0...UInt64.max))-SECRET"
        // Every SQLite type, TEXT with a NUL and invalid UTF-8, rows of several KB and a 3 MB BLOB, written by
        // another program (the sqlite3 shell) on both sides.
        try await world.write(
            "a",
            """
            INSERT INTO kv VALUES ('marker', '\(marker)');
            INSERT INTO kv VALUES ('int', 42), ('real', 2.5), ('null', NULL), ('blob', x'00ff10');
            INSERT INTO kv VALUES ('nul', CAST(x'610062' AS TEXT)), ('bad-utf8', CAST(x'c328ff' AS TEXT));
            INSERT INTO kv VALUES ('big', randomblob(3000000));
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
            INSERT INTO kv SELECT 'row' || i, printf('%.4000c', 'x') || i FROM n;
            """
        )
        try await world.write("b", "INSERT INTO kv VALUES ('from b', 'b wrote this')")
        #expect(try await world.converge(["a", "b"]))
        // Both directions, and later writes too (the long-poll delivers them without a restart).
        try await world.write("b", "UPDATE kv SET v = 'b changed it' WHERE k = 'int'")
        #expect(try await world.converge(["a", "b"]))
        let status = try await world.relayStatus("a")
        #expect(status["reachable"] as? Bool == true)
        #expect(try await waitUntil(within: 10) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        // The relay acknowledges like a peer: once it holds a's writes, a has nothing pending, though no peer ever
        // connected to it.
        #expect(try await waitUntil(within: 10) { (try await world.status("a"))["pending_local_changes"] as? Int == 0 })
        // Status lists it among the peers, with what it acknowledged.
        let text = try await offPool { try shoal("status", "--db", world.paths["a"]!) }.stdout
        let peers = text.components(separatedBy: "peers:\n").last ?? ""
        #expect(peers.contains("(relay): live, last sync ") && peers.contains("holds every write of this node's"), "\(text)")
        // The relay's files (database, WAL, shared memory) hold no byte of the marker.
        let needle = Data(marker.utf8)
        let files = try filesBytes(under: world.relayData)
        #expect(!files.isEmpty)
        for (name, bytes) in files {
            #expect(bytes.range(of: needle) == nil, "the relay's \(name) holds the marker")
            #expect(bytes.range(of: Data("b wrote this".utf8)) == nil, "the relay's \(name) holds a value")
        }
    }

    @Test func schemaChangesCrossTheRelayInOrderWithTheDataAndANodeOfflineThroughThreeCatchesUp() async throws {
        let world = try await RelayWorld("relay-schema", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        try await world.write("a", "INSERT INTO kv VALUES ('one', 1)")
        #expect(try await world.converge(["a", "b"]))
        // a's app update adds a column (the sqlite3 shell, behind Shoal's back) and writes it.
        try await world.write("a", "ALTER TABLE kv ADD COLUMN colour TEXT DEFAULT 'grey'; UPDATE kv SET colour = 'red'")
        try await world.write("b", "INSERT INTO kv(k, v) VALUES ('two', 2)")
        #expect(try await world.converge(["a", "b"]))
        let b = world.paths["b"]!
        #expect(try await offPool { try sqlite3Shell(b, "SELECT k, colour FROM kv ORDER BY k") }.stdout == "one|red\ntwo|grey\n")
        // b is away while a makes three more schema changes (two columns and a new replicated table) with data.
        try await world.stop("b")
        try await world.write("a", "ALTER TABLE kv ADD COLUMN size INTEGER DEFAULT 0; UPDATE kv SET size = 3")
        try await world.write("a", "ALTER TABLE kv ADD COLUMN note TEXT; UPDATE kv SET note = 'n' WHERE k = 'two'")
        let a = world.paths["a"]!
        #expect(try await offPool { try shoal("sql", "--db", a, "CREATE TABLE tags(id INTEGER PRIMARY KEY, name TEXT)") }.status == 0)
        #expect(try await offPool { try shoal("replicate", "--db", a, "tags") }.status == 0)
        try await world.write("a", "INSERT INTO tags VALUES (1, 'fresh')")
        try await world.serve("b")
        #expect(try await world.converge(["a", "b"]))
        #expect(try await offPool { try sqlite3Shell(b, "SELECT k, colour, size, note FROM kv ORDER BY k") }.stdout
            == "one|red|3|\ntwo|grey|3|n\n")
        #expect(try await offPool { try sqlite3Shell(b, "SELECT name FROM tags") }.stdout == "fresh\n")
        let status = try await world.status("b")
        // colour, size, note and tags (kv was each node's starting schema, replicated before any sync).
        #expect((status["schema"] as? [String: Any])?["changes"] as? Int == 4, "\(status)")
        // The relay stays blind to schema changes: the DDL a recorded (names, types, defaults, the new table's
        // statement) is in a's file, and no byte of it in the relay's (database, WAL, shared memory).
        let needles = ["colour", "DEFAULT 'grey'", "\"size\" INTEGER DEFAULT 0", "\"note\" TEXT", "CREATE TABLE tags"]
        let recorded = try await offPool { try sqlite3Shell(a, "SELECT group_concat(definition, ' | ') FROM shoal_schema") }
        for needle in needles {
            #expect(recorded.stdout.contains(needle), "a recorded \(recorded.stdout), not \(needle)")
        }
        let files = try filesBytes(under: world.relayData)
        #expect(!files.isEmpty)
        for (name, bytes) in files {
            for needle in needles {
                #expect(bytes.range(of: Data(needle.utf8)) == nil, "the relay's \(name) holds \(needle)")
            }
        }
    }

    @Test func aWriterThatStopsBeforeTheReaderFirstStartsStillReachesIt() async throws {
        let world = try await RelayWorld("relay-offline", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.write("a", "INSERT INTO kv VALUES ('left before b came', 1)")
        #expect(try await waitUntil(within: 30) {
            let relay = try await world.relayStatus("a")
            return relay["lacking"] as? Int == 0 && relay["lastPushMs"] != nil
        })
        try await world.stop("a")
        try await world.serve("b")
        // b gets everything a wrote (a cannot get b's own writes back: it is gone).
        let path = world.paths["b"]!
        #expect(try await waitUntil(within: 30, checkingEvery: 100) {
            try await offPool { try sqlite3Shell(path, "SELECT v FROM kv WHERE k = 'left before b came'") }.stdout == "1\n"
        })
        try await world.serve("a")
        #expect(try await world.converge(["a", "b"]))
    }

    @Test func aLANOfThreeWithOneRelayedNodeAndAFourthElsewhereConverge() async throws {
        let world = try await RelayWorld("relay-lan", nodes: ["a", "b", "c", "d"])
        defer { world.tearDown() }
        // a, b and c form a LAN (static peers, no mDNS); only a knows the relay. d is elsewhere: relay only.
        try await world.serve("a")
        try await world.serve("b", relay: false, peers: ["a"])
        try await world.serve("c", relay: false, peers: ["a", "b"])
        try await world.serve("d")
        try await world.write("b", "INSERT INTO kv VALUES ('b on the LAN', 1)")
        try await world.write("c", "INSERT INTO kv VALUES ('c on the LAN', 2)")
        try await world.write("d", "INSERT INTO kv VALUES ('d far away', 3)")
        #expect(try await world.converge(["a", "b", "c", "d"]))
    }

    @Test func aWrongTokenIsRefusedOnceAndTheNodeBacksOffAndSaysSo() async throws {
        let world = try await RelayWorld("relay-token", nodes: ["a"])
        defer { world.tearDown() }
        let node = try await world.serve("a", token: "shoal-relay-" + String(repeating: "0", count: 64))
        let refusal = await node.line(within: 30) { $0.contains("refused the token") }
        #expect(refusal?.contains("unknown token") == true)
        #expect(try await waitUntil(within: 10) { (try await world.relayStatus("a"))["unauthorized"] as? Bool == true })
        // One line, not one per retry: the next try is a minute away at the least.
        #expect(node.output.components(separatedBy: "refused the token").count == 2)
        let status = try await world.relayStatus("a")
        #expect((status["lastError"] as? String)?.contains("unknown token") == true)
    }

    @Test func aRevokedTokenStopsTheNodeAndTheStatusSaysWhy() async throws {
        let world = try await RelayWorld("relay-revoke", nodes: ["a", "b"])
        defer { world.tearDown() }
        let node = try await world.serve("a")
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["reachable"] as? Bool == true })
        let data = world.relayData
        let token = world.token
        let revoked = try await offPool { try shoal("relay", "token", "revoke", "--data", data, token) }
        #expect(revoked.status == 0)
        try await world.write("a", "INSERT INTO kv VALUES ('after revocation', 1)")
        let refusal = await node.line(within: 30) { $0.contains("refused the token") }
        #expect(refusal?.contains("revoked") == true)
        let count = try await world.relayQuery("SELECT count(*) FROM ranges")
        // Nothing of a's later write reached the relay: b, with its own (revoked: the same) token, gets nothing.
        try await world.serve("b")
        #expect(try await waitUntil(within: 20) { (try await world.relayStatus("b"))["unauthorized"] as? Bool == true })
        #expect(try await world.relayQuery("SELECT count(*) FROM ranges") == count)
    }

    @Test func aRelayDownThenUpAndKilledMidUploadLosesAndDuplicatesNothing() async throws {
        let world = try await RelayWorld("relay-faults", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        try await world.write("a", "INSERT INTO kv VALUES ('before', 1)")
        #expect(try await world.converge(["a", "b"]))
        // Down: writes go on on both sides, and the status says the relay does not answer.
        try await world.stopRelay()
        try await world.write("a", "INSERT INTO kv VALUES ('while down a', 2)")
        try await world.write("b", "INSERT INTO kv VALUES ('while down b', 3)")
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["reachable"] as? Bool == false })
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["lacking"] as? Int ?? 0 > 0 })
        try await world.startRelay()
        #expect(try await world.converge(["a", "b"], within: 90))
        // A transaction of 40,000 rows of 2 KB (about 80 MB, many requests): the relay is killed mid-upload.
        try await world.write(
            "a",
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40000)
            INSERT INTO kv SELECT 'bulk' || i, printf('%.2000c', 'y') || i FROM n;
            """
        )
        #expect(try await waitUntil(within: 60, checkingEvery: 20) {
            Int(try await world.relayQuery("SELECT count(*) FROM chunks").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 > 3
        })
        try await world.stopRelay(kill: true)
        try await world.startRelay()
        #expect(try await world.converge(["a", "b"], within: 120))
        // Each site's ranges form one chain, each starting where the one before ended: nothing twice, no gap.
        let chains = try await world.relayQuery(
            """
            SELECT count(*) FROM ranges r WHERE snapshot = 0 AND from_seq != 0 AND NOT EXISTS
              (SELECT 1 FROM ranges p WHERE p.snapshot = 0 AND p.cluster = r.cluster AND p.site = r.site AND p.to_seq = r.from_seq);
            SELECT count(*) FROM (SELECT site, to_seq FROM ranges WHERE snapshot = 0 GROUP BY cluster, site, to_seq HAVING count(*) > 1);
            """
        )
        #expect(chains.split(separator: "\n") == ["0", "0"])
    }
}

/// Removing a member rotates the relay's sealing key: what is sealed afterwards opens only for the members left.
extension RelayProcessTests {
    @Test(arguments: StorageKind.allCases)
    func aRemovedMemberCannotReadWhatIsSealedAfterItsRemovalNorUseTheRelay(_ kind: StorageKind) async throws {
        let world = try await RelayWorld("relay-rotation", nodes: ["a", "b", "c", "d"], storage: kind)
        defer { world.tearDown() }
        try await world.serve("a")
        try await world.serve("b")
        let c = try await world.serve("c")
        try await world.write("a", "INSERT INTO kv VALUES ('before', 1)")
        #expect(try await world.converge(["a", "b", "c"]))
        // a removes c (through its file, as `shoal trust remove` does while a runs).
        let cPath = world.paths["c"]!
        let aPath = world.paths["a"]!
        let cID = try await offPool { try shoal("id", "--db", cPath) }.stdout
            .split(separator: "\n").last.map(String.init) ?? ""
        let removed = try await offPool { try shoal("trust", "remove", cID, "--db", aPath) }
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["epoch"] as? Int == 1 })
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("b"))["epoch"] as? Int == 1 })
        let marker = "AFTER-REMOVAL-\(UInt64.random(in: 0...UInt64.max))"
        try await world.write("a", "INSERT INTO kv VALUES ('after', '\(marker)')")
        let bPath = world.paths["b"]!
        #expect(try await waitUntil(within: 30, checkingEvery: 100) {
            try await offPool { try sqlite3Shell(bPath, "SELECT v FROM kv WHERE k = 'after'") }.stdout == marker + "\n"
        })
        // c's token is retired (it waits at the relay for a grant that never comes: after that wait it says so).
        #expect(await c.line(within: 30) { $0.contains("retired the token") } != nil)
        #expect(try await offPool { try sqlite3Shell(cPath, "SELECT count(*) FROM kv WHERE k = 'after'") }.stdout == "0\n")
        // Every change set sealed after the removal fails to open with what c holds, and opens for a.
        let cSeal = RelaySeal(clusterSecret: try KeyFile.load(forDatabase: cPath).cluster.secret)
        let aKeyring = try RelayKeyring.load(RelayKeyring.path(forDatabase: aPath))
        let aSeal = RelaySeal(secrets: aKeyring.secrets(clusterSecret: try KeyFile.load(forDatabase: aPath).cluster.secret), epoch: 1)
        let hex = try await world.relayQuery("SELECT \(world.hex("envelope")) FROM chunks")
        let envelopes = try hex.split(separator: "\n").map { line in
            try RelayEnvelope.decode(ArraySlice(stride(from: 0, to: line.count, by: 2).map { offset in
                let start = line.index(line.startIndex, offsetBy: offset)
                return UInt8(line[start..<line.index(start, offsetBy: 2)], radix: 16)!
            }))
        }
        let later = envelopes.filter { $0.epoch >= 1 }
        #expect(!later.isEmpty)
        for envelope in later {
            #expect(throws: ShoalError.self) { try cSeal.open(envelope) }
            #expect(throws: Never.self) { try aSeal.open(envelope) }
        }
        // d, a member that never ran before, starts with the original (retired) token: it finds its grant and reads
        // both epochs. e joins after the rotation: a sees it on the roster and leaves grants for it.
        try await world.serve("d")
        try await world.addMember("e", through: "a")
        try await world.serve("e")
        #expect(try await world.converge(["a", "b", "d", "e"], within: 90), "\(world.outputs)")
        // c deletes its removal from its file (so the stock binary serves again) and comes back with a token the
        // operator made later: the relay refuses what c seals with the keys it still holds, so nothing of it is
        // stored, and no member would apply it anyway (see RemovalFenceTests).
        try await world.stop("c")
        try await world.write("c", "DELETE FROM shoal_roster; DELETE FROM shoal_roster_seen")
        let storage = world.storageArguments
        let cluster = world.clusterID
        let made = try await offPool {
            try shoal(arguments: ["relay", "token", "create"] + storage + ["--cluster", cluster])
        }
        let laterToken = try #require(made.stdout.split(separator: "\n").last.map(String.init), "\(made.stderr)")
        let stored = try await world.relayQuery("SELECT count(*) FROM chunks")
        let hostile = try await world.serve("c", token: laterToken)
        try await world.write("c", "INSERT INTO kv VALUES ('hostile', 1); UPDATE kv SET v = 'taken' WHERE k = 'before'")
        #expect(await hostile.line(within: 30) { $0.contains("retired key epoch") } != nil, "\(hostile.output)")
        let ranges = try await world.relayQuery("SELECT \(world.hex("site")), from_seq, to_seq, uploader FROM ranges")
            + (try await world.relayQuery(
                "SELECT cluster, epoch FROM epochs UNION ALL SELECT cluster, epoch FROM upload_keys"
            ))
        let cKeyring = (try? RelayKeyring.load(RelayKeyring.path(forDatabase: cPath)))?.epochs.map(\.epoch) ?? []
        #expect(try await world.relayQuery("SELECT count(*) FROM chunks") == stored, "\(ranges)\n\(hostile.output) \(cKeyring)")
        try await world.write("a", "INSERT INTO kv VALUES ('still', 1)")
        #expect(try await world.converge(["a", "b", "d", "e"], within: 60))
        #expect(try await offPool { try sqlite3Shell(bPath, "SELECT v FROM kv WHERE k IN ('before', 'hostile')") }.stdout == "1\n")
    }
}

/// The relay over HTTPS: nodes check its certificate (here against a pinned CA file), and plain HTTP is refused
/// anywhere but loopback.
extension RelayProcessTests {
    @Test func nodesSyncOverHTTPSWithAPinnedCertificateAndRefuseAnUntrustedOne() async throws {
        let world = try await RelayWorld("relay-tls", nodes: ["a", "b", "c"])
        defer { world.tearDown() }
        let directory = world.directory.path
        let made = try await offPool {
            try runProcess(
                URL(fileURLWithPath: "/usr/bin/openssl"),
                [
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", directory + "/relay-key.pem", "-out", directory + "/relay-cert.pem", "-days", "2",
                    "-subj", "/CN=shoal relay test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                ]
            )
        }
        #expect(made.status == 0, "openssl: \(made.stderr)")
        try await world.stopRelay()
        try await world.startRelay(extra: ["--tls-cert", directory + "/relay-cert.pem", "--tls-key", directory + "/relay-key.pem"])
        #expect(world.relayURL.hasPrefix("https://"))
        try await world.serve("a", extra: ["--relay-ca", directory + "/relay-cert.pem"])
        try await world.serve("b", extra: ["--relay-ca", directory + "/relay-cert.pem"])
        try await world.write("a", "INSERT INTO kv VALUES ('over https', 1)")
        #expect(try await world.converge(["a", "b"]))
        // c trusts only the system's roots: the relay's self-signed certificate is refused, and c says why.
        try await world.serve("c")
        #expect(try await waitUntil(within: 30) {
            let error = (try await world.relayStatus("c"))["lastError"] as? String ?? ""
            return error.contains("TLS") || error.contains("certificate")
        })
        let cPath = world.paths["c"]!
        #expect(try await offPool { try sqlite3Shell(cPath, "SELECT count(*) FROM kv WHERE k = 'over https'") }.stdout == "0\n")
        // Its status names the cause, not "unreachable".
        #expect((try await world.relayStatus("c"))["problem"] as? String == "untrusted-certificate")
        let line = try await offPool { try shoal("status", "--db", cPath) }.stdout
        #expect(line.contains("its TLS certificate is not trusted here"), "\(line)")
        try await world.stop("c")

        // A certificate made for another host name, trusted: the status says so.
        let other = try await offPool {
            try runProcess(
                URL(fileURLWithPath: "/usr/bin/openssl"),
                [
                    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", directory + "/other-key.pem", "-out", directory + "/other-cert.pem", "-days", "2",
                    "-subj", "/CN=relay.example", "-addext", "subjectAltName=DNS:relay.example",
                ]
            )
        }
        #expect(other.status == 0, "openssl: \(other.stderr)")
        try await world.stopRelay()
        try await world.startRelay(extra: ["--tls-cert", directory + "/other-cert.pem", "--tls-key", directory + "/other-key.pem"])
        try await world.serve("c", extra: ["--relay-ca", directory + "/other-cert.pem"])
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("c"))["problem"] as? String == "wrong-host" })
        try await world.stop("c")

        // Bad TLS files are refused at start, each with what is wrong: a CA file that holds no certificate, a key that
        // does not go with its certificate.
        try "not a certificate\n".write(toFile: directory + "/garbage.pem", atomically: true, encoding: .utf8)
        let relayURL = world.relayURL
        let token = world.token
        let garbage = try await offPool {
            try shoal(
                "serve", "--db", cPath, "--no-mdns", "--relay", relayURL, "--relay-token", token, "--relay-ca",
                directory + "/garbage.pem"
            )
        }
        #expect(garbage.status != 0 && garbage.stderr.contains("--relay-ca") && garbage.stderr.contains("PEM"), "\(garbage.stderr)")
        let mismatched = try await offPool {
            try shoal(
                "relay", "serve", "--data", directory + "/relay-mismatch", "--listen", "127.0.0.1:0", "--tls-cert",
                directory + "/relay-cert.pem", "--tls-key", directory + "/other-key.pem"
            )
        }
        #expect(mismatched.status != 0 && mismatched.stderr.contains("does not go with the certificate"), "\(mismatched.stderr)")
    }

    @Test func plainHTTPIsRefusedAwayFromLoopbackOnBothSides() async throws {
        let directory = try temporaryDirectory("relay-plain")
        defer { try? FileManager.default.removeItem(at: directory) }
        let relay = try await offPool {
            try shoal("relay", "serve", "--data", directory.path + "/relay", "--listen", "0.0.0.0:0")
        }
        #expect(relay.status != 0)
        #expect(relay.stderr.contains("loopback"))
        let world = try await RelayWorld("relay-plain-node", nodes: ["a"])
        defer { world.tearDown() }
        let path = world.paths["a"]!
        let node = try await offPool {
            try shoal("serve", "--db", path, "--no-mdns", "--relay", "http://relay.example:80", "--relay-token", "x")
        }
        #expect(node.status != 0)
        #expect(node.stderr.contains("in clear"))
    }
}

extension RelayProcessTests {
    @Test func aNodeKilledMidPullResumesFromItsVersionVector() async throws {
        let world = try await RelayWorld("relay-midpull", nodes: ["a", "b"])
        defer { world.tearDown() }
        try await world.serve("a")
        // 40 transactions of 1,000 rows of 1 KB: b's pull takes many pages.
        for batch in 0..<40 {
            try await world.write(
                "a",
                """
                WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
                INSERT INTO kv SELECT 'r\(batch)-' || i, printf('%.1000c', 'z') || i FROM n;
                """
            )
        }
        #expect(try await waitUntil(within: 120) {
            let relay = try await world.relayStatus("a")
            return relay["lacking"] as? Int == 0 && relay["lastPushMs"] != nil
        })
        try await world.stop("a")
        try await world.serve("b")
        let path = world.paths["b"]!
        @Sendable func rows() async throws -> Int {
            Int(try await offPool { try sqlite3Shell(path, "SELECT count(*) FROM kv") }.stdout
                .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        }
        #expect(try await waitUntil(within: 60, checkingEvery: 5) { try await rows() > 0 })
        try await world.kill("b")
        let partial = try await rows()
        #expect(partial < 40_000, "b had everything before it was killed: the test did not cut a pull")
        try await world.serve("b")
        try await world.serve("a")
        #expect(try await world.converge(["a", "b"], within: 120))
        #expect(try await rows() == 40_000)
    }
}

/// A removed member's own relay range past its fence: what it overwrote within the fence reaches a member that syncs
/// only through the relay from a member's snapshot, never from that range.
extension RelayProcessTests {
    @Test func aRemovedMembersRangePastItsFenceReachesARelayOnlyMemberThroughASnapshot() async throws {
        let world = try await RelayWorld("relay-past-fence", nodes: ["a", "b", "c"])
        defer { world.tearDown() }
        let (aPath, bPath, cPath) = (world.paths["a"]!, world.paths["b"]!, world.paths["c"]!)
        let cSite = try Store(path: cPath).siteID
        // a and c meet over the LAN alone: a writes x, c overwrites it and writes y, a takes both.
        try await world.serve("a", relay: false)
        try await world.serve("c", relay: false, peers: ["a"])
        try await world.write("a", "INSERT INTO kv VALUES ('x', 'zero')")
        #expect(try await waitUntil(within: 30, checkingEvery: 100) {
            try await offPool { try sqlite3Shell(cPath, "SELECT v FROM kv") }.stdout == "zero\n"
        })
        try await world.write("c", "UPDATE kv SET v = 'first' WHERE k = 'x'")
        try await world.write("c", "INSERT INTO kv VALUES ('y', 1)")
        #expect(try await waitUntil(within: 30, checkingEvery: 100) {
            try await offPool { try sqlite3Shell(aPath, "SELECT group_concat(v) FROM kv") }.stdout == "first,1\n"
        })
        try await world.stop("a")
        try await world.stop("c")
        // c overwrites x again and uploads its site as one range, which holds x's value only as its last transaction
        // wrote it.
        try await world.write("c", "UPDATE kv SET v = 'second' WHERE k = 'x'")
        let last = try { () throws -> UInt64 in
            let store = try Store(path: cPath)
            try store.captureForeignWrites()
            return try store.versionVector()[cSite]
        }()
        try await world.serve("c")
        let head = "SELECT head FROM heads WHERE site = \(world.blob(cSite.hex))"
        let uploaded = try await waitUntil(within: 30, checkingEvery: 100) {
            try await world.relayQuery(head) == "\(last)\n"
        }
        let heads = try await world.relayQuery("SELECT \(world.hex("site")), head FROM heads")
        #expect(uploaded, "\(heads) \(cSite.hex) \(world.outputs)")
        try await world.stop("c")
        // b removes c holding nothing of it, a holding all but c's last transaction: that is the fence, and the last
        // transaction is refused.
        let cID = try await offPool { try shoal("id", "--db", cPath) }.stdout.split(separator: "\n").last.map(String.init)
        for path in [bPath, aPath] {
            let removed = try await offPool { try shoal("trust", "remove", cID ?? "", "--db", path) }
            #expect(removed.status == 0, "\(removed.stderr)")
        }
        // a and b sync through the relay alone: b takes c's first write of x from a's snapshot, not from c's range.
        try await world.serve("a")
        let b = try await world.serve("b")
        #expect(try await world.converge(["a", "b"], within: 90), "\(world.outputs)")
        let rows = "SELECT k, quote(v), typeof(v) FROM kv ORDER BY k"
        let aRows = try await offPool { try sqlite3Shell(aPath, rows) }.stdout
        #expect(aRows == "x|'first'|text\ny|1|integer\n")
        #expect(try await offPool { try sqlite3Shell(bPath, rows) }.stdout == aRows)
        let fences = "SELECT hex(site), seq FROM shoal_fences"
        #expect(try await offPool { try sqlite3Shell(bPath, fences) }.stdout == "\(cSite.hex.uppercased())|\(last - 1)\n")
        #expect(b.output.contains("runs past its fence"), "\(b.output)")
        #expect(try await world.relayQuery("SELECT count(*) FROM snapshots") == "1\n")
    }
}
