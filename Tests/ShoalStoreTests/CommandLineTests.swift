import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore

/// The CLI's rough edges, over the real binary: only `init` creates a database, one `serve` per file, plain
/// error messages, SQL from a file or stdin.
@Suite struct CommandLineTests {
    @Test func aPlainSQLiteFileIsLeftUntouchedUntilInit() throws {
        let directory = try temporaryDirectory("cli-plain")
        defer { try? FileManager.default.removeItem(at: directory) }
        let plain = directory.appendingPathComponent("app.db").path
        #expect(try sqlite3Shell(plain, "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)").status == 0)
        for arguments in [["status", "--db", plain], ["digest", "--db", plain], ["sql", "--db", plain, "SELECT 1"]] {
            let result = try runProcess(try shoalExecutable(), arguments)
            #expect(result.status != 0 && result.stderr.contains("is not a Shoal database yet"), "\(result.stderr)")
        }
        #expect(try sqlite3Shell(plain, "SELECT name FROM sqlite_schema").stdout == "notes\n")
        #expect(try shoal("init", "--db", plain).status == 0)
        #expect(try shoal("status", "--db", plain).status == 0)
    }

    @Test func aNodeWhoseParentDiesStops() async throws {
        // `shoal demo`, the harness and the tests start nodes with SHOAL_STOP_WITH_PARENT set to their pid: a parent
        // that dies (killed with -9, a crash) must leave no node running. Here the parent is a shell that exits once
        // the node listens.
        let directory = try temporaryDirectory("cli-parent")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("n.db").path
        let log = directory.appendingPathComponent("n.log").path
        #expect(try shoal("init", "--db", db, "--name", "n").status == 0)
        let script =
            "SHOAL_STOP_WITH_PARENT=$$ '\(try shoalExecutable().path)' serve --db '\(db)' --listen 127.0.0.1:0 "
            + "--no-mdns --no-remembered > '\(log)' 2>&1 & node=$!; "
            + "for i in $(seq 300); do grep -q 'listening on' '\(log)' && break; sleep 0.1; done; echo $node"
        let shell = try runProcess(URL(fileURLWithPath: "/bin/sh"), ["-c", script])
        let pid = try #require(pid_t(shell.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
        // Gone, or a zombie no one reaps (the machine's init may not): either way it stopped.
        func running() -> Bool {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
            return !(stat.split(separator: ")").last?.trimmingCharacters(in: .whitespaces).hasPrefix("Z") ?? false)
        }
        let stopped = try await waitUntil(within: 20, checkingEvery: 100) { !running() }
        if !stopped { kill(pid, SIGKILL) }
        #expect(stopped, "the node outlived its parent")
        let said = try String(contentsOfFile: log, encoding: .utf8)
        #expect(said.contains("stopped"), "it did not stop as on SIGTERM: \(said)")
    }

    @Test func helpAndUsageErrorsPrintAsTheArgumentParserPrintsThem() throws {
        let help = try shoal("--help")
        #expect(help.status == 0)
        #expect(help.stdout.contains("USAGE: shoal <subcommand>") && help.stdout.contains("unreplicate"), "\(help.stdout)")
        let sqlHelp = try shoal("sql", "--help")
        #expect(sqlHelp.status == 0 && sqlHelp.stdout.contains("--file"), "\(sqlHelp.stdout)")
        let unknown = try shoal("no-such-command")
        #expect(unknown.status == 64 && unknown.stderr.contains("Unexpected argument 'no-such-command'"))
        #expect(!help.stdout.contains("CommandError") && !sqlHelp.stdout.contains("CommandError"))
    }

    @Test func onlyInitCreatesADatabase() throws {
        let directory = try temporaryDirectory("cli-missing")
        defer { try? FileManager.default.removeItem(at: directory) }
        let typo = directory.appendingPathComponent("tpyo.db").path
        let commands: [[String]] = [
            ["sql", "--db", typo, "SELECT 1"], ["status", "--db", typo], ["digest", "--db", typo],
            ["changes", "--db", typo], ["replicate", "--db", typo, "t"], ["unreplicate", "--db", typo, "t"],
            ["compact", "--db", typo], ["conflicts", "--db", typo], ["apply", "--db", typo, "/dev/null"],
            ["serve", "--db", typo, "--no-mdns"],
        ]
        for arguments in commands {
            let result = try runProcess(try shoalExecutable(), arguments)
            #expect(result.status != 0, "\(arguments[0])")
            #expect(result.stderr.contains("there is no database at \(typo)"), "\(arguments[0]): \(result.stderr)")
            #expect(result.stderr.contains("shoal init --db"))
            #expect(!FileManager.default.fileExists(atPath: typo), "\(arguments[0]) created the file")
        }
        let created = try shoal("init", "--db", typo)
        #expect(created.status == 0)
        #expect(try shoal("status", "--db", typo).status == 0)
        // init is idempotent: the same site id.
        #expect(try shoal("init", "--db", typo).stdout == created.stdout)
        let folder = try shoal("status", "--db", directory.path)
        #expect(folder.status != 0 && folder.stderr.contains("is a directory"))
    }

