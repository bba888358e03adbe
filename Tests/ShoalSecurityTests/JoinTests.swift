import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalSecurity
@testable import ShoalStore
@testable import ShoalTransport

/// Invite codes over real sockets: a member running, a device joining with `JoinClient` as `shoal join` does.
@Suite(.serialized) struct JoinTests {
    /// A device's side: its key, name and site, from its database.
    private func join(_ code: InviteCode, device path: String, member: SecuredNode) async throws(ShoalError)
        -> JoinClient.Admission
    {
        let store = try Store(path: path)
        let keyFile = try KeyFile.load(forDatabase: path)
        return try await JoinClient.exchange(
            code: code,
            identity: keyFile.identity,
            name: try store.nodeName() ?? "device",
            siteID: store.siteID,
            address: PeerAddress(host: "127.0.0.1", port: member.port)
        )
    }

    @Test func theRightCodeAdmitsTheDeviceWhichThenSyncsWithItsOwnRows() async throws {
        let directory = try temporaryDirectory("join-right")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('member row', 1)")
        // The invite is made while a runs, through the database (as `shoal invite` does from another process).
        let code = try Membership.invite(store: try Store(path: a.path), now: SystemWallClock().nowMilliseconds())
        let device = try makeDatabase("device", in: directory)
        try Store(path: device).execute("INSERT INTO kv(k, v) VALUES ('device row', 2)")
        let admission = try await join(code, device: device, member: a)
        #expect(admission.cluster == a.security.keyFile.cluster)
        #expect(admission.member == a.nodeID)
        try JoinClient.adopt(admission, databasePath: device, store: try Store(path: device))
        #expect(try KeyFile.load(forDatabase: device).cluster == a.security.keyFile.cluster)
        // a put the device on its roster at once: the device's first connection syncs, both ways.
        let joined = try await startSecured(device, peers: [a.port])
        defer { Task { await joined.stop() } }
        #expect(try await holds(joined, key: "member row"))
        #expect(try await holds(a, key: "device row"))
        #expect(a.security.trust.roster.members[joined.nodeID]?.siteID == (try Store(path: device)).siteID)
        // Used once: the same code again is refused.
        let other = try makeDatabase("other", in: directory)
        await #expect(throws: ShoalError.self) { try await join(code, device: other, member: a) }
    }

    @Test func aWrongCodeBurnsTheInviteSoASecondGuessFindsItUsed() async throws {
        let directory = try temporaryDirectory("join-wrong")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        let code = try Membership.invite(store: try Store(path: a.path), now: SystemWallClock().nowMilliseconds())
        // Same invite id, another secret: one guess.
        var guess = InviteCode.generate()
        while guess.secret == code.secret || guess.id != code.id {
            let text = code.id + String(InviteCode.generate().description.dropFirst(2))
            guess = try InviteCode(parsing: text)
        }
        let device = try makeDatabase("device", in: directory)
        do {
            _ = try await join(guess, device: device, member: a)
            Issue.record("a wrong code was accepted")
        } catch {
            #expect(error.code == .invite)
            #expect(error.message.contains("did not prove the code"), "\(error.message)")
        }
        // The invite is burnt: even the right code is refused now, and both attempts were counted.
        do {
            _ = try await join(code, device: device, member: a)
            Issue.record("a burnt invite was accepted")
        } catch {
            #expect(error.message.contains("burnt by an attempt with a wrong code"), "\(error.message)")
        }
        #expect(try Store(path: a.path).joinFailures(since: 0) == 2)
        #expect(!a.security.trust.roster.isMember(try KeyFile.load(forDatabase: device).identity.nodeID))
        // And the device is unchanged: still a cluster of its own.
        #expect(try KeyFile.load(forDatabase: device).cluster != a.security.keyFile.cluster)
    }

    @Test func anExpiredCodeAndAnUnknownCodeAreRefused() async throws {
        let directory = try temporaryDirectory("join-expired")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startSecured(try makeDatabase("a", in: directory))
        defer { Task { await a.stop() } }
        let now = SystemWallClock().nowMilliseconds()
        // Made eleven minutes ago, valid ten.
        let code = try Membership.invite(store: try Store(path: a.path), minutes: 10, now: now - 11 * 60_000)
        let device = try makeDatabase("device", in: directory)
        do {
            _ = try await join(code, device: device, member: a)
            Issue.record("an expired code was accepted")
        } catch {
            #expect(error.message.contains("expired"), "\(error.message)")
        }
        let unknown = try InviteCode(parsing: "ZZ" + String(code.description.dropFirst(2)))
        if unknown.id != code.id {
            do {
                _ = try await join(unknown, device: device, member: a)
                Issue.record("an unknown code was accepted")
            } catch {
                #expect(error.message.contains("holds no invite"), "\(error.message)")
            }
        }
    }

