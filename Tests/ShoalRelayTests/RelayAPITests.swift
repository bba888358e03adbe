import AsyncHTTPClient
import Foundation
import NIOCore
import ShoalCore
import ShoalProtocol
import ShoalRelayClient
import ShoalRelayProtocol
import ShoalSecurity
import ShoalStore
import ShoalTestSupport
import Testing

/// The relay's HTTP API against a real relay process: what it stores, what it refuses, and how.
extension RelayProcessTests {
    private func post(
        _ client: HTTPClient,
        _ world: RelayWorld,
        _ path: String,
        _ body: [UInt8],
        token: String? = nil,
        headers extra: [String: String] = [:]
    ) async throws -> (status: Int, headers: [String: String], body: [UInt8]) {
        var request = HTTPClientRequest(url: "\(world.relayURL)\(path)")
        request.method = .POST
        request.headers.add(name: "Authorization", value: "Bearer \(token ?? world.token)")
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        request.body = .bytes(ByteBuffer(bytes: body))
        let response = try await client.execute(request, timeout: .seconds(30))
        let bytes = Array(try await response.body.collect(upTo: 64 << 20).readableBytesView)
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name.lowercased()] = header.value }
        return (Int(response.status.code), headers, bytes)
    }

    /// Uploads `envelopes` authenticated with `uploader`'s upload key of epoch 0 (registered first; the relay keeps
    /// the first key registered), as a member's node does.
    private func upload(
        _ client: HTTPClient,
        _ world: RelayWorld,
        _ body: [UInt8],
        authenticatedBy uploader: RelaySeal
    ) async throws -> (status: Int, headers: [String: String], body: [UInt8]) {
        let key = RelayUploadKey(epoch: 0, key: Data(uploader.uploadKey(0)!).base64EncodedString())
        _ = try await post(client, world, "/v1/keys", Array(try JSONEncoder().encode(key)))
        return try await post(
            client, world, "/v1/changesets", body,
            headers: ["Shoal-Upload-Epoch": "0", "Shoal-Upload-Auth": uploader.authenticate(body, epoch: 0)!]
        )
    }

    /// The seal of the world's cluster (its secret, from a's key file).
    private func clusterSeal(_ world: RelayWorld) throws -> RelaySeal {
        RelaySeal(clusterSecret: try KeyFile.load(forDatabase: world.paths["a"]!).cluster.secret)
    }

    private func json(_ bytes: [UInt8]) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(bytes))) as? [String: Any] ?? [:]
    }

    private func envelope(
        cluster: String,
        site: SiteID,
        from: UInt64,
        to: UInt64,
        seal: RelaySeal,
        changes: [Change] = []
    ) throws -> RelayEnvelope {
        let plaintext = RelaySealedBatch.encoded(
            ChangeBatch(changes: changes, claim: VersionVector([site: to])), compressing: false
        ).payload
        return try seal.seal(
            plaintext,
            into: RelayEnvelope(
                cluster: cluster, epoch: 0, site: site, from: from, to: to, upload: 7, index: 0,
                flags: [.batchEnd, .rangeEnd], sealed: []
            )
        )
    }

    @Test func uploadsAreIdempotentAndBadOnesAreRefusedWithNothingStored() async throws {
        let world = try await RelayWorld("relay-api", nodes: ["a"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let seal = try clusterSeal(world)
        let site = SiteID.random()
        let first = try envelope(cluster: world.clusterID, site: site, from: 0, to: 3, seal: seal)
        let body = RelayEnvelopeList.encode([first])

        // Not authenticated, or with a key that is not the cluster's: 403, nothing stored.
        let bare = try await post(client, world, "/v1/changesets", body)
        #expect(bare.status == 403)
        let outsider = RelaySeal(clusterSecret: Array(repeating: 9, count: 32))
        let strangers = try await post(
            client, world, "/v1/changesets", body,
            headers: ["Shoal-Upload-Epoch": "0", "Shoal-Upload-Auth": outsider.authenticate(body, epoch: 0)!]
        )
        #expect(strangers.status == 403)
        #expect(json(strangers.body)["error"] as? String == "no_upload_key")
        let stored = try await upload(client, world, body, authenticatedBy: seal)
        #expect(stored.status == 200)
        #expect(json(stored.body)["stored"] as? Int == 1)
        // A stranger's key registered now is refused (the first one stays), and its uploads with it.
        let forgedKey = try await upload(client, world, body, authenticatedBy: outsider)
        #expect(forgedKey.status == 403)
        #expect(json(forgedKey.body)["error"] as? String == "bad_upload_auth")
        // The same upload again: held already, nothing stored twice.
        let again = try await upload(client, world, body, authenticatedBy: seal)
        #expect(again.status == 200)
        #expect(json(again.body)["stored"] as? Int == 0)
        #expect(json(again.body)["alreadyHeld"] as? Int == 1)
        // A range that does not start at the relay's head is a gap: refused, the heads say where to start.
        let gap = try envelope(cluster: world.clusterID, site: site, from: 5, to: 6, seal: seal)
        let gapped = try await upload(client, world, RelayEnvelopeList.encode([gap]), authenticatedBy: seal)
        #expect(json(gapped.body)["gaps"] as? Int == 1)
        #expect((json(gapped.body)["heads"] as? [String: Int])?[site.hex] == 3)

        let before = try await world.relayQuery("SELECT count(*) FROM chunks; SELECT count(*) FROM ranges")
        // Another cluster's change set with this cluster's token: 403, nothing of the request stored.
        let next = try envelope(cluster: world.clusterID, site: site, from: 3, to: 4, seal: seal)
        let foreign = try envelope(cluster: "another-cluster", site: site, from: 0, to: 1, seal: seal)
        let wrong = try await upload(client, world, RelayEnvelopeList.encode([next, foreign]), authenticatedBy: seal)
        #expect(wrong.status == 403)
        #expect(json(wrong.body)["error"] as? String == "wrong_cluster")
        // Truncated: 400.
        let whole = RelayEnvelopeList.encode([next])
        let truncated = try await post(client, world, "/v1/changesets", Array(whole.dropLast(5)))
        #expect(truncated.status == 400)
        #expect(json(truncated.body)["error"] as? String == "malformed")
        // Every answer, refusals included, names the relay process (a node that meets a new one reads its heads again).
        let field = RelayAPI.bootHeader.lowercased()
        let boot = try #require(stored.headers[field])
        #expect(boot.count == 16 && [bare, strangers, truncated].allSatisfy { $0.headers[field] == boot })
        // Garbage: 400.
        let garbage = try await post(client, world, "/v1/changesets", Array("not a change set at all".utf8))
        #expect(garbage.status == 400)
        // An unknown token: 401.
        let stranger = try await post(client, world, "/v1/changesets", whole, token: "shoal-relay-nope")
        #expect(stranger.status == 401)
        #expect(try await world.relayQuery("SELECT count(*) FROM chunks; SELECT count(*) FROM ranges") == before)
        // A pull with a malformed vector: 400.
        let badPull = try await post(client, world, "/v1/pull", Array(#"{"vector": {"zz": 1}}"#.utf8))
        #expect(badPull.status == 400)
        // A pull from nothing gets the one range, which opens with the cluster's key.
        let pull = try await post(client, world, "/v1/pull", Array(#"{"vector": {}}"#.utf8))
        #expect(pull.status == 200)
        let page = try RelayEnvelopeList.decode(pull.body, maximumEnvelopeBytes: 1 << 20)
        #expect(page == [first])
        #expect(throws: Never.self) { try seal.open(page[0]) }
        #expect(pull.headers["shoal-more"] == "0")
    }

    @Test func limitsAnswer413And429WithTheLimitAndRetryAfter() async throws {
        let world = try await RelayWorld("relay-limits", nodes: ["a"])
        defer { world.tearDown() }
        try await world.stopRelay()
        try await world.startRelay(extra: ["--max-changeset-bytes", "100000", "--max-request-bytes", "300000", "--rate-limit", "5"])
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let seal = RelaySeal(clusterSecret: Array(repeating: 9, count: 32))
        let site = SiteID.random()
        var big = try envelope(cluster: world.clusterID, site: site, from: 0, to: 1, seal: seal)
        big.sealed = Array(repeating: 1, count: 150_000)
        let tooBig = try await post(client, world, "/v1/changesets", RelayEnvelopeList.encode([big]))
        #expect(tooBig.status == 413)
        #expect(json(tooBig.body)["limit"] as? Int == 100_000)
        let huge = try await post(client, world, "/v1/changesets", Array(repeating: 0, count: 400_000))
        #expect(huge.status == 413)
        #expect(json(huge.body)["limit"] as? Int == 300_000)
        // 5 a second, bursts of 10: of 40 requests at once, some are refused, with when to come back.
        let answers = try await withThrowingTaskGroup(of: (status: Int, headers: [String: String], body: [UInt8]).self) { group in
            for _ in 0..<40 {
                group.addTask { try await self.post(client, world, "/v1/pull", Array(#"{"vector": {}}"#.utf8)) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let refused = answers.first { $0.status == 429 }
        let limited = try #require(refused)
        #expect(json(limited.body)["limit"] as? Int == 5)
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
    }

    @Test func aChangeSetThatFailsItsSealIsRefusedAndHoldsUpNoOtherSite() async throws {
        let world = try await RelayWorld("relay-forged", nodes: ["a", "b"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        // A token holder without the cluster secret uploads a change set sealed with another key, for a site that
        // sorts first.
        let forger = RelaySeal(clusterSecret: Array(repeating: 1, count: 32))
        let site = SiteID(high: 0, low: 0)
        let change = Change(
            table: "kv",
            primaryKey: [.text("forged")],
            payload: .column("v", .text("forged value")),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(milliseconds: SystemWallClock().nowMilliseconds(), logical: 0), site: site, seq: 1)
        )
        let forged = try envelope(cluster: world.clusterID, site: site, from: 0, to: 1, seal: forger, changes: [change])
        // Authenticated with the cluster's upload key (a member's buggy upload, or a chunk corrupted on the relay's
        // disk): the relay stores it, and nodes find it fails its seal.
        let stored = try await upload(client, world, RelayEnvelopeList.encode([forged]), authenticatedBy: try clusterSeal(world))
        #expect(stored.status == 200)
        try await world.serve("a")
        try await world.serve("b")
        #expect(try await waitUntil(within: 30) {
            ((try await world.relayStatus("a"))["lastError"] as? String)?.contains("fails its seal") == true
        })
        // The other sites go on syncing through the relay.
        try await world.write("a", "INSERT INTO kv VALUES ('after the forgery', 1)")
        try await world.write("b", "INSERT INTO kv VALUES ('b after the forgery', 2)")
        #expect(try await world.converge(["a", "b"]))
        for name in ["a", "b"] {
            let path = world.paths[name]!
            let rows = try await offPool { try sqlite3Shell(path, "SELECT count(*) FROM kv WHERE k = 'forged'") }
            #expect(rows.stdout == "0\n")
        }
    }

    @Test func aForgedRangeClaimingANodesOwnTransactionsIsReported() async throws {
        let world = try await RelayWorld("relay-hijack", nodes: ["a"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let path = world.paths["a"]!
        let site = try await offPool { try Store(path: path).siteID }
        let forger = RelaySeal(clusterSecret: Array(repeating: 1, count: 32))
        let forged = try envelope(cluster: world.clusterID, site: site, from: 0, to: 1 << 40, seal: forger)
        let stored = try await upload(client, world, RelayEnvelopeList.encode([forged]), authenticatedBy: try clusterSeal(world))
        #expect(stored.status == 200)
        let node = try await world.serve("a")
        #expect(await node.line(within: 30) { $0.contains("of this node's own site") } != nil)
        #expect(try await waitUntil(within: 10) { (try await world.relayStatus("a"))["lacking"] as? Int ?? 0 > 0 })
    }
}
