import ArgumentParser
import Foundation
import Shoal
import ShoalProcesses

@main
struct ShoalCommand: AsyncParsableCommand {
    /// Parses, runs, and reports a failure in plain words: what failed, then the detail.
    static func main() async {
        // The nodes `shoal demo` starts are this very executable, whatever its file is named.
        setenv(ServeProcess.executableVariable, URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path, 1)
        var command: any ParsableCommand
        do {
            command = try parseAsRoot(Demo.givingDashboardItsDefault(Array(CommandLine.arguments.dropFirst())))
        } catch {
            exit(withError: error)
        }
        do {
            if var asynchronous = command as? any AsyncParsableCommand {
                try await asynchronous.run()
            } else {
                try command.run()
            }
        } catch {
            // Help, usage and validation errors (thrown by the argument parser's own commands too) print as the
            // parser prints them.
            if error is CleanExit || error is ExitCode || error is ValidationError
                || String(reflecting: type(of: error)).hasPrefix("ArgumentParser.")
            {
                exit(withError: error)
            }
            let activity = (command as? any DescribedActivity)?.activity
            FileHandle.standardError.write(Data("shoal: \(Output.failure(error, while: activity))\n".utf8))
            Foundation.exit(1)
        }
    }

    static let configuration = CommandConfiguration(
        commandName: "shoal",
        abstract: "Peer-to-peer sync for SQLite databases.",
        discussion: """
            Each database is an ordinary SQLite file with a random site id. Mark tables replicated, write with \
            plain SQL through `shoal sql`, and exchange changes: `shoal changes --db a.db | shoal apply --db b.db`.
            """,
        subcommands: [
            Init.self, SQL.self, Replicate.self, Changes.self, Apply.self, Digest.self, Status.self, Conflicts.self,
            Compact.self, Unreplicate.self, Serve.self, Demo.self, ID.self, Invite.self, Join.self, Trust.self,
            Relay.self, Verify.self, Watch.self, Feed.self,
        ]
    )
}

/// The database option every subcommand takes.
struct DatabaseOptions: ParsableArguments {
    @Option(name: .long, help: "Path of the SQLite database file.")
    var db: String

    /// Opens the database, which must exist: only `init` (with `creating`) makes a new one, so a mistyped
    /// path is an error rather than a fresh database with a new site id.
    func open(nodeName: String? = nil, creating: Bool = false, mmapSize: Int = 0) throws -> Store {
        try Self.open(db, nodeName: nodeName, creating: creating, mmapSize: mmapSize)
    }

    /// Opens the database at `db` (see ``open(nodeName:creating:mmapSize:)``).
    static func open(_ db: String, nodeName: String? = nil, creating: Bool = false, mmapSize: Int = 0) throws -> Store {
        if !creating { try requireExisting(db) }
        var options = StoreOptions()
        options.nodeName = nodeName
        options.mmapSize = mmapSize
        let store = try Store(path: db, options: options)
        if try store.identityChange() != nil, KeyFile.exists(forDatabase: db), try store.hasRoster() {
            // A database that moved to a fresh site binds it to its node before anything leaves it (a stream too):
            // a removal of this node fences it as well. A read-only file or a removed node signs nothing.
            let keyFile = try KeyFile.load(forDatabase: db)
            try? Membership.bindOwnSites(store: store, keyFile: keyFile, now: SystemWallClock().nowMilliseconds())
        }
        return store
    }

    /// Throws ``ShoalError/Code/missingDatabase`` unless a file exists at `db`.
    func requireExisting() throws(ShoalError) {
        try Self.requireExisting(db)
    }

    /// Throws ``ShoalError/Code/missingDatabase`` unless a Shoal database exists at `db`.
    static func requireExisting(_ db: String) throws(ShoalError) {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: db, isDirectory: &isDirectory) else {
            throw ShoalError(
                code: .missingDatabase,
                message: "there is no database at \(db); check --db, or create one with `shoal init --db \(db)`"
            )
        }
        guard !isDirectory.boolValue else {
            throw ShoalError(code: .missingDatabase, message: "\(db) is a directory, not a database file")
        }
        // A plain SQLite file (an app's) is left untouched until `init` makes it a Shoal database.
        guard try Store.isShoalDatabase(path: db) else {
            throw ShoalError(
                code: .missingDatabase,
                message: "\(db) is not a Shoal database yet (no site id); make it one with `shoal init --db \(db)` "
                    + "(its tables and rows stay as they are)"
            )
        }
    }
}

