import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// `shoal watch` beside a running `shoal serve` on the same file: the query's result now, then after every change to
/// what it reads, whoever made it (the sqlite3 shell, `shoal sql`, a peer), as JSON lines.
@Suite struct WatchCommandTests {
    private static func keys(_ line: String) -> [String]? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
            let rows = object["rows"] as? [[String: Any]]
        else { return nil }
        return rows.compactMap { $0["k"] as? String }
    }

    @Test func watchPrintsTheResultAfterEveryChangeBesideARunningServe() async throws {
        let directory = try temporaryDirectory("watch")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b"], in: directory)
        let (a, b) = (paths[0], paths[1])
        let nodeA = try RunningProcess(try shoalExecutable(), ["serve", "--db", a, "--no-mdns", "--no-remembered"])
        defer { nodeA.stop() }
        let listening = try #require(await nodeA.line(within: 30) { $0.hasPrefix("listening on") })
        let nodeB = try RunningProcess(
            try shoalExecutable(),
            ["serve", "--db", b, "--no-mdns", "--no-remembered", "--peer", String(listening.dropFirst("listening on ".count))]
        )
        defer { nodeB.stop() }
        #expect(await nodeB.line(within: 30) { $0.contains("peer connected") } != nil, "\(nodeB.output)")
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
        // Interrupted, it ends cleanly.
        watch.process.interrupt()
        watch.process.waitUntilExit()
        #expect(watch.process.terminationStatus == 0, "\(watch.output)")
        let results = watch.output.split(separator: "\n").compactMap { Self.keys(String($0)) }
        #expect(zip(results, results.dropFirst()).allSatisfy { $0 != $1 }, "never the same result twice: \(results)")
    }
}