    @Test func sqlComesFromAFileOrStdin() throws {
        let directory = try temporaryDirectory("cli-sql")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        #expect(try shoal("init", "--db", db).status == 0)
        let script = """
            CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);
            -- a comment; and a statement over
            -- several lines
            INSERT INTO t(id, v)
                VALUES (1, 'from a file; with a semicolon');
            """
        let file = directory.appendingPathComponent("script.sql").path
        try script.write(toFile: file, atomically: true, encoding: .utf8)
        let fromFile = try shoal("sql", "--db", db, "--file", file)
        #expect(fromFile.status == 0, "\(fromFile.stderr)")
        let fromStdin = try shoal(
            "sql",
            "--db",
            db,
            "-",
            input: Data("INSERT INTO t(id, v) VALUES (2, 'from stdin');\nSELECT v FROM t ORDER BY id;\n".utf8)
        )
        #expect(fromStdin.status == 0, "\(fromStdin.stderr)")
        #expect(fromStdin.stdout.contains("from a file; with a semicolon") && fromStdin.stdout.contains("from stdin"))
        let dashFile = try shoal(
            "sql",
            "--db",
            db,
            "--file",
            "-",
            "--json",
            input: Data("SELECT count(*) AS n FROM t".utf8)
        )
        #expect(dashFile.stdout.contains("\"n\":2"))
        // Bad uses are clear errors.
        let missing = try shoal("sql", "--db", db, "--file", directory.appendingPathComponent("nope.sql").path)
        #expect(missing.status != 0 && missing.stderr.contains("cannot read the SQL file"))
        let both = try shoal("sql", "--db", db, "--file", file, "SELECT 1")
        #expect(both.status != 0 && both.stderr.contains("not both"))
        let empty = try shoal("sql", "--db", db, "-", input: Data("  \n".utf8))
        #expect(empty.status != 0 && empty.stderr.contains("no SQL in stdin"))
    }

    @Test func errorsSayWhatFailedInPlainWords() throws {
        let directory = try temporaryDirectory("cli-errors")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        #expect(try shoal("init", "--db", db).status == 0)
        let syntax = try shoal("sql", "--db", db, "SELEC 1")
        #expect(syntax.status != 0)
        #expect(syntax.stderr.hasPrefix("shoal: could not run the SQL: "), "\(syntax.stderr)")
        #expect(syntax.stderr.contains("syntax error"), "the detail stays")
        let replicate = try shoal("replicate", "--db", db, "nosuch")
        #expect(replicate.stderr.hasPrefix("shoal: could not replicate nosuch: no table named nosuch"))

        // A port already taken: said as such, with the system's detail.
        let first = try ServeChild(database: db, extra: [])
        defer { first.stop() }
        let other = directory.appendingPathComponent("b.db").path
        #expect(try shoal("init", "--db", other).status == 0)
        let taken = try runProcess(
            try shoalExecutable(),
            ["serve", "--db", other, "--no-mdns", "--listen", "127.0.0.1:\(first.port)"]
        )
        #expect(taken.status != 0)
        #expect(taken.stderr.contains("could not start listening on 127.0.0.1:\(first.port): Address already in use"))
    }

    @Test func aSecondServeOnTheSameFileIsRefusedAndTheLockDiesWithTheProcess() throws {
        let directory = try temporaryDirectory("cli-lock")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        #expect(try shoal("init", "--db", db).status == 0)
        let first = try ServeChild(database: db, extra: [])
        let second = try runProcess(try shoalExecutable(), ["serve", "--db", db, "--no-mdns"], timeout: 60)
        #expect(second.status != 0)
        #expect(second.stderr.contains("another shoal serve (pid \(first.process.processIdentifier)) already runs"))
        // Nor through another name for the same file: a symbolic link, a hard link.
        let symbolic = directory.appendingPathComponent("symbolic.db").path
        let hard = directory.appendingPathComponent("hard.db").path
        try FileManager.default.createSymbolicLink(atPath: symbolic, withDestinationPath: db)
        try FileManager.default.linkItem(atPath: db, toPath: hard)
        for other in [symbolic, hard] {
            let refused = try runProcess(try shoalExecutable(), ["serve", "--db", other, "--no-mdns"], timeout: 60)
            #expect(refused.status != 0, "a second node started through \(other)")
            #expect(refused.stderr.contains("another shoal serve"), "\(refused.stderr)")
        }
        // Killed outright, the first leaves no stale lock: a new node starts at once.
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        let third = try ServeChild(database: db, extra: [])
        third.stop()
        #expect(third.process.terminationStatus == 0)
    }

