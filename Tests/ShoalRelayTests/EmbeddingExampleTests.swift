import Foundation
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
}
