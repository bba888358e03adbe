import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// `shoal watch` beside a running `shoal serve` on the same file: the query's result now, then after every change to
/// what it reads, whoever made it (the sqlite3 shell, `shoal sql`, a peer), as JSON lines.
@Suite struct WatchCommandTests {
    /// Databases a and b of one cluster in `directory`, each served by `shoal serve`, b dialling a, connected.
    private static func twoServes(in directory: URL) async throws -> (String, String, [RunningProcess]) {
        let paths = try makeCluster(["a", "b"], in: directory)
        let nodeA = try RunningProcess(try shoalExecutable(), ["serve", "--db", paths[0], "--no-mdns", "--no-remembered"])
        guard let listening = await nodeA.line(within: 30, { $0.hasPrefix("listening on") }) else {
            nodeA.stop()
            throw TestSetupError("a did not start: \(nodeA.output)")
        }
        let nodeB = try RunningProcess(
            try shoalExecutable(),
            ["serve", "--db", paths[1], "--no-mdns", "--no-remembered", "--peer", String(listening.dropFirst("listening on ".count))]
        )
        guard await nodeB.line(within: 30, { $0.contains("peer connected") }) != nil else {
            nodeA.stop()
            nodeB.stop()
            throw TestSetupError("b did not connect: \(nodeB.output)")
        }
        return (paths[0], paths[1], [nodeA, nodeB])
    }

    private static func keys(_ line: String) -> [String]? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            let rows = object["rows"] as? [[String: Any]]
        else { return nil }
        return rows.compactMap { $0["k"] as? String }
    }

    @Test func watchPrintsTheResultAfterEveryChangeBesideARunningServe() async throws {
        let directory = try temporaryDirectory("watch")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (a, b, nodes) = try await Self.twoServes(in: directory)
        defer { for node in nodes { node.stop() } }
        let watch = try RunningProcess(try shoalExecutable(), ["watch", "--db", a, "--json", "SELECT k FROM kv ORDER BY k"])
        defer { watch.stop() }
        #expect(await watch.line(within: 30) { Self.keys($0) == [] } != nil, "\(watch.output)")
        #expect(try sqlite3Shell(a, "INSERT INTO kv VALUES ('shell', 1)").status == 0)
        #expect(await watch.line(within: 30) { Self.keys($0) == ["shell"] } != nil, "\(watch.output)")
        #expect(try shoal("sql", "--db", a, "INSERT INTO kv VALUES ('sql', 2)").status == 0)
        #expect(await watch.line(within: 30) { Self.keys($0) == ["shell", "sql"] } != nil, "\(watch.output)")
        // Written on b, applied on a by its serve: the watch on a's file sees it.
        #expect(try sqlite3Shell(b, "INSERT INTO kv VALUES ('peer', 3)").status == 0)
        #expect(await watch.line(within: 30) { Self.keys($0) == ["peer", "shell", "sql"] } != nil, "\(watch.output)")
        // Status says, per peer, how many of this node's transactions it lacks: b acknowledges a's writes.
        let acknowledged = try await waitUntil(within: 30) {
            try shoal("status", "--db", a).stdout.contains("lacks 0 of this node's transactions")
        }
        let statusText = try shoal("status", "--db", a).stdout
        #expect(acknowledged, "\(statusText)")
        // Interrupted, it ends cleanly.
        watch.process.interrupt()
        watch.process.waitUntilExit()
        #expect(watch.process.terminationStatus == 0, "\(watch.output)")
        let results = watch.output.split(separator: "\n").compactMap { Self.keys(String($0)) }
        #expect(zip(results, results.dropFirst()).allSatisfy { $0 != $1 }, "never the same result twice: \(results)")
    }

    private static func feedLine(_ line: String) -> [String: Any]? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], object["dot"] != nil
        else { return nil }
        return object
    }

    private static func feedKeys(_ output: String) -> [String] {
        output.split(separator: "\n").compactMap { feedLine(String($0)) }.flatMap { line in
            (line["rows"] as? [[String: Any]] ?? []).compactMap { ($0["key"] as? [Any])?.first as? String }
        }
    }

    @Test func feedPrintsEveryChangeSetBesideARunningServeAndResumesAfterItsCursor() async throws {
        let directory = try temporaryDirectory("feed-cli")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (a, b, nodes) = try await Self.twoServes(in: directory)
        defer { for node in nodes { node.stop() } }
        #expect(try sqlite3Shell(a, "INSERT INTO kv VALUES ('first', 1)").status == 0)
        let feed = try RunningProcess(try shoalExecutable(), ["feed", "--db", a, "--tables", "kv"])
        defer { feed.stop() }
        let first = try #require(await feed.line(within: 30) { $0.contains("\"first\"") }, "\(feed.output)")
        let cursor = try #require(Self.feedLine(first)?["cursor"] as? String)
        #expect(Self.feedLine(first)?["local"] as? Bool == true)
        // A peer's write, applied by a's serve, comes next, marked as not local.
        #expect(try sqlite3Shell(b, "INSERT INTO kv VALUES ('from b', 2)").status == 0)
        let fromB = try #require(await feed.line(within: 30) { $0.contains("\"from b\"") }, "\(feed.output)")
        #expect(Self.feedLine(fromB)?["local"] as? Bool == false)
        feed.process.interrupt()
        feed.process.waitUntilExit()
        #expect(feed.process.terminationStatus == 0, "\(feed.output)")
        // Resumed after the first line's cursor: the rest, and what was written meanwhile, not the first again.
        #expect(try sqlite3Shell(a, "INSERT INTO kv VALUES ('later', 3)").status == 0)
        let resumed = try RunningProcess(try shoalExecutable(), ["feed", "--db", a, "--after", cursor])
        defer { resumed.stop() }
        #expect(await resumed.line(within: 30) { $0.contains("\"later\"") } != nil, "\(resumed.output)")
        #expect(await resumed.line(within: 30) { $0.contains("\"from b\"") } != nil, "\(resumed.output)")
        resumed.stop()
        #expect(!Self.feedKeys(resumed.output).contains("first"), "\(resumed.output)")
        // A cursor that is not one is refused in words.
        let bad = try shoal("feed", "--db", a, "--after", "nonsense")
        #expect(bad.status != 0 && bad.stderr.contains("--after wants a feed cursor"))
    }
}
