import Crypto
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import ShoalTestSupport
import Testing
import X509

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalSecurity
@testable import ShoalStore
@testable import ShoalTransport

/// The security matrix over real sockets: each case is a test with its expected outcome.
@Suite(.serialized) struct PeerSecurityTests {
    @Test func membersOnTheRosterSyncOverMutualTLS() async throws {
        let directory = try temporaryDirectory("tls-members")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let a = try await startSecured(paths[0])
        defer { Task { await a.stop() } }
        let b = try await startSecured(paths[1], peers: [a.port])
        defer { Task { await b.stop() } }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('from a', 1)")
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('from b', 2)")
        #expect(try await holds(b, key: "from a"))
        #expect(try await holds(a, key: "from b"))
        // The roster replicates too, like any table: both know both members.
        #expect(b.security.trust.roster.isMember(a.nodeID) && a.security.trust.roster.isMember(b.nodeID))
    }

    /// Each member's roster is the founder's as of its own join: b knows a and b; c and d joined after it. With the
    /// founder away, b dials c, and d dials b: b takes both as members from the admissions their certificates show
    /// (before, b refused them as "not on the roster: pending" until it synced with a member it knew, so a member
    /// whose only peers joined after it never converged). Rows compared outside Shoal.
    @Test func aMemberAdmittedAfterAnotherShowsItsAdmissionAndTheyConvergeWithoutTheFounder() async throws {
        let directory = try temporaryDirectory("tls-later-member")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c", "d"], in: directory)
        let ids = try paths.map { try KeyFile.load(forDatabase: $0).identity.nodeID }
        let before = try Membership.roster(store: try Store(path: paths[1]), cluster: try KeyFile.load(forDatabase: paths[1]).cluster.id)
        #expect(before.isMember(ids[1]) && !before.isMember(ids[2]) && !before.isMember(ids[3]))

        let c = try await startSecured(paths[2])
        defer { Task { await c.stop() } }
        let b = try await startSecured(paths[1], peers: [c.port])  // b verifies c's certificate as the client
        defer { Task { await b.stop() } }
        let d = try await startSecured(paths[3], peers: [b.port])  // and d's as the server
        defer { Task { await d.stop() } }
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('from b', x'00ff')")
        try await c.node.execute("INSERT INTO kv(k, v) VALUES ('from c', 2.5)")
        try await d.node.execute("INSERT INTO kv(k, v) VALUES ('from d', 'd')")
        for node in [b, c, d] {
            for key in ["from b", "from c", "from d"] { #expect(try await holds(node, key: key), "\(node.path) \(key)") }
        }
        #expect(b.security.trust.roster.isMember(ids[2]) && b.security.trust.roster.isMember(ids[3]))
        let said = await failures(b)
        #expect(said.allSatisfy { !$0.contains("not on the roster") }, "\(said)")
        // The adds then reach b's roster table by sync, like any record.
        #expect(
            try await waitUntil(within: 15) {
                let stored = try await b.node.store.read { store throws(ShoalError) in try store.rosterRecords() }
                let roster = Roster(records: stored.compactMap { try? RosterRecord(decoding: $0) }, clusterID: before.clusterID)
                return roster.isMember(ids[2]) && roster.isMember(ids[3])
            }
        )
        let query = "SELECT k, quote(v), typeof(v) FROM kv ORDER BY k"
        let rows = try [b, c, d].map { try sqlite3Shell($0.path, query).stdout }
        #expect(rows[0].contains("from d") && rows.allSatisfy { $0 == rows[0] }, "\(rows)")
    }

