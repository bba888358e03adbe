import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

/// Honest health: the relay says when its storage is down and answers at once meanwhile, and a long-poll whose token
/// was revoked while it waited gets nothing more.
extension RelayProcessTests {
    private func request(
        _ client: HTTPClient,
        _ url: String,
        method: HTTPMethod = .GET,
        token: String? = nil,
        body: [UInt8]? = nil,
        timeout: TimeAmount = .seconds(10)
    ) async throws -> (status: Int, body: String) {
        var request = HTTPClientRequest(url: url)
        request.method = method
        if let token { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let response = try await client.execute(request, timeout: timeout)
        let bytes = try await response.body.collect(upTo: 1 << 20)
        return (Int(response.status.code), String(buffer: bytes))
    }

    @Test func whileItsPostgreSQLRefusesConnectionsTheRelayAnswers503AtOnceAndSaysWhy() async throws {
        let world = try await RelayWorld("relay-pgdown", nodes: ["a"], postgres: true)
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        try await world.serve("a")
        try await world.write("a", "INSERT INTO kv VALUES ('before', 1)")
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        #expect(try await request(client, world.relayURL + RelayAPI.healthPath).body.contains("\"storage\":\"ok\""))
        // The relay's database takes no connections, and those it had are cut.
        let url = try #require(world.postgres)
        let database = try #require(URL(string: url)?.lastPathComponent)
        let server = try TestPostgres.serverURL()
        _ = try await offPool {
            try TestPostgres.query(server, "ALTER DATABASE \(database) ALLOW_CONNECTIONS false")
        }
        _ = try await offPool {
            try TestPostgres.query(server, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '\(database)'")
        }
        #expect(try await waitUntil(within: 30) {
            let health = try await request(client, world.relayURL + RelayAPI.healthPath)
            return health.status == 503 && health.body.contains("\"storage\":\"down\"")
        })
        // Requests are refused at once with the cause, not left waiting for the database (the client gives up after
        // 10 s, which a waiting request would not beat).
        let heads = try await request(client, world.relayURL + RelayAPI.headsPath, token: world.token)
        #expect(heads.status == 503 && heads.body.contains("storage_unavailable"), "\(heads)")
        #expect(try await waitUntil(within: 60) { (try await world.relayStatus("a"))["problem"] as? String == "storage-down" })
        let path = world.paths["a"]!
        let line = try await offPool { try shoal("status", "--db", path) }.stdout
        #expect(line.contains("its storage is down"), "\(line)")
        // Back: the node goes on as before.
        _ = try await offPool { try TestPostgres.query(server, "ALTER DATABASE \(database) ALLOW_CONNECTIONS true") }
        try await world.write("a", "INSERT INTO kv VALUES ('after', 2)")
        #expect(try await waitUntil(within: 60) {
            let relay = try await world.relayStatus("a")
            return relay["lacking"] as? Int == 0 && relay["problem"] == nil
        })
        #expect(try await request(client, world.relayURL + RelayAPI.healthPath).status == 200)
    }

    @Test func aLongPollWhoseTokenIsRevokedWhileItWaitsGetsNothingMore() async throws {
        let world = try await RelayWorld("relay-revoked-wait", nodes: ["a"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let data = world.relayData
        let cluster = world.clusterID
        let made = try await offPool { try shoal("relay", "token", "create", "--data", data, "--cluster", cluster) }
        let other = try #require(made.stdout.split(separator: "\n").last.map(String.init))
        try await world.serve("a")
        try await world.write("a", "INSERT INTO kv VALUES ('before', 1)")
        #expect(try await waitUntil(within: 30) { (try await world.relayStatus("a"))["lacking"] as? Int == 0 })
        // A pull with the other token, from the relay's heads: nothing to send, so it waits.
        let heads = try await request(client, world.relayURL + RelayAPI.headsPath, token: other)
        let vector = try #require(
            (try JSONSerialization.jsonObject(with: Data(heads.body.utf8)) as? [String: Any])?["heads"] as? [String: Any]
        )
        let pull = try JSONSerialization.data(withJSONObject: ["vector": vector, "waitMilliseconds": 20_000])
        let url = world.relayURL + RelayAPI.pullPath
        let waiting = Task { try await self.request(client, url, method: .POST, token: other, body: Array(pull), timeout: .seconds(60)) }
        // Revoked while it waits; then new data arrives and wakes it.
        let revoked = try await offPool { try shoal("relay", "token", "revoke", "--data", data, other) }
        #expect(revoked.status == 0, "\(revoked.stderr)")
        try await world.write("a", "INSERT INTO kv VALUES ('after the revocation', 2)")
        let answer = try await waiting.value
        #expect(answer.status == 401, "\(answer.status) \(answer.body.prefix(200))")
    }
}