    @Test func failedAttemptsAreCappedAndCountedAcrossRestarts() async throws {
        let directory = try temporaryDirectory("join-cap")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = try makeDatabase("a", in: directory)
        let now = SystemWallClock().nowMilliseconds()
        // Failures recorded before this run of the member (persistently, in its database).
        let store = try Store(path: path)
        for _ in 0..<Membership.joinFailuresPerAddress {
            try store.recordJoinFailure(at: now - 1_000, address: "127.0.0.1", reason: "earlier")
        }
        let a = try await startSecured(path)
        defer { Task { await a.stop() } }
        let code = try Membership.invite(store: store, now: now)
        let device = try makeDatabase("device", in: directory)
        do {
            _ = try await join(code, device: device, member: a)
            Issue.record("a join was taken past the cap")
        } catch {
            #expect(error.message.contains("failed join attempts"), "\(error.message)")
        }
    }

    /// `shoal serve` on `path` (loopback, no mDNS), and the address it listens on once it says so.
    private func serve(_ path: String) async throws -> (RunningProcess, String) {
        let node = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", path, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"]
        )
        guard let listening = await node.line(within: 30, { $0.hasPrefix("listening on") }) else {
            node.stop()
            throw ShoalError(code: .timeout, message: "shoal serve on \(path) did not say where it listens")
        }
        return (node, String(listening.dropFirst("listening on ".count)))
    }

    /// A fresh invite code of the member at `path` (`shoal invite`, its last line).
    private func inviteCode(on path: String) throws -> String {
        try #require(try shoal("invite", "--db", path).stdout.split(separator: "\n").last.map(String.init))
    }

    @Test func theCommandLineMakesInvitesAndJoinsAndListsTheRoster() async throws {
        let directory = try temporaryDirectory("join-cli")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db").path
        let b = directory.appendingPathComponent("b.db").path
        #expect(try shoal("init", "--db", a, "--name", "alpha").status == 0)
        #expect(try shoal("init", "--db", b, "--name", "beta").status == 0)
        // The key file is the owner's only.
        var status = stat()
        #expect(stat(KeyFile.path(forDatabase: a), &status) == 0 && status.st_mode & 0o777 == 0o600)
        let id = try shoal("id", "--db", a)
        let nodeA = try #require(NodeID(parsing: id.stdout.split(separator: "\n").last.map(String.init) ?? ""))
        #expect(nodeA == (try KeyFile.load(forDatabase: a)).identity.nodeID)

        let (node, address) = try await serve(a)
        defer { node.stop() }
        // An invite made while the node runs is taken at once.
        let invite = try shoal("invite", "--db", a)
        let code = try #require(invite.stdout.split(separator: "\n").last.map(String.init))
        #expect(code.count == 10)
        // The code from stdin (kept out of the process list), in lower case.
        let joined = try shoal("join", "-", "--db", b, "--peer", address, input: Data(code.lowercased().utf8))
        #expect(joined.status == 0, "\(joined.stderr)")
        let again = try shoal("join", code, "--db", b, "--peer", address)
        #expect(again.status != 0 && again.stderr.contains("already used"), "\(again.stderr)")
        let list = try shoal("trust", "list", "--db", a)
        #expect(list.stdout.contains("alpha") && list.stdout.contains("beta"), "\(list.stdout)")
        let malformed = try shoal("join", "not-a-code!", "--db", b, "--peer", address)
        #expect(malformed.status != 0)
        // Removal from the command line; removing oneself is refused.
        let nodeB = try KeyFile.load(forDatabase: b).identity.nodeID
        #expect(try shoal("trust", "remove", nodeB.description, "--db", a).status == 0)
        #expect(try shoal("trust", "list", "--db", a).stdout.contains("removed"))
        #expect(try shoal("trust", "add", nodeB.description, "--db", a).stderr.contains("removed from the roster"))
        #expect(try shoal("trust", "remove", nodeA.description, "--db", a).status != 0)
    }

    /// A copy of a member's file set up as a new device the way `serve` advises (`init --new-key`, then `join`) writes
    /// under a site of its own: it once kept the member's, and the roster bound one site to two members, who then
    /// counted as one for collection (a delete was collected while the original lacked it) and whose removal fenced
    /// both. A member also refuses to admit a device under a site another member holds.
    @Test func aCopyOfAMembersFileJoinsUnderASiteOfItsOwn() async throws {
        let directory = try temporaryDirectory("join-copy")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = ["a", "b", "c"].map { directory.appendingPathComponent("\($0).db").path }
        let (a, b, c) = (paths[0], paths[1], paths[2])
        #expect(try shoal("init", "--db", a, "--name", "alpha").status == 0)
        #expect(try shoal("init", "--db", b, "--name", "beta").status == 0)
        let (node, address) = try await serve(a)
        defer { node.stop() }
        func invite() throws -> String { try inviteCode(on: a) }
        #expect(try shoal("join", try invite(), "--db", b, "--peer", address).status == 0)
        let siteB = try Store(path: b).identitySiteID
        try FileManager.default.copyItem(atPath: b, toPath: c)
        // Without a key of its own the copy is refused at once; with one, it moves to a site of its own.
        let refused = try shoal("serve", "--db", c, "--no-mdns", "--listen", "127.0.0.1:0")
        #expect(refused.status != 0 && refused.stderr.contains("--new-key"), "\(refused.stderr)")
        let initialised = try shoal("init", "--db", c, "--new-key", "--name", "gamma")
        #expect(initialised.status == 0, "\(initialised.stderr)")
        // Asked again, with the key there now, it refuses in words rather than doing nothing.
        let again = try shoal("init", "--db", c, "--new-key")
        #expect(again.status != 0 && again.stderr.contains("exists"), "\(again.stderr)")
        let printed: String? = initialised.stdout.split(separator: "\n").last.map(String.init)
        let copy = try Store(path: c)
        let (site, identity): (SiteID, SiteID) = (copy.siteID, copy.identitySiteID)
        #expect(printed == site.hex)
        #expect(identity == site && site != siteB)
        #expect(try copy.identityChange()?.reason == .newNodeKey)
        let joined = try shoal("join", try invite(), "--db", c, "--peer", address)
        #expect(joined.status == 0, "\(joined.stderr)")
        let records: [RosterRecord] = try Store(path: a).rosterRecords().compactMap { try? RosterRecord(decoding: $0) }
        let cluster = try KeyFile.load(forDatabase: a).cluster.id
        let sites: [SiteID] = Roster(records: records, clusterID: cluster).members.values.compactMap(\.siteID)
        #expect(sites.count == 3 && Set(sites).count == 3, "\(sites)")
        // A device that names a member's site (a copy joined by a build without the move) is refused in words.
        let stranger = NodeIdentity.generate()
        await #expect(throws: ShoalError.self) {
            _ = try await JoinClient.exchange(
                code: try InviteCode(parsing: try invite()),
                identity: stranger,
                name: "copy",
                siteID: siteB,
                address: try #require(PeerAddress(parsing: address))
            )
        }
    }

    /// A copy of a member's file that kept its key file, served beside the member, is the same node to its peers: they
    /// keep one connection from it and refuse the other as a duplicate, for ever. The refused one now says why, in
    /// its log and its status, instead of reconnecting in silence (checked once with the whole suite running beside,
    /// where the two took turns).
    @Test func aCopyThatKeptItsKeyIsToldAnotherProcessRunsAsThisNode() async throws {
        let directory = try temporaryDirectory("join-copy-key")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = ["a", "b", "b2"].map { directory.appendingPathComponent("\($0).db").path }
        let (a, b, copy) = (paths[0], paths[1], paths[2])
        #expect(try shoal("init", "--db", a, "--name", "alpha").status == 0)
        #expect(try shoal("init", "--db", b, "--name", "beta").status == 0)
        let (node, address) = try await serve(a)
        defer { node.stop() }
        #expect(try shoal("join", try inviteCode(on: a), "--db", b, "--peer", address).status == 0)
        try FileManager.default.copyItem(atPath: b, toPath: copy)
        try FileManager.default.copyItem(atPath: KeyFile.path(forDatabase: b), toPath: KeyFile.path(forDatabase: copy))
        let original = try RunningProcess(
            shoalExecutable(), ["serve", "--db", b, "--no-mdns", "--no-remembered", "--peer", address]
        )
        defer { original.stop() }
        #expect(await original.line(within: 30) { $0.contains("peer connected") } != nil, "\(original.output)")
        let twin = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", copy, "--no-mdns", "--no-remembered", "--peer", address, "--round-interval", "200"]
        )
        defer { twin.stop() }
        // The peer keeps one of the two at a time (each new connection of one evicts the other's): one of them, or
        // both in turn, is told.
        let told = try await waitUntil(within: 60) {
            (original.output + twin.output).contains("another process as this node")
        }
        #expect(told, "original:\n\(original.output)\ncopy:\n\(twin.output)")
    }
}

