import AsyncHTTPClient
import Foundation
import NIOCore
@testable import ShoalRelay
import ShoalRelayProtocol
import Testing

/// The relay's API description against the relay: the routes it names, and the keys of its JSON bodies.
extension RelayProcessTests {
    @Test func theAPIDescriptionIsServedWithoutATokenAndNamesEveryRouteTheRelayAnswers() async throws {
        let world = try await RelayWorld("relay-openapi", nodes: ["a"])
        defer { world.tearDown() }
        let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup)
        defer { _ = client.shutdown() }
        let response = try await client.execute(HTTPClientRequest(url: "\(world.relayURL)/openapi.json"), timeout: .seconds(30))
        let body = Array(try await response.body.collect(upTo: 1 << 20).readableBytesView)
        #expect(response.status.code == 200)
        #expect(response.headers["content-type"].first == "application/json")
        let document = try #require(try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any])
        #expect((document["openapi"] as? String)?.hasPrefix("3.") == true)
        let paths = try #require(document["paths"] as? [String: [String: Any]])
        let methods: Set = ["get", "put", "post", "delete", "options", "head", "patch", "trace"]
        let documented = Set(
            paths.flatMap { path, item in item.keys.filter(methods.contains).map { "\($0.uppercased()) \(path)" } }
        )

        // Exactly the router's routes: a route added without its description fails here.
        let storage = try SQLiteRelayStorage(directory: world.directory.appendingPathComponent("routes").path)
        let server = RelayServer(
            configuration: RelayServerConfiguration(host: "127.0.0.1", port: 0, logger: .init(label: "shoal.relay.test")),
            storage: storage
        )
        let routes = Set(server.routes)
        #expect(routes.subtracting(documented).isEmpty, "not described: \(routes.subtracting(documented).sorted())")
        #expect(documented.subtracting(routes).isEmpty, "described, not routed: \(documented.subtracting(routes).sorted())")

        // And the running relay answers each one (a refusal of the empty request, not 404), and nothing else.
        for operation in documented.sorted() {
            let parts = operation.split(separator: " ")
            var request = HTTPClientRequest(url: "\(world.relayURL)\(parts[1])")
            request.method = .init(rawValue: String(parts[0]))
            request.headers.add(name: "Authorization", value: "Bearer \(world.token)")
            if parts[0] == "POST" { request.body = .bytes(ByteBuffer(string: "{}")) }
            let answer = try await client.execute(request, timeout: .seconds(30))
            _ = try await answer.body.collect(upTo: 1 << 20)
            #expect(answer.status.code != 404, "\(operation) answered 404")
        }
        let unknown = try await client.execute(HTTPClientRequest(url: "\(world.relayURL)/v1/nothing"), timeout: .seconds(30))
        #expect(unknown.status.code == 404)
    }
}

/// The JSON bodies the relay's API description names have the keys their Codable types write: the required ones when
/// every optional is left out, all of them when none is.
@Suite struct RelayOpenAPITests {
    private let schemas: [String: [String: Any]]

    init() throws {
        let document = try JSONSerialization.jsonObject(with: Data(RelayOpenAPI.document.utf8)) as? [String: Any]
        let components = try #require(document?["components"] as? [String: Any])
        schemas = try #require(components["schemas"] as? [String: [String: Any]])
    }

    private func keys(_ value: some Encodable) throws -> Set<String> {
        let object = try JSONSerialization.jsonObject(with: try JSONEncoder().encode(value)) as? [String: Any]
        return Set(try #require(object).keys)
    }

    private func expect(
        _ schema: String,
        least: some Encodable,
        most: some Encodable,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let described = try #require(schemas[schema], "no schema \(schema)", sourceLocation: sourceLocation)
        let required = Set(described["required"] as? [String] ?? [])
        let properties = Set((described["properties"] as? [String: Any] ?? [:]).keys)
        #expect(try keys(least) == required, "\(schema): required keys", sourceLocation: sourceLocation)
        #expect(try keys(most) == properties, "\(schema): all keys", sourceLocation: sourceLocation)
    }

    @Test func everyJSONBodyHasTheKeysItsTypeWrites() throws {
        let site = String(repeating: "ab", count: 16)
        let grant = RelayGrant(epoch: 1, recipient: "node", body: "Zm9v")
        let resume = RelayPullRequest.Resume(site: site, from: 1, index: 2)
        let snapshot = RelaySnapshotInfo(id: "1", vector: [site: 1], bytes: 1, createdMs: 1)
        try expect(
            "RelayHeads",
            least: RelayHeads(heads: [site: 1]),
            most: RelayHeads(heads: [:], cluster: "c", snapshot: snapshot, uncoveredBytes: 1)
        )
        try expect("RelaySnapshotInfo", least: snapshot, most: snapshot)
        let completion = RelaySnapshotCompletion(vector: [site: 1])
        try expect("RelaySnapshotCompletion", least: completion, most: completion)
        try expect(
            "RelayUploadResult",
            least: RelayUploadResult(stored: 1, alreadyHeld: 0, gaps: 0, heads: [:]),
            most: RelayUploadResult(stored: 1, alreadyHeld: 0, gaps: 0, heads: [:])
        )
        try expect(
            "RelayPullRequest",
            least: RelayPullRequest(vector: [:]),
            most: RelayPullRequest(
                vector: [:], resume: [resume], waitMilliseconds: 1, maximumBytes: 1, snapshotSites: [site]
            )
        )
        try expect("RelayPullResume", least: resume, most: resume)
        try expect("RelayGrant", least: grant, most: grant)
        try expect("RelayGrants", least: RelayGrants(grants: [grant]), most: RelayGrants(grants: [], epoch: 1))
        try expect(
            "RelayRotation",
            least: RelayRotation(epoch: 1, tokenHash: "", grants: []),
            most: RelayRotation(epoch: 1, tokenHash: "", grants: [], uploadKey: "")
        )
        let key = RelayUploadKey(epoch: 0, key: "")
        try expect("RelayUploadKey", least: key, most: key)
        var refusal = RelayErrorBody(error: "rate_limited", message: "m", limit: 1, retryAfterSeconds: 1)
        refusal.epoch = 1
        try expect("RelayErrorBody", least: RelayErrorBody(error: "malformed", message: "m"), most: refusal)
    }
}