    @Test func anUnknownKeyGetsNothingAndIsListedAsPending() async throws {
        let directory = try temporaryDirectory("tls-unknown")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('secret', 1)")
        // A stranger: a cluster of its own, dialling a.
        let stranger = try await startSecured(try makeDatabase("stranger", in: directory), peers: [a.port])
        defer { Task { await stranger.stop() } }
        let refused = await stranger.log.seen(within: 15) { event in
            if case .connectionFailed = event { true } else { false }
        }
        #expect(refused)
        var pending: [PendingDevice] = []
        #expect(
            await waitUntil(within: 15) {
                pending = a.security.trust.pendingDevices
                return !pending.isEmpty
            }
        )
        #expect(pending.first?.nodeID == stranger.nodeID)
        #expect(pending.first?.name == "stranger")
        #expect(pending.first?.address == "127.0.0.1")
        // No data crossed, and a never saw a hello from it.
        #expect(try await stranger.node.execute("SELECT count(*) FROM kv").rows == [[.integer(0)]])
        #expect(await !a.log.events.contains { if case .peerConnected = $0 { true } else { false } })
        // The stranger refused a's key in its turn, before a byte of data: a is not on its roster either.
        let explained = await stranger.log.seen(within: 15) { event in
            if case .connectionFailed(_, let reason) = event { reason.contains("roster") } else { false }
        }
        let said = await failures(stranger)
        #expect(explained, "\(said)")
    }

    @Test func aClientWithoutACertificateIsRefused() async throws {
        let directory = try temporaryDirectory("tls-nocert")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        let probe = try await tlsProbe(port: a.port, certificate: nil)
        #expect(probe.received == 0, "the node sent \(probe.received) bytes of application data")
        #expect(probe.error != nil)
        #expect(a.security.trust.pendingDevices.isEmpty)
        #expect(await !a.log.events.contains { if case .peerConnected = $0 { true } else { false } })
    }

    @Test func aCertificateWithAKeyOtherThanP256IsRefused() async throws {
        let directory = try temporaryDirectory("tls-badcert")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        // A well-formed certificate with a P-384 key, and a file of garbage where a certificate should be.
        let key = P384.Signing.PrivateKey()
        let name = try DistinguishedName { CommonName("p384") }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: .init(),
            publicKey: .init(key.publicKey),
            notValidBefore: Date().addingTimeInterval(-60),
            notValidAfter: Date().addingTimeInterval(3600),
            issuer: name,
            subject: name,
            signatureAlgorithm: .ecdsaWithSHA384,
            extensions: Certificate.Extensions(),
            issuerPrivateKey: .init(key)
        )
        let probe = try await tlsProbe(
            port: a.port,
            certificate: (
                try NIOSSLCertificate(bytes: Array(try certificate.serializeAsPEM().pemString.utf8), format: .pem),
                try NIOSSLPrivateKey(bytes: Array(key.pemRepresentation.utf8), format: .pem)
            )
        )
        #expect(probe.received == 0, "the node sent \(probe.received) bytes of application data")
        #expect(a.security.trust.pendingDevices.isEmpty)
        // The node's own check says why (its log of refused connections).
        let said = await a.log.seen(within: 10) { event in
            if case .inboundConnectionFailed(_, let reason) = event { reason.contains("not usable") } else { false }
        }
        let events = await a.log.events
        #expect(said, "\(events)")
    }

    @Test func aTLS12OnlyClientIsRefusedAndAScannerSeesTLS13Only() async throws {
        let directory = try temporaryDirectory("tls-versions")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        for version in ["-tls1", "-tls1_1", "-tls1_2"] {
            let old = try await opensslClient(port: a.port, [version])
            #expect(old.status != 0, "\(version) was accepted: \(old.stdout)\(old.stderr)")
        }
        // TLS 1.3 gets as far as the certificate request (no certificate here, so no session), and says so.
        let scan = try await opensslClient(port: a.port, ["-tls1_3", "-alpn", "shoal/1"])
        #expect(scan.stderr.contains("TLSv1.3") || scan.stdout.contains("TLSv1.3"), "\(scan.stdout)\(scan.stderr)")
    }

    @Test func aHelloWhoseSiteIDIsNotTheOneTheRosterBindsIsRefused() async throws {
        let directory = try temporaryDirectory("tls-site")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let a = try await startSecured(paths[0])
        defer { Task { await a.stop() } }
        // b's key, copied beside another member's database (another site id): the key is a member, the site is not
        // the one the roster binds to it.
        let impostor = try makeDatabase("impostor", in: directory)
        try Membership.formLocally([paths[0], impostor], now: SystemWallClock().nowMilliseconds())
        try FileManager.default.removeItem(atPath: KeyFile.path(forDatabase: impostor))
        try FileManager.default.copyItem(atPath: KeyFile.path(forDatabase: paths[1]), toPath: KeyFile.path(forDatabase: impostor))
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('secret', 1)")
        let b = try await startSecured(impostor, peers: [a.port])
        defer { Task { await b.stop() } }
        let site = String(try Store(path: impostor).siteID.hex.prefix(8))
        let refused = await b.log.seen(within: 15) { event in
            switch event {
            case .connectionFailed(_, let reason), .peerDisconnected(_, let reason): reason.contains("not \(site)")
            default: false
            }
        }
        let seen = await failures(b)
        #expect(refused, "\(seen)")
        #expect(try await b.node.execute("SELECT count(*) FROM kv WHERE k = 'secret'").rows == [[.integer(0)]])
    }

    @Test func aMemberKeyOfAnotherClusterIsRefusedForTheClusterMismatch() async throws {
        let directory = try temporaryDirectory("tls-cluster")
        defer { try? FileManager.default.removeItem(at: directory) }
        let aPath = try makeDatabase("a", in: directory)
        let otherPath = try makeDatabase("other", in: directory)
        // a's roster accepts other's key (trust add), but other still belongs to its own cluster.
        let other = try KeyFile.load(forDatabase: otherPath)
        let aKey = try KeyFile.load(forDatabase: aPath)
        let record = try RosterRecord.make(
            .add,
            cluster: aKey.cluster.id,
            subject: other.identity.nodeID,
            subjectKey: other.identity.publicKeyDER,
            name: "other",
            signer: aKey.identity,
            signerSite: try Store(path: aPath).siteID,
            at: SystemWallClock().nowMilliseconds()
        )
        try Store(path: aPath).addRosterRecord(record.encoded, id: record.id)
        let a = try await startSecured(aPath)
        defer { Task { await a.stop() } }
        let b = try await startSecured(otherPath, peers: [a.port])
        defer { Task { await b.stop() } }
        // The stranger refuses a's key in its turn (a is not on its roster); a sees the other cluster where they meet.
        #expect(await b.log.seen(within: 15) { if case .connectionFailed = $0 { true } else { false } })
        #expect(await !a.log.events.contains { if case .peerConnected = $0 { true } else { false } })
        #expect(try await b.node.execute("SELECT count(*) FROM kv").rows == [[.integer(0)]])
    }

    @Test func aRemovedNodeIsRefusedByEveryMemberWithinSecondsAndNeverReAdded() async throws {
        let directory = try temporaryDirectory("tls-remove")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let a = try await startSecured(paths[0]) { $0.rememberPeers = true }
        defer { Task { await a.stop() } }
        let c = try await startSecured(paths[2], peers: [a.port]) { $0.rememberPeers = true }
        defer { Task { await c.stop() } }
        let b = try await startSecured(paths[1], peers: [a.port, c.port])
        defer { Task { await b.stop() } }
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('before', 1)")
        #expect(try await holds(a, key: "before"))
        #expect(try await holds(c, key: "before"))
        let bID = b.nodeID
        let siteB = b.node.siteID
        func remembersB(_ member: SecuredNode) async -> Bool {
            let known = try? await member.node.readStore { store throws(ShoalError) in try store.knownPeers() }
            return known?.contains { $0.siteID == siteB } ?? false
        }
        // Both remember where b is (it dialled them and finished rounds), to dial it after a restart.
        #expect(await waitUntil(within: 10) { await remembersB(a) })

        // A person removes b on a; the removal travels to c as a roster row, like any data.
        let aKey = try KeyFile.load(forDatabase: paths[0])
        let removal = try RosterRecord.make(
            .remove,
            cluster: aKey.cluster.id,
            subject: bID,
            name: "b",
            signer: aKey.identity,
            signerSite: try Store(path: paths[0]).siteID,
            at: SystemWallClock().nowMilliseconds()
        )
        let removedAt = Date()
        try await a.node.withStore { store throws(ShoalError) in try store.addRosterRecord(removal.encoded, id: removal.id) }
        #expect(
            await waitUntil(within: 5) {
                !a.security.trust.roster.isMember(bID) && !c.security.trust.roster.isMember(bID)
            }
        )
        // Both closed b's connections: b has no live peer left, within 5 s of the removal.
        #expect(await waitUntil(within: 5) { await b.node.peerStatuses().allSatisfy { !$0.isConnected } })
        // And b is forgotten, so no member dials it again after a restart.
        #expect(await waitUntil(within: 5) { await !remembersB(a) })
        #expect(await waitUntil(within: 5) { await !remembersB(c) })
        #expect(Date().timeIntervalSince(removedAt) < 5)
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('after', 2)")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('members only', 3)")
        #expect(try await holds(c, key: "members only"))
        #expect(try await !holds(a, key: "after", within: 2))
        #expect(try await b.node.execute("SELECT count(*) FROM kv WHERE k = 'members only'").rows == [[.integer(0)]])

        // A stale view cannot bring b back: c signs a new add for b; the removal still wins on every member.
        let cKey = try KeyFile.load(forDatabase: paths[2])
        let member = try #require(a.security.trust.roster.records.first { $0.subject == bID && $0.action == .add })
        let readd = try RosterRecord.make(
            .add,
            cluster: cKey.cluster.id,
            subject: bID,
            subjectKey: member.subjectKey,
            siteID: member.siteID,
            name: "b again",
            signer: cKey.identity,
            signerSite: try Store(path: paths[2]).siteID,
            at: SystemWallClock().nowMilliseconds() + 60_000
        )
        try await c.node.withStore { store throws(ShoalError) in try store.addRosterRecord(readd.encoded, id: readd.id) }
        #expect(
            await waitUntil(within: 10) {
                a.security.trust.roster.records.contains { $0.id == readd.id }
            }
        )
        #expect(!a.security.trust.roster.isMember(bID) && !c.security.trust.roster.isMember(bID))
        // Deleting the removal's row by hand (and the delete spreading) does not revive b either.
        let hexID = removal.id.map { String(format: "%02x", $0) }.joined()
        #expect(try sqlite3Shell(a.path, "DELETE FROM shoal_roster WHERE id = x'\(hexID)'").status == 0)
        await a.security.refreshRoster()
        #expect(!a.security.trust.roster.isMember(bID))
    }

    @Test func aStalledClientHelloIsClosedAtTheDeadlineWhileOtherPeersSync() async throws {
        let directory = try temporaryDirectory("tls-stall")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let a = try await startSecured(paths[0]) { $0.session.handshakeTimeout = 2_000 }
        defer { Task { await a.stop() } }
        // Half a ClientHello (a TLS record header promising more), then silence.
        let stalled = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: a.port).get()
        try await stalled.writeAndFlush(ByteBuffer(bytes: [0x16, 0x03, 0x01, 0x02, 0x00, 0x01])).get()
        let opened = Date()
        let b = try await startSecured(paths[1], peers: [a.port])
        defer { Task { await b.stop() } }
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('meanwhile', 1)")
        #expect(try await holds(a, key: "meanwhile"))
        try await stalled.closeFuture.get()
        let closedAfter = Date().timeIntervalSince(opened)
        #expect(closedAfter >= 1.5 && closedAfter < 10, "closed after \(closedAfter) s")
    }

    @Test func aThousandHalfOpenConnectionsKeepMemoryBoundedWhileRealPeersSync() async throws {
        let directory = try temporaryDirectory("tls-flood")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let a = try await startSecured(paths[0]) { $0.session.handshakeTimeout = 10_000 }
        defer { Task { await a.stop() } }
        let before = residentMiB()
        var sockets: [any Channel] = []
        for index in 0..<1_000 {
            // From another loopback address than the real peer's: the flood fills its own address's share of the
            // pool of handshaking connections, not b's.
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .bind(to: try SocketAddress(ipAddress: "127.0.0.2", port: 0))
                .connect(host: "127.0.0.1", port: a.port).get()
            if index % 2 == 0 { try? await channel.writeAndFlush(ByteBuffer(bytes: [0x16, 0x03, 0x01])).get() }
            sockets.append(channel)
        }
        defer { for socket in sockets { socket.close(promise: nil) } }
        let b = try await startSecured(paths[1], peers: [a.port])
        defer { Task { await b.stop() } }
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('through the flood', 1)")
        #expect(try await holds(a, key: "through the flood", within: 30))
        // The node holds at most its pool of handshakes (4 from the flood's address) besides b: the rest were closed
        // at once, so nothing per socket stays in memory.
        let held = await a.node.connectionCount
        #expect(held <= 1 + 4, "\(held) connections held")
        let open = sockets.filter(\.isActive).count
        #expect(open <= 64, "\(open) half-open connections are still held")
        // This process's memory (the flood's sockets, the node, and the suites running beside it) stays far from
        // growing per socket.
        let grown = residentMiB() - before
        #expect(grown < 500, "resident memory grew by \(grown) MiB")
    }
}

/// This process's resident memory, in MiB.
private func residentMiB() -> Double {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kib = Double(line.split(whereSeparator: { $0 == " " || $0 == "\t" })[1])
    else { return 0 }
    return kib / 1024
}

extension PeerSecurityTests {
    @Test func aNodeWithoutSecurityRefusesToStartUnlessToldItIsInsecure() async throws {
        let directory = try temporaryDirectory("tls-required")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = try makeDatabase("a", in: directory)
        await #expect(throws: ShoalError.self) { _ = try await SyncNode(configuration: NodeConfiguration(databasePath: path)) }
        var plain = NodeConfiguration(databasePath: path)
        plain.insecurePlaintext = true
        _ = try await SyncNode(configuration: plain)
        // The command line's flag says so at every start.
        let node = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", path, "--insecure-plaintext", "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"]
        )
        defer { node.stop() }
        #expect(await node.line(within: 30) { $0.contains("WARNING: --insecure-plaintext") } != nil, "\(node.output)")
    }
}
