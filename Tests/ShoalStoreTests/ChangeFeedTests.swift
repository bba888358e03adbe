import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// The change feed: every committed change set after a cursor, local or applied, resumable from the cursor's text
/// after a restart, waiting for new commits once it has delivered everything.
@Suite struct ChangeFeedTests {
    private static func make(_ path: String) throws {
        let store = try Store(path: path)
        try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
        try store.replicate(table: "kv")
        try store.execute("CREATE TABLE other(k TEXT PRIMARY KEY)")
        try store.replicate(table: "other")
    }

    @Test func aFeedDeliversEveryChangeSetAndResumesFromItsCursorAfterARestart() async throws {
        let directory = try temporaryDirectory("feed")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (path, remotePath) = (directory.appendingPathComponent("a.db").path, directory.appendingPathComponent("r.db").path)
        try Self.make(path)
        try Self.make(remotePath)
        let remote = try Store(path: remotePath)
        try remote.execute("INSERT INTO kv VALUES ('remote', x'00ff')")
        var store: SerializedStore? = try SerializedStore(path: path, options: StoreOptions())
        try await store!.withStore { s throws(ShoalError) in
            try s.execute("INSERT INTO kv VALUES ('a', 1), ('b', 2)")
            try s.execute("INSERT INTO other VALUES ('x')")
            try s.execute("DELETE FROM kv WHERE k = 'b'")
        }
        let changes = try remote.changes(since: VersionVector())
        for batch in changes { _ = try await store!.apply(batch) }
        var feed = store!.changes(in: ["kv"]).makeAsyncIterator()
        var delivered: [FeedChangeSet] = []
        for _ in 0..<3 { delivered.append(try #require(try await feed.next())) }
        // Sites come in any order, each site's change sets in its order. Row b, deleted since, comes with the change
        // set that last wrote it (the delete), as a peer would get it; the change set of `other` is not delivered.
        let expected: Set<FeedChangeSet.Row> = [
            .init(table: "kv", primaryKey: [.text("a")], deleted: false, columns: ["v": .integer(1)]),
            .init(table: "kv", primaryKey: [.text("b")], deleted: true, columns: [:]),
            .init(table: "kv", primaryKey: [.text("remote")], deleted: false, columns: ["v": .blob([0, 255])]),
        ]
        #expect(Set(delivered.flatMap(\.rows)) == expected)
        #expect(delivered.filter { !$0.isLocal }.map(\.dot) == [Dot(site: remote.siteID, seq: 1)])
        let local = delivered.filter(\.isLocal).map(\.dot.seq)
        #expect(local == [1, 3], "the local site's change sets in order: \(local)")
        let saved = delivered[0].cursor.text
        // A restart: the database opened again, the feed resumed from the first change set's cursor gets the other two.
        store = nil
        store = try SerializedStore(path: path, options: StoreOptions())
        let resumed = try #require(ChangeFeedCursor(text: saved))
        #expect(resumed == delivered[0].cursor)
        var again = store!.changes(in: ["kv"], after: resumed).makeAsyncIterator()
        var rest: [Dot] = []
        for _ in 0..<2 { rest.append(try #require(try await again.next()).dot) }
        #expect(Set(rest) == Set(delivered.dropFirst().map(\.dot)))
        let all = ChangeFeedCursor(delivered.reduce(into: VersionVector()) { vector, set in
            vector.advance(set.dot.site, to: max(vector[set.dot.site], set.dot.seq))
        })
        // Everything delivered: the feed waits for the next commit, and delivers it.
        let waiting = Task { [store] in
            var iterator = store!.changes(in: ["kv"], after: all).makeAsyncIterator()
            return try await iterator.next()
        }
        try await store!.withStore { s throws(ShoalError) in try s.execute("UPDATE kv SET v = 3 WHERE k = 'a'") }
        let fourth = try #require(try await waiting.value)
        #expect(fourth.rows == [.init(table: "kv", primaryKey: [.text("a")], deleted: false, columns: ["v": .integer(3)])])
        #expect(ChangeFeedCursor(text: "not a cursor") == nil)
    }

    @Test func aFeedOfEveryTableFromTheStartCountsEveryTransactionOnce() async throws {
        let directory = try temporaryDirectory("feed-all")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        try Self.make(path)
        let store = try SerializedStore(path: path, options: StoreOptions())
        // More transactions than one read takes (5,000 changes).
        try await store.withStore { s throws(ShoalError) in
            for index in 0..<6_000 { try s.execute("INSERT INTO kv VALUES ('k\(index)', \(index))") }
        }
        var feed = store.changes().makeAsyncIterator()
        var dots = Set<Dot>()
        while dots.count < 6_000, let set = try await feed.next() {
            #expect(dots.insert(set.dot).inserted, "delivered twice: \(set.dot)")
        }
        #expect(dots.count == 6_000)
        #expect(dots.map(\.seq).sorted() == Array(1...6_000))
    }
}

/// A query's rows as Decodable values, matched by column name.
@Suite struct QueryResultDecodingTests {
    struct Todo: Decodable, Equatable {
        var title: String
        var done: Bool
        var weight: Double
        var rank: Int32?
        var note: [UInt8]?
    }

    @Test func rowsDecodeByColumnNameAndAMismatchNamesItsColumn() throws {
        let result = QueryResult(
            columns: ["title", "done", "weight", "rank", "note"],
            rows: [
                [.text("write"), .integer(0), .real(1.5), .integer(3), .blob([0, 255])],
                [.text("read"), .integer(1), .integer(2), .null, .null],
            ]
        )
        #expect(
            try result.decode(Todo.self) == [
                Todo(title: "write", done: false, weight: 1.5, rank: 3, note: [0, 255]),
                Todo(title: "read", done: true, weight: 2, rank: nil, note: nil),
            ]
        )
        let wrong = QueryResult(columns: ["title", "done", "weight"], rows: [[.integer(1), .integer(0), .real(1)]])
        #expect { try wrong.decode(Todo.self) } throws: { ($0 as? ShoalError)?.message.contains("column title") == true }
        let overflow = QueryResult(
            columns: ["title", "done", "weight", "rank"], rows: [[.text("x"), .integer(0), .real(1), .integer(1 << 40)]]
        )
        #expect { try overflow.decode(Todo.self) } throws: { ($0 as? ShoalError)?.message.contains("rank") == true }
    }
}