/// The command line's view of strangers and of discovery.
@Suite(.serialized) struct PendingAndDiscoveryTests {
    @Test func aStrangerIsListedAsPendingInStatusAndTrustPendingAndGetsNothing() async throws {
        let directory = try temporaryDirectory("pending-cli")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db").path
        let stranger = directory.appendingPathComponent("stranger.db").path
        #expect(try shoal("init", "--db", a, "--name", "member").status == 0)
        #expect(try shoal("init", "--db", stranger, "--name", "kiosk").status == 0)
        for db in [a, stranger] {
            #expect(try shoal("sql", "--db", db, "CREATE TABLE kv(k TEXT PRIMARY KEY, v)").status == 0)
            #expect(try shoal("replicate", "--db", db, "kv").status == 0)
        }
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('secret', 1)").status == 0)
        let member = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", a, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"]
        )
        defer { member.stop() }
        let listening = try #require(await member.line(within: 30) { $0.hasPrefix("listening on") })
        let address = String(listening.dropFirst("listening on ".count))
        let kiosk = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", stranger, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0", "--peer", address]
        )
        defer { kiosk.stop() }
        let strangerID = try KeyFile.load(forDatabase: stranger).identity.nodeID
        var pending = ""
        #expect(
            await waitUntil(within: 20) {
                pending = (try? await offPool { try shoal("trust", "pending", "--db", a).stdout }) ?? ""
                return pending.contains(strangerID.description)
            },
            "\(pending)"
        )
        #expect(pending.contains("kiosk") && pending.contains("127.0.0.1"), "\(pending)")
        let status = try shoal("status", "--db", a).stdout
        #expect(status.contains("waiting to be accepted") && status.contains(strangerID.description), "\(status)")
        let json = try shoal("status", "--db", a, "--json").stdout
        #expect(json.contains("\"cluster_id\"") && json.contains("\"pending_devices\""), "\(json)")
        // It got nothing, and its own log says why in words.
        #expect(try shoal("sql", "--db", stranger, "SELECT count(*) FROM kv").stdout.contains("0"))
        #expect(await kiosk.line(within: 20) { $0.contains("roster") } != nil, "\(kiosk.output)")
        // Accepting it puts it on the roster (and off the pending list); a device of another cluster still gets
        // nothing: it does not know this cluster's members (nor its secret), so it refuses them in its turn.
        #expect(try shoal("trust", "add", strangerID.description, "--db", a).status == 0)
        #expect(try shoal("trust", "list", "--db", a).stdout.contains("kiosk"))
        #expect(
            await waitUntil(within: 10) {
                let listed = (try? await offPool { try shoal("trust", "pending", "--db", a).stdout }) ?? ""
                return !listed.contains(strangerID.description)
            }
        )
        #expect(try shoal("sql", "--db", stranger, "SELECT count(*) FROM kv WHERE k = 'secret'").stdout.contains("0"))
        // No secret in any log.
        let secret = try KeyFile.load(forDatabase: a).cluster.secret.map { String(format: "%02x", $0) }.joined()
        #expect(!member.output.contains(secret) && !kiosk.output.contains(secret))
    }

    @Test func joinFindsTheMemberByMDNS() async throws {
        let directory = try temporaryDirectory("join-mdns")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db").path
        let b = directory.appendingPathComponent("b.db").path
        #expect(try shoal("init", "--db", a, "--name", "announcer").status == 0)
        #expect(try shoal("init", "--db", b, "--name", "newcomer").status == 0)
        let member = try RunningProcess(
            shoalExecutable(),
            ["serve", "--db", a, "--no-remembered", "--listen", "127.0.0.1:0"]
        )
        defer { member.stop() }
        #expect(await member.line(within: 30) { $0.contains("mDNS discovery is on") } != nil, "\(member.output)")
        let code = try #require(try shoal("invite", "--db", a).stdout.split(separator: "\n").last.map(String.init))
        // No address: the member is found by mDNS on the loopback interface (other nodes found there that do not
        // hold the invite are tried and passed over).
        let joined = try await offPool { try shoal("join", code, "--db", b, "--mdns-interface", "lo", "--browse-seconds", "3") }
        #expect(joined.status == 0, "\(joined.stderr)\n\(member.output)")
        #expect(try KeyFile.load(forDatabase: b).cluster == KeyFile.load(forDatabase: a).cluster)
    }
}