    /// Destructive schema changes of a replicated table through `shoal sql` are refused with the way to do them
    /// (expand, then contract; for a whole table, stop replicating it first), and leave the table, its rows and its
    /// replication as they were.
    @Test func destructiveSchemaChangesThroughTheBinaryAreRefusedWithTheWayToDoThem() throws {
        let directory = try temporaryDirectory("cli-destructive")
        defer { try? FileManager.default.removeItem(at: directory) }
        let db = directory.appendingPathComponent("a.db").path
        #expect(try shoal("init", "--db", db).status == 0)
        let create = "CREATE TABLE items(id TEXT PRIMARY KEY, name TEXT, qty INTEGER DEFAULT 0)"
        #expect(try shoal("sql", "--db", db, create).status == 0)
        #expect(try shoal("replicate", "--db", db, "items").status == 0)
        #expect(try shoal("sql", "--db", db, "INSERT INTO items VALUES ('a', 'anchor', 2), ('b', 'buoy', 5)").status == 0)
        func snapshot() throws -> (schema: String, rows: [String: [String]], status: String) {
            (
                try sqlite3Shell(db, "SELECT type, name, sql FROM sqlite_schema ORDER BY name").stdout,
                try SQLiteConnection(path: db).applicationTableContents(),
                try shoal("status", "--db", db).stdout
            )
        }
        let before = try snapshot()
        #expect(before.rows["items"]?.count == 2 && before.status.contains("items: 2 rows"), "\(before.status)")
        let columnAdvice = [
            "table items is replicated", "expand, then contract", "add a new column (ALTER TABLE items ADD COLUMN",
            "copy the old values over", "stop using the old column",
        ]
        let refusals: [(sql: String, advice: [String])] = [
            ("ALTER TABLE items DROP COLUMN qty", columnAdvice),
            ("ALTER TABLE items RENAME COLUMN name TO label", columnAdvice),
            ("ALTER TABLE items RENAME TO things", columnAdvice),
            ("DROP TABLE items", ["table items is replicated", "shoal unreplicate items"]),
        ]
        for (sql, advice) in refusals {
            let result = try shoal("sql", "--db", db, sql)
            #expect(result.status != 0, "\(sql) was accepted")
            for part in advice { #expect(result.stderr.contains(part), "\(sql): \(result.stderr)") }
            let after = try snapshot()
            #expect(after.schema == before.schema, "\(sql) changed the schema")
            #expect(after.rows == before.rows, "\(sql) changed the rows")
            #expect(after.status == before.status, "\(sql): \(after.status)")
            #expect(!after.status.contains("paused"), "\(sql): \(after.status)")
        }
        // The table still replicates: a write through Shoal is captured as a change.
        #expect(try shoal("sql", "--db", db, "UPDATE items SET qty = 6 WHERE id = 'b'").status == 0)
        let changes = try shoal("changes", "--db", db)
        #expect(changes.status == 0 && changes.stdout.contains("\"items\""), "\(changes.stderr)")
    }
}

/// A `shoal serve` child on loopback, started and waited for ("listening on").
final class ServeChild {
    let process = Process()
    let port: Int

    init(database: String, extra: [String]) throws {
        process.executableURL = try shoalExecutable()
        process.arguments = ["serve", "--db", database, "--no-mdns", "--listen", "127.0.0.1:0"] + extra
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let watchdog = DispatchWorkItem { [process] in if process.isRunning { process.terminate() } }
        DispatchQueue.global().asyncAfter(deadline: .now() + 60, execute: watchdog)
        defer { watchdog.cancel() }
        var said = ""
        while !said.contains("\n") {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            said += String(decoding: chunk, as: UTF8.self)
        }
        guard let line = said.split(separator: "\n").first, line.hasPrefix("listening on "),
            let port = line.split(separator: ":").last.flatMap({ Int($0) })
        else {
            process.terminate()
            throw ShoalError(code: .invalidArgument, message: "shoal serve did not start: \(said)")
        }
        self.port = port
    }

    func stop() {
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
    }
}