/// A command that names what it was doing, for error messages ("could not run the SQL: …").
protocol DescribedActivity {
    var activity: String { get }
}

extension ShoalCommand {
    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "init",
            abstract: "Create the database, its site id and its node key (idempotent); prints the site id.",
            discussion: """
                The node key goes to PATH.shoal-key (mode 600), with the credentials of a new cluster of one. \
                Add devices with `shoal invite` here and `shoal join` there.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "A human-readable name for this node.") var name: String?
        @Flag(help: "Make a new node key though the database belonged to a cluster whose key file is lost.")
        var newKey = false

        func run() throws {
            let store = try database.open(nodeName: name, creating: true)
            // A node key and a cluster of one: admit other devices with `shoal invite`.
            try Membership.initialize(
                databasePath: database.db,
                store: store,
                now: SystemWallClock().nowMilliseconds(),
                newKey: newKey
            )
            // Opened again: a member's file given a new key moves to a site of its own at its next open.
            print(try database.open(nodeName: name, creating: true).siteID.hex)
        }
    }

    struct SQL: ParsableCommand, DescribedActivity {
        static let configuration = CommandConfiguration(
            commandName: "sql",
            abstract: "Run SQL statements; the rows of the last one are printed as a table.",
            discussion: "The SQL comes from the argument, from a file (--file PATH), or from stdin (- or --file -)."
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print rows as JSON lines instead of a table.") var json = false
        @Option(help: ArgumentHelp("Read the SQL from this file (- for stdin).", valueName: "path")) var file: String?
        @Argument(help: "The SQL to run (several statements separated by ';'), or - to read it from stdin.")
        var sql: String?

        var activity: String { "could not run the SQL" }

        func validate() throws {
            guard (sql == nil) != (file == nil) else {
                throw ValidationError("give the SQL either as an argument or with --file, not both and not neither")
            }
        }

        func run() throws {
            let store = try database.open()
            let text = try Self.readSQL(argument: sql, file: file)
            let result = try store.execute(text)
            guard !result.columns.isEmpty else { return }
            if json {
                for row in result.rows { print(Output.jsonLine(columns: result.columns, row: row)) }
            } else {
                print(Output.table(columns: result.columns, rows: result.rows), terminator: "")
            }
        }

        /// The SQL to run: the argument itself, or a file's or stdin's contents.
        static func readSQL(argument: String?, file: String?) throws(ShoalError) -> String {
            let source = file ?? (argument == "-" ? "-" : nil)
            guard let source else { return argument ?? "" }
            let data: Data
            if source == "-" {
                data = FileHandle.standardInput.readDataToEndOfFile()
            } else {
                guard let contents = FileManager.default.contents(atPath: source) else {
                    throw ShoalError(
                        code: .invalidArgument,
                        message: "cannot read the SQL file \(source): no such readable file"
                    )
                }
                data = contents
            }
            guard let text = String(data: data, encoding: .utf8) else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "the SQL in \(source == "-" ? "stdin" : source) is not valid UTF-8"
                )
            }
            guard !text.allSatisfy(\.isWhitespace) else {
                throw ShoalError(code: .invalidArgument, message: "no SQL in \(source == "-" ? "stdin" : source)")
            }
            return text
        }
    }

    struct Replicate: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "replicate",
            abstract: "Mark a table replicated; rows already in it become changes."
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The table (it must have a PRIMARY KEY).") var table: String
        @Option(name: .customLong("counter"), help: "A column that merges as a PN-counter (repeatable).")
        var counters: [String] = []
        @Option(
            name: .customLong("add-counter"),
            help: ArgumentHelp(
                "Add a counter column to the replicated table (INTEGER NOT NULL DEFAULT 0); every peer adds it too.",
                valueName: "column"
            )
        )
        var addCounter: String?

        func run() throws {
            let store = try database.open()
            if let addCounter {
                try store.addCounterColumn(addCounter, to: table)
                print("added counter column \(table).\(addCounter)")
                return
            }
            let warnings = try store.replicate(table: table, counters: counters)
            print("replicating \(table)" + (counters.isEmpty ? "" : " (counters: \(counters.joined(separator: ", ")))"))
            for warning in warnings { FileHandle.standardError.write(Data("warning: \(warning)\n".utf8)) }
        }
    }

    struct Changes: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "changes",
            abstract: "Write the changes a version vector lacks to stdout as JSON lines.",
            discussion: """
                The first line is a header with this database's site id and version; the last line marks the end \
                of the stream. Pipe it into `shoal apply`.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(
            help: ArgumentHelp(
                "Only changes this version lacks: a JSON version vector, what `shoal status --json` prints, or a "
                    + "stream header; or a file holding one of them (or a whole stream).",
                valueName: "file-or-json"
            )
        )
        var since: String?

        func run() throws {
            let store = try database.open()
            var vector = VersionVector()
            if let since { vector = try Self.versionVector(since) }
            try store.writeChangeStream(since: vector) { (bytes) throws(ShoalError) in
                try StandardStreams.write(bytes)
            }
        }

        /// The vector in `argument`: JSON, or a file holding JSON (the whole file, or its first line).
        static func versionVector(_ argument: String) throws -> VersionVector {
            guard FileManager.default.fileExists(atPath: argument) else {
                return try ChangeStream.parseVersionVector(json: argument)
            }
            guard let data = FileManager.default.contents(atPath: argument) else {
                throw ShoalError(code: .invalidArgument, message: "cannot read \(argument)")
            }
            let text = String(decoding: data, as: UTF8.self)
            if let vector = try? ChangeStream.parseVersionVector(json: text) { return vector }
            return try ChangeStream.parseVersionVector(
                json: text.split(separator: "\n", maxSplits: 1).first.map(String.init) ?? ""
            )
        }
    }

    struct Apply: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "apply",
            abstract: "Apply a change stream from a file or stdin, all or nothing."
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The stream file, or - for stdin.") var file: String = "-"

        func run() throws {
            let store = try database.open()
            let keyFile = KeyFile.exists(forDatabase: database.db) ? try KeyFile.load(forDatabase: database.db) : nil
            // A removal, or a removed node's binding of a fresh site, the stream brings fences before the rest applies.
            if let keyFile { Membership.installFenceGate(store: store, keyFile: keyFile) }
            let descriptor: Int32
            if file == "-" {
                descriptor = 0
            } else {
                descriptor = open(file, O_RDONLY)
                guard descriptor >= 0 else {
                    throw ShoalError(code: .invalidArgument, message: "cannot read \(file): no such readable file")
                }
            }
            defer { if descriptor != 0 { close(descriptor) } }
            // Parse lines as they arrive, on a thread of their own, and apply each chunk as it comes, all in one
            // transaction: reading, parsing and writing overlap, and a bad or cut stream still applies nothing.
            let chunks = StreamChunks.reading(descriptor)
            defer { chunks.close() }
            let stream: (site: SiteID, since: VersionVector, claim: VersionVector)
            switch chunks.take() {
            case .start(let site, let since, let claim, let schema, let heads):
                _ = schema  // (Streams across schemas apply: what this database lacks is held.)
                // The sender's latest transaction of this database's site, with its clock: another clock here means
                // this file was restored and wrote other content under numbers the sender holds.
                for head in heads { try store.checkHead(head) }
                stream = (site, since, claim)
            case .failure(let error): throw error
            case .chunk, .end: throw ShoalError(code: .malformedStream, message: "the stream has no header")
            }
            FileHandle.standardError.write(Data("applying changes from \(stream.site.hex)\n".utf8))
            let report = try store.apply(
                chunks: { () throws(ShoalError) -> [Change]? in
                    switch chunks.take() {
                    case .chunk(let changes): return changes
                    case .end: return nil
                    case .failure(let error): throw error
                    case .start: return []
                    }
                },
                claim: stream.claim,
                since: stream.since
            )
            let held = try store.versionVector()
            if !held.dominatesOrEquals(stream.claim) {
                FileHandle.standardError.write(
                    Data(
                        ("the stream claims \(stream.claim) but proves only part of it; this database now holds "
                            + "\(held)\n").utf8
                    )
                )
            }
            print("applied: \(report.applied)  already-known: \(report.alreadyKnown)  conflicts: \(report.conflicts)")
            if let keyFile {
                // The stream may have brought a removal: what its node wrote afterwards is refused from now on.
                try Membership.enforceRemovals(store: store, keyFile: keyFile, now: SystemWallClock().nowMilliseconds())
            }
            if !report.fenced.isEmpty {
                let count = report.fenced.values.reduce(0, +)
                FileHandle.standardError.write(
                    Data(
                        ("refused \(count) changes of \(report.fenced.keys.map { String($0.hex.prefix(8)) }.sorted()) "
                            + "made after their node was removed from the cluster\n").utf8
                    )
                )
            }
            if !report.clockRefusals.isEmpty {
                let now = UInt64(Date().timeIntervalSince1970 * 1000)
                let sites = report.clockRefusals.sorted { $0.key < $1.key }.map { site, hlc in
                    "\(site.hex) (\(Int64(hlc.milliseconds) - Int64(now)) ms ahead)"
                }
                throw ShoalError(
                    code: .clockTooFarAhead,
                    message: "the changes of \(sites.joined(separator: ", ")) carry clocks further ahead of this "
                        + "machine's than allowed: they were left out (and are not claimed), everything else was "
                        + "applied. Check that site's clock; apply the stream again once time has caught up"
                )
            }
        }
    }

    struct Digest: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "digest",
            abstract: "Print the state digest; two databases have converged exactly when their digests match.",
            discussion: """
                The digest is kept up to date with every write and apply; it covers each row's metadata, whether \
                the table holds its data row, and every stored value. --full also recomputes it from a scan of \
                every data row and every row's metadata, checks that the two agree, and lists each row whose data \
                and metadata disagree (written with Shoal's capture bypassed), with what to do (exit 1 if any).
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Also recompute the digest from a full scan, check it, and list rows whose data and metadata disagree.")
        var full = false

        func run() throws {
            let store = try database.open()
            // Beside a running node and an app, a slice at a time with room for their writes in between.
            try store.settleDigestBesideOtherWriters()
            guard full else {
                let digest = try store.digest()
                print("rows: \(digest.rowCount)")
                print(digest.hex)
                return
            }
            try Self.checkConsistency(of: store, limit: 100)
        }

        /// Prints the digest, then each row whose data and metadata disagree; throws if any does or if the maintained
        /// digest differs from a full scan.
        static func checkConsistency(of store: Store, limit: Int) throws {
            try store.settleDigestBesideOtherWriters()
            let report = try store.verify(limit: limit)
            print("rows: \(report.maintained.rowCount)")
            print(report.maintained.hex)
            for mismatch in report.mismatches {
                print("mismatch: \(mismatch): \(mismatch.remedy)")
            }
            if report.mismatchCount > report.mismatches.count {
                print("mismatch: \(report.mismatchCount - report.mismatches.count) more rows disagree")
            }
            guard report.isConsistent else {
                throw ShoalError(
                    code: .corruptMetadata,
                    message: report.mismatchCount > 0
                        ? (report.mismatchCount == 1
                            ? "1 row disagrees with its metadata" : "\(report.mismatchCount) rows disagree with their metadata")
                            + " (listed above); peers see this file's rows as different from theirs until each is fixed "
                            + "as said"
                        : "the maintained digest (\(report.maintained.rowCount) rows, \(report.maintained.hex)) differs "
                            + "from a full scan (\(report.scanned.rowCount) rows, \(report.scanned.hex)); please report this"
                )
            }
            print("full scan: matches")
        }
    }

    struct Unreplicate: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "unreplicate",
            abstract: "Stop replicating a table: keep the table and its rows, and Shoal's metadata for it aside.",
            discussion: """
                The way out for a table whose shape was changed by another tool (it is then paused). Afterwards \
                `shoal replicate TABLE` (with the same --counter columns) replicates it again in its new shape and \
                continues its history: a counter adds only what moved meanwhile, a row deleted meanwhile is deleted \
                everywhere. Do the same on every node, since nodes only exchange tables of the same shape. With \
                --forget, the kept history is dropped too (also for a table no longer replicated): replicating it \
                again then makes its rows this node's writes and its counter values this node's increments.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The replicated (or paused) table.") var table: String
        @Flag(help: "Also drop the history kept for the table (a later replicate starts a new one).") var forget = false

        func run() throws {
            let store = try database.open()
            if forget, try !store.replicatedTables().contains(table), try !store.pausedTables().contains(where: { $0.name == table }) {
                let forgot = try store.forgetReplicationHistory(of: table)
                print(forgot ? "forgot the history kept for \(table)" : "no history was kept for \(table)")
                return
            }
            try store.unreplicate(table: table)
            if forget { try store.forgetReplicationHistory(of: table) }
            print("no longer replicating \(table); its rows are kept" + (forget ? ", its history is forgotten" : ""))
        }
    }

    struct Compact: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "compact",
            abstract: "Drop overwritten entries from the change log (a running node also does this on its own).",
            discussion: """
                What any peer would be sent stays exactly the same; only entries whose every row has been \
                overwritten since go. Safe while a node runs on the same database.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(
            help: """
                Also rewrite the whole file (VACUUM), so that the pages freed by collected tombstones and the \
                compacted log go back to the file system, and make the file give them back on its own from now on \
                (files shoal init creates do already). Needs free disk as large as the file; writers wait meanwhile.
                """
        )
        var vacuum = false

        func run() throws {
            let store = try database.open()
            var total = CompactionReport()
            var pass = CompactionReport()
            repeat {
                pass = try store.compactLog()
                total.examined += pass.examined
                total.removed += pass.removed
                total.keysDropped += pass.keysDropped
            } while !pass.reachedEnd
            print(total)
            if vacuum {
                let before = try FileManager.default.attributesOfItem(atPath: database.db)[.size] as? Int ?? 0
                try store.vacuum()
                _ = try store.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                let after = try FileManager.default.attributesOfItem(atPath: database.db)[.size] as? Int ?? 0
                print("vacuumed: \(before) bytes before, \(after) after; free pages now go back to the file system")
            }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "status",
            abstract: "Show site id, version vector, replicated tables, tombstones and conflicts."
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print one JSON object.") var json = false

        func run() throws {
            // Counting a large table's rows reads all of its pages: mapped, they are read in place instead of copied
            // into the page cache (half the time for a million rows), and a short-lived process keeps nothing of it.
            let store = try database.open(mmapSize: 1 << 32)
            let live = LiveStatus.read(forDatabase: database.db)
            // Beside a running node, the digest is not folded here (the node folds it a slice at a time; a fold of a
            // catch-up's rows would hold the write lock for seconds).
            let status = try store.status(settlingDigest: live == nil)
            let keyFile = try? KeyFile.load(forDatabase: database.db)
            print(
                json
                    ? Output.json(status, live: live, keyFile: keyFile, database: database.db)
                    : Output.text(status, live: live, keyFile: keyFile, database: database.db),
                terminator: json ? "\n" : ""
            )
        }
    }

    struct Conflicts: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "conflicts",
            abstract: "List the most recent conflicts, newest first."
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "How many to show.") var limit = 20
        @Flag(
            help: """
                Write again the writes orphaned while offline (rows this node wrote to while restored, copied or \
                silent past its peers' horizon, which they deleted and collected meanwhile): each row comes back \
                with them, as a new write that syncs.
                """
        )
        var restore = false
        @Option(help: "With --restore: only this table's.") var table: String?

        func run() throws {
            let store = try database.open()
            if restore {
                let restored = try store.restoreOrphanedWrites(table: table)
                print("restored \(restored) row\(restored == 1 ? "" : "s") orphaned while offline")
                return
            }
            let rows = try store.conflicts(limit: limit).map { conflict in
                [
                    SQLValue.text(conflict.table), .text(conflict.primaryKey.map(\.description).joined(separator: ",")),
                    .text(conflict.column), conflict.localValue, conflict.remoteValue, .text(conflict.winner.rawValue),
                    .text(conflict.reason),
                ]
            }
            print(
                Output.table(columns: ["table", "key", "column", "local", "remote", "winner", "reason"], rows: rows),
                terminator: ""
            )
        }
    }
}

extension ShoalCommand.Init: DescribedActivity { var activity: String { "could not initialise the database" } }
extension ShoalCommand.Replicate: DescribedActivity { var activity: String { "could not replicate \(table)" } }
extension ShoalCommand.Unreplicate: DescribedActivity { var activity: String { "could not unreplicate \(table)" } }
extension ShoalCommand.Changes: DescribedActivity { var activity: String { "could not write the changes" } }
extension ShoalCommand.Apply: DescribedActivity { var activity: String { "could not apply the changes" } }
extension ShoalCommand.Digest: DescribedActivity { var activity: String { "could not compute the digest" } }
extension ShoalCommand.Compact: DescribedActivity { var activity: String { "could not compact the change log" } }
extension ShoalCommand.Status: DescribedActivity { var activity: String { "could not read the status" } }
extension ShoalCommand.Conflicts: DescribedActivity { var activity: String { "could not read the conflicts" } }
extension ShoalCommand.Serve: DescribedActivity { var activity: String { "could not run the node" } }
extension ShoalCommand.Demo: DescribedActivity { var activity: String { "the demo failed" } }
