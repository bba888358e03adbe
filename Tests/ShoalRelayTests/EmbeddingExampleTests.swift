import Foundation
import ServiceLifecycle
import Shoal
import ShoalTestSupport
import Testing

/// The README's embedding example, as an app would run it: it syncs through a relay with a `shoal serve` node it never
/// meets, and stops on SIGTERM with exit status 0.
@Suite(.serialized) struct EmbeddingExampleTests {
    /// The example program the README shows (Tools/EmbeddingExample), built beside `shoal`.
    private static func example() throws -> URL {
        let url = try shoalExecutable().deletingLastPathComponent().appendingPathComponent("EmbeddingExample")
        guard FileManager.default.isExecutableFile(atPath: url.path) else {
            throw TestSetupError("the EmbeddingExample executable was not built (run swift build --build-tests)")
        }
        return url
    }

    /// The repository's root (this file is Tests/ShoalRelayTests/EmbeddingExampleTests.swift).
    private static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func theReadmeShowsTheExampleProgramLineForLine() throws {
        let source = try String(contentsOf: Self.root.appendingPathComponent("Tools/EmbeddingExample/main.swift"), encoding: .utf8)
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let lines = source.components(separatedBy: "\n")
        guard let begin = lines.firstIndex(of: "// README-EXAMPLE-BEGIN"), let end = lines.firstIndex(of: "// README-EXAMPLE-END")
        else {
            Issue.record("the example's markers are missing")
            return
        }
        let example = lines[(begin + 1)..<end].joined(separator: "\n")
        #expect(readme.contains("```swift\n\(example)\n```"), "README.md does not show Tools/EmbeddingExample/main.swift")
        #expect(lines[(begin + 1)..<end].filter { !$0.hasPrefix("import ") && !$0.isEmpty }.count <= 10)
    }

    @Test func theExampleSyncsThroughARelayAndExitsWithStatusZeroOnSIGTERM() async throws {
        let world = try await RelayWorld("embedding-example", nodes: ["app", "b"])
        defer { world.tearDown() }
        try await world.serve("b")
        var environment = ProcessInfo.processInfo.environment
        environment["APP_DB"] = world.paths["app"]!
        environment["APP_RELAY"] = world.relayURL
        environment["APP_RELAY_TOKEN"] = world.token
        let app = try RunningProcess(try Self.example(), [], environment: environment)
        defer { app.stop() }
        #expect(await app.line(within: 60) { $0.contains("listening") } != nil, "\(app.output)")
        // The app's own writes (another SQLite client on its file) reach b, and b's reach the app.
        try await world.write("app", "INSERT INTO kv VALUES ('from the app', 1)")
        try await world.write("b", "INSERT INTO kv VALUES ('from b', 2)")
        #expect(try await world.converge(["app", "b"]), "\(app.output)")
        let rows = try await offPool { try sqlite3Shell(world.paths["app"]!, "SELECT k, v FROM kv ORDER BY k") }.stdout
        #expect(rows == "from b|2\nfrom the app|1\n")
        app.stop()
        #expect(app.process.terminationReason == .exit && app.process.terminationStatus == 0, "\(app.output)")
        #expect(!app.output.contains("Fatal error"), "\(app.output)")
    }

    /// The node an app holds, in process: a live query and the change feed see what a node it never meets wrote,
    /// through the relay; the app's writes through the node reach that node; a peer acknowledges them.
    @Test func anObserverAndTheFeedOfAShoalNodeSeeWritesThatCameThroughTheRelay() async throws {
        let world = try await RelayWorld("shoal-node-relay", nodes: ["app", "b"])
        defer { world.tearDown() }
        try await world.serve("b")
        var options = ShoalNodeOptions(database: world.paths["app"]!)
        options.mdns = false
        options.rememberPeers = false
        options.relay = .init(url: world.relayURL, token: world.token)
        let node = try await ShoalNode(options: options)
        #expect(!node.madeKey)
        let events = EventLog<NodeEvent>()
        let listening = Task { for await event in node.events { await events.append(event) } }
        defer { listening.cancel() }
        let running = Task { try await node.run() }
        defer { running.cancel() }
        let results = EventLog<[[SQLValue]]>()
        let observing = Task { for try await result in node.observe("SELECT k FROM kv ORDER BY k") { await results.append(result.rows) } }
        defer { observing.cancel() }
        #expect(await results.seen(within: 30) { $0.isEmpty })
        let feed = Task {
            for try await set in node.changes(in: ["kv"]) where !set.isLocal { return set.rows.first?.primaryKey }
            return nil
        }
        try await world.write("b", "INSERT INTO kv VALUES ('from b', 1)")
        #expect(await results.seen(within: 60) { $0 == [[.text("from b")]] })
        #expect(try await feed.value == [.text("from b")])
        // The relay is reported among the node's events like a peer: reached, and changes applied from it.
        #expect(await events.seen(within: 30) { $0 == .relay(.reachable) })
        #expect(await events.seen(within: 30) { if case .relay(.applied) = $0 { true } else { false } })
        // Written through the node: b gets it through the relay, and the relay acknowledges it.
        try await node.node.execute("INSERT INTO kv VALUES ('from the app', 2)")
        #expect(try await node.node.waitUntilAcknowledged(by: .relay, timeoutMilliseconds: 60_000))
        #expect(try await world.converge(["app", "b"]))
    }
}
