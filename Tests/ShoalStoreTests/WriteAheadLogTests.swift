import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// A burst (one large transaction) grows the write-ahead log; it must not stay large once the burst is over.
@Suite struct WriteAheadLogTests {
    @Test func theLogIsCutBackAfterABurst() throws {
        let directory = try temporaryDirectory("wal")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        let store = try Store(path: path)
        try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT)")
        try store.replicate(table: "t")
        try store.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
                + "INSERT INTO t SELECT i, printf('%.300c', 'x') FROM n"
        )
        func walSize() throws -> Int {
            (try FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
        }
        let afterBurst = try walSize()
        #expect(afterBurst > 2 * Store.walSizeLimit, "the burst should have grown the log: \(afterBurst) bytes")
        // The next writes find it checkpointed, reset it, and cut it back.
        for index in 0..<3 { try store.execute("UPDATE t SET body = 'y' WHERE id = \(index + 1)") }
        let afterwards = try walSize()
        #expect(afterwards <= Store.walSizeLimit, "\(afterwards) bytes")
        #expect(try SQLiteConnection(path: path).rows("SELECT count(*) FROM t") == [[.integer(100_000)]])
    }
}
