import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// SQLite compares 0.0 and -0.0 as equal, so an UPDATE through another connection that only flips a zero's sign once
/// went unseen: the writer kept one sign under a stamp whose value carried the other. The capture triggers now record
/// the product of the old and new zeros (-0.0 exactly when the signs differ).
@Suite struct ZeroSignCaptureTests {
    private func pair(_ directory: URL) throws -> (Store, Store, String) {
        let path = directory.appendingPathComponent("a.db").path
        let a = try Store(path: path)
        let b = try Store(path: directory.appendingPathComponent("b.db").path)
        for store in [a, b] {
            try store.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, x, y REAL)")
            try store.replicate(table: "t")
        }
        return (a, b, path)
    }

    @Test func aZeroWhoseSignAnotherConnectionFlipsReachesThePeerWithItsSign() throws {
        let directory = try temporaryDirectory("zero-sign")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (a, b, path) = try pair(directory)
        try a.execute("INSERT INTO t VALUES (1, 0.0, 'y')")
        try sync(a, b)
        let app = try SQLiteConnection(path: path)
        for value in [-0.0, 0.0, -0.0] {
            try app.rows("UPDATE t SET x = ? WHERE k = 1", [.real(value)])
            _ = try a.captureForeignWrites()
            try sync(a, b)
            // SQLValue compares REALs by their bits: 0.0 and -0.0 differ here.
            #expect(try b.execute("SELECT x FROM t WHERE k = 1").rows == [[.real(value)]])
            #expect(try a.digest() == (try b.digest()))
        }
        // An update that leaves a zero as it is stamps nothing for it.
        let before = try a.versionVector()[a.siteID]
        try app.rows("UPDATE t SET x = -0.0 WHERE k = 1")
        _ = try a.captureForeignWrites()
        #expect(try a.versionVector()[a.siteID] == before)
    }

    @Test func aDatabaseWhoseTriggersPredateTheSignOfZeroIsUpgradedWhenItOpens() throws {
        let directory = try temporaryDirectory("zero-sign-upgrade")
        defer { try? FileManager.default.removeItem(at: directory) }
        var (a, b, path) = try pair(directory)
        // As an earlier build left it: no zero-sign or write-time columns, an update trigger without them, no capture version.
        let app = try SQLiteConnection(path: path)
        let outbox = try #require(
            try app.rows("SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'shoal_outbox_%'").first?.first
        )
        guard case .text(let name) = outbox else { return }
        let id = name.dropFirst("shoal_outbox_".count)
        try app.exec(
            """
            DROP TRIGGER shoal_capture_\(id)_update;
            ALTER TABLE \(name) DROP COLUMN z0;
            ALTER TABLE \(name) DROP COLUMN z1;
            ALTER TABLE \(name) DROP COLUMN t;
            DELETE FROM shoal_meta WHERE key = 'capture_version';
            CREATE TRIGGER shoal_capture_\(id)_update AFTER UPDATE ON t BEGIN
                INSERT INTO \(name)(op, k0, changed) VALUES (3, NEW.k, '00'); END;
            """
        )
        a = try Store(path: path)
        #expect(try app.rows("SELECT value FROM shoal_meta WHERE key = 'capture_version'") == [[.integer(Store.captureVersion)]])
        try a.execute("INSERT INTO t VALUES (1, 0.0, 0.0)")
        try sync(a, b)
        try app.rows("UPDATE t SET x = -0.0 WHERE k = 1")
        _ = try a.captureForeignWrites()
        try sync(a, b)
        #expect(try b.execute("SELECT x, y FROM t WHERE k = 1").rows == [[.real(-0.0), .real(0.0)]])
    }
}
