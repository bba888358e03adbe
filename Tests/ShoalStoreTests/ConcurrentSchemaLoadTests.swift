import CSQLite
import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// Two connections on one file (an app's `Store` beside the node's): while one loads the replicated tables after a
/// schema change, the other commits one of its own (replicates a table, adopts a column and with it makes
/// `shoal_schema`). Whatever statement of the load that commit lands before, the loading connection must end up with
/// every replicated table: its writes to them captured, its digest the other's, and a column added later adopted
/// without replicating a table again.
@Suite struct ConcurrentSchemaLoadTests {
    /// Runs `action` once, as the `fireAt`-th statement its connection starts begins (counted from 1), and counts the
    /// statements started meanwhile.
    final class StatementTrap {
        var started = 0
        var fireAt = Int.max
        var action: (() throws -> Void)?
        var fired = false
        var failure: (any Error)?

        func statementStarts() {
            started += 1
            guard started == fireAt, let action else { return }
            self.action = nil
            fired = true
            do { try action() } catch { failure = error }
        }

        /// Installs the trap on `connection` (SQLite's statement trace); `remove()` takes it off.
        func install(on connection: SQLiteConnection) {
            let callback: @convention(c) (UInt32, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?,
                UnsafeMutableRawPointer?) -> Int32 = { _, context, _, _ in
                    Unmanaged<StatementTrap>.fromOpaque(context!).takeUnretainedValue().statementStarts()
                    return 0
                }
            let context = Unmanaged.passUnretained(self).toOpaque()
            sqlite3_trace_v2(connection.handle, UInt32(SQLITE_TRACE_STMT), callback, context)
        }

        func remove(from connection: SQLiteConnection) {
            sqlite3_trace_v2(connection.handle, 0, nil, nil)
        }
    }

    /// One run: `app` loads the tables after another tool added a column and made a table, while `node` (another
    /// connection on the file) replicates that table and adopts the column as the `fireAt`-th statement of the load
    /// begins. Returns how many statements the load ran.
    @discardableResult
    private func run(fireAt: Int) throws -> Int {
        let directory = try temporaryDirectory("schema-load")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("a.db").path
        var options = StoreOptions()
        options.clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        let app = try Store(path: path, options: options)
        try app.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, a TEXT)")
        try app.replicate(table: "t")
        try app.execute("INSERT INTO t(k, a) VALUES (1, 'one')")
        let node = try Store(path: path, options: options)
        let peer = try Store(path: directory.appendingPathComponent("peer.db").path, options: options)
        for sql in ["CREATE TABLE t(k INTEGER PRIMARY KEY, a TEXT)", "CREATE TABLE u(k INTEGER PRIMARY KEY, v TEXT)"] {
            try peer.execute(sql)
        }
        try peer.replicate(table: "t")
        try peer.replicate(table: "u")
        #expect(try app.digest() == node.digest())

        // Another tool (the sqlite3 shell) adds a column and makes a table: both connections load again.
        let shell = try SQLiteConnection(path: path)
        try shell.exec("ALTER TABLE t ADD COLUMN note TEXT DEFAULT 'none'")
        try shell.exec("CREATE TABLE u(k INTEGER PRIMARY KEY, v TEXT)")

        let trap = StatementTrap()
        trap.fireAt = fireAt
        trap.action = {
            try node.replicate(table: "u")
            #expect(try node.adoptSchemaChanges() == ["t.note"])
        }
        trap.install(on: app.connection)
        _ = try app.pausedTables()
        trap.remove(from: app.connection)
        if let failure = trap.failure { throw failure }
        let statements = trap.started
        if !trap.fired {
            // The load ended first: the node commits after it, as a new schema.
            try node.replicate(table: "u")
            _ = try node.adoptSchemaChanges()
        }

        // The app's connection adopts nothing more (the node did), and replicates no table again.
        #expect(try app.adoptSchemaChanges().isEmpty)
        try app.execute("UPDATE t SET note = 'written' WHERE k = 1")
        try app.execute("INSERT INTO u(k, v) VALUES (1, 'new')")
        #expect(try app.pausedTables().isEmpty)
        #expect(try app.digest() == node.digest())
        #expect(try app.digest() == app.fullScanDigest())

        // What the app wrote reaches a peer, row by row as read outside Shoal.
        try sync(app, peer)
        #expect(try SQLiteConnection(path: path).applicationTableContents()
            == SQLiteConnection(path: directory.appendingPathComponent("peer.db").path).applicationTableContents())
        #expect(try peer.execute("SELECT v FROM u WHERE k = 1").rows == [[.text("new")]])
        return statements
    }

    @Test func aSchemaChangeCommittedByAnotherConnectionDuringALoadIsNeverMissed() throws {
        // How many statements a load runs here, then the other connection's commit before each of them in turn.
        let statements = try run(fireAt: .max)
        #expect(statements > 3)
        for fireAt in 1...statements {
            try run(fireAt: fireAt)
        }
    }
}
