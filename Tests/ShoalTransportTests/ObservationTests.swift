import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

/// Live queries over real nodes: the current result at once, then one per commit that touches what the query reads,
/// whoever made it (the node's own connection, the `sqlite3` shell, a LAN peer), never the same result twice.
@Suite struct ObservationTests {
    /// Collects what `stream` yields, for the test to wait on; the task ends with the stream.
    private static func collect(_ stream: AsyncThrowingStream<QueryResult, any Error>) -> (EventLog<QueryResult>, Task<Void, any Error>) {
        let log = EventLog<QueryResult>()
        let task = Task { for try await result in stream { await log.append(result) } }
        return (log, task)
    }

    private static func keys(_ result: QueryResult?) -> [String] {
        result?.rows.compactMap { if case .text(let k) = $0.first { k } else { nil } } ?? []
    }

    @Test func anObserverSeesLocalShellAndPeerWritesAndNothingElse() async throws {
        let directory = try temporaryDirectory("observe")
        defer { try? FileManager.default.removeItem(at: directory) }
        // Both nodes replicate kv and a table the query does not read (whose writes wake nothing).
        for name in ["a", "b"] {
            let store = try Store(path: directory.appendingPathComponent("\(name).db").path)
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v, n INTEGER DEFAULT 0)")
            try store.replicate(table: "kv", counters: ["n"])
            try store.execute("CREATE TABLE other(k TEXT PRIMARY KEY)")
            try store.replicate(table: "other")
        }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        let (results, task) = Self.collect(a.node.store.observe("SELECT k FROM kv WHERE v > ? ORDER BY k", [.integer(0)]))
        defer { task.cancel() }
        #expect(await results.seen(within: 30) { Self.keys($0) == [] }, "the current result at once")
        // Through the node's own connection.
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('local', 1)")
        #expect(await results.seen(within: 30) { Self.keys($0) == ["local"] })
        // The sqlite3 shell, another process (the node captures its commit).
        #expect(try sqlite3Shell(a.path, "INSERT INTO kv(k, v) VALUES ('shell', 2)").status == 0)
        #expect(await results.seen(within: 30) { Self.keys($0) == ["local", "shell"] })
        // A LAN peer's write, applied here.
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('peer', 3)")
        #expect(await results.seen(within: 30) { Self.keys($0) == ["local", "peer", "shell"] })
        // Writes that leave the result as it was (another table, a row the WHERE leaves out) yield nothing; the next
        // result is the next change of it.
        #expect(try sqlite3Shell(a.path, "INSERT INTO other VALUES ('x')").status == 0)
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('filtered', 0)")
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('last', 4)")
        #expect(await results.seen(within: 30) { Self.keys($0) == ["last", "local", "peer", "shell"] })
        let seen = await results.events.map(Self.keys)
        #expect(seen == [[], ["local"], ["local", "shell"], ["local", "peer", "shell"], ["last", "local", "peer", "shell"]])
        await b.stop()
        await a.stop()
    }

    @Test func aSlowConsumerGetsTheNewestResultAndCancellingEndsTheObservation() async throws {
        let directory = try temporaryDirectory("observe-slow")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        // A consumer that reads nothing while 200 commits land, then reads: the newest count, not a backlog.
        var results = a.node.store.observe("SELECT count(*) FROM kv").makeAsyncIterator()
        #expect(try await results.next()?.rows == [[.integer(0)]])
        for index in 0..<200 { try await a.node.execute("INSERT INTO kv(k, v) VALUES ('k\(index)', 1)") }
        var received: [QueryResult] = []
        while received.last?.rows != [[.integer(200)]], let result = try await results.next() { received.append(result) }
        #expect(received.last?.rows == [[.integer(200)]])
        #expect(received.count < 20, "coalesced: \(received.count) results for 200 commits")
        #expect(zip(received, received.dropFirst()).allSatisfy { $0 != $1 }, "never the same result twice in a row")
        // A query that writes is refused.
        var refused = a.node.store.observe("DELETE FROM kv").makeAsyncIterator()
        await #expect(throws: ShoalError.self) { _ = try await refused.next() }
        // Cancelled: the observing task ends, and the store stops telling it of commits.
        let observer = Task {
            var count = 0
            for try await _ in a.node.store.observe("SELECT count(*) FROM kv") { count += 1 }
            return count
        }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('more', 1)")
        observer.cancel()
        _ = try await observer.value
        await a.stop()
    }

    @Test func everyCommitIsPublishedOnceWithItsOriginTablesAndDots() async throws {
        let directory = try temporaryDirectory("commits")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        let commits = EventLog<StoreCommit>()
        let following = Task { for await commit in await a.node.store.commits() { await commits.append(commit) } }
        defer { following.cancel() }
        _ = try await a.node.store.read { _ in 0 }  // subscribed
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('local', 1)")
        let local = Dot(site: a.node.siteID, seq: try await a.node.versionVector()[a.node.siteID])
        #expect(await commits.seen(within: 30) { $0.origin == .local && $0.dots == [local] && $0.tables == nil })
        #expect(try sqlite3Shell(a.path, "INSERT INTO kv(k, v) VALUES ('shell', 2)").status == 0)
        #expect(await commits.seen(within: 30) { $0.origin == .otherConnection && $0.dots.count == 1 })
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('peer', 3)")
        let remote = Dot(site: b.node.siteID, seq: try await b.node.versionVector()[b.node.siteID])
        #expect(await commits.seen(within: 30) { $0.origin == .peer && $0.dots == [remote] && $0.tables == ["kv"] })
        // Once each: no dot is published twice.
        let dots = await commits.events.flatMap(\.dots)
        #expect(dots.count == Set(dots).count, "\(dots)")
        await b.stop()
        await a.stop()
    }

    /// A node looks at the database once, then sets its watches on the files: an app's commit in between sent no event
    /// to them. The watcher wakes once its watches are set, written to or not, so that commit is seen then, not at the
    /// safety look (here ten minutes away). Before, an app that committed just as its node started had that commit
    /// seen only at its next one, both under one dot.
    @Test func theWatcherLooksOnceItsWatchesAreSet() async throws {
        let directory = try temporaryDirectory("watch-start")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("w.db").path
        let app = try SQLiteConnection(path: path)
        try app.exec("PRAGMA journal_mode = WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1)")
        let wakes = EventLog<Int>()
        let watcher = DatabaseFileWatcher(path: path, safetyMilliseconds: 600_000)
        let following = Task {
            var count = 0
            for await _ in watcher.changes() {
                count += 1
                await wakes.append(count)
            }
        }
        defer { following.cancel() }
        #expect(await wakes.seen(within: 30) { $0 == 1 }, "no look once the watches were set")
    }

    /// An app that keeps its connection open with SQLite's default `synchronous = FULL` makes its commit visible only
    /// after it synced the log, after the file event that wakes the node: each of its commits is still noticed at
    /// once (the wake-ups that follow an event), not at the safety look, here put off by ten minutes.
    @Test func anAppCommitWithAFullSyncIsNoticedWithoutTheSafetyLook() async throws {
        let directory = try temporaryDirectory("full-sync")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a") { $0.commitSafetyLookMilliseconds = 600_000 }
        let commits = EventLog<StoreCommit>()
        let following = Task { for await commit in await a.node.store.commits() { await commits.append(commit) } }
        defer { following.cancel() }
        _ = try await a.node.store.read { _ in 0 }  // subscribed
        let app = try SQLiteConnection(path: a.path)
        try app.exec("PRAGMA synchronous = FULL; PRAGMA busy_timeout = 30000")
        let site = a.node.siteID
        let base = try await a.node.versionVector()[site]
        for index in 1...5 {
            _ = try app.rows("INSERT INTO kv(k, v) VALUES (?, ?)", [.text("app \(index)"), .integer(Int64(index))])
            // A deadline far below the safety look: the commit is noticed by the wake-ups a write starts.
            let expected = Dot(site: site, seq: base + UInt64(index))
            #expect(
                await commits.seen(within: 30) { $0.origin == .otherConnection && $0.dots.contains(expected) },
                "commit \(index) of the app was not noticed"
            )
        }
        await a.stop()
    }
}
