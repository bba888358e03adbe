import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// The ShoalError `body` throws; `nil` if it throws nothing.
private func shoalError(_ body: () throws(ShoalError) -> Void) -> ShoalError? {
    do throws(ShoalError) {
        try body()
        return nil
    } catch {
        return error
    }
}

/// A SQLite error keeps what SQLite said: a caller tells a busy file from a constraint from a full disk by its
/// codes, not by reading the message, and sees the statement that failed.
@Suite struct SQLiteErrorTests {
    @Test func aConstraintViolationCarriesItsExtendedCodeAndTheStatement() throws {
        let directory = try temporaryDirectory("sqlite-error")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try Store(path: directory.appendingPathComponent("a.db").path)
        try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        try store.execute("INSERT INTO t VALUES (1, 'one')")

        let duplicate = try #require(shoalError { () throws(ShoalError) in try store.execute("INSERT INTO t VALUES (1, 'again')") })
        #expect(duplicate.code == .sqlite)
        let failure = try #require(duplicate.sqlite)
        #expect(failure.isConstraintViolation && !failure.isBusy && !failure.isFull)
        #expect(failure.resultCode == 19)
        #expect(failure.extendedResultCode == 1555)  // SQLITE_CONSTRAINT_PRIMARYKEY
        #expect(failure.statement == "INSERT INTO t VALUES (1, 'again')")

        let null = try #require(shoalError { () throws(ShoalError) in try store.execute("INSERT INTO t VALUES (2, NULL)") })
        #expect(null.sqlite?.extendedResultCode == 1299)  // SQLITE_CONSTRAINT_NOTNULL

        // A statement that does not prepare names itself too (the rest of the SQL, from where it starts).
        let syntax = try #require(shoalError { () throws(ShoalError) in try store.execute("SELECT 1; SELEC 2") })
        #expect(syntax.sqlite?.resultCode == 1)
        #expect(syntax.sqlite?.statement == "SELEC 2")
    }

    @Test func aFileLockedByAnotherConnectionIsBusyNotAConstraint() throws {
        let directory = try temporaryDirectory("sqlite-busy")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        let store = try Store(path: path)
        try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
        let other = try Store(path: path)
        try other.execute("BEGIN IMMEDIATE")
        defer { _ = try? other.execute("ROLLBACK") }
        try store.execute("PRAGMA busy_timeout = 20")

        let busy = try #require(shoalError { () throws(ShoalError) in try store.execute("INSERT INTO t VALUES (1, 'x')") })
        #expect(busy.code == .sqlite)
        #expect(busy.sqlite?.isBusy == true)
        #expect(busy.sqlite?.isConstraintViolation == false)
    }

    @Test func aFullDatabaseSaysFullAndKeepsWhatWasCommitted() throws {
        let directory = try temporaryDirectory("sqlite-full")
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try Store(path: directory.appendingPathComponent("a.db").path)
        try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        try store.replicate(table: "t")
        try store.execute("INSERT INTO t VALUES (1, randomblob(1000))")
        let captured = try store.changes(since: VersionVector()).flatMap(\.changes).count
        let pages = try store.execute("PRAGMA page_count").rows[0][0]
        guard case .integer(let count) = pages else { Issue.record("page_count: \(pages)"); return }
        // The file may not grow beyond a few more pages: a large write fills it.
        try store.execute("PRAGMA max_page_count = \(count + 4)")

        let full = try #require(shoalError { () throws(ShoalError) in try store.execute("INSERT INTO t VALUES (2, randomblob(1000000))") })
        #expect(full.sqlite?.isFull == true, "\(full)")
        #expect(try store.execute("SELECT count(*) FROM t").rows == [[.integer(1)]])
        #expect(try store.changes(since: VersionVector()).flatMap(\.changes).count == captured)
    }
}
