import ArgumentParser
import Foundation
import Shoal

@main
struct ShoalCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "shoal",
        abstract: "Peer-to-peer sync for SQLite databases.",
        discussion: """
            Each database is an ordinary SQLite file with a random site id. Mark tables replicated, write with \
            plain SQL through `shoal sql`, and exchange changes: `shoal changes --db a.db | shoal apply --db b.db`.
            """,
        subcommands: [
            Init.self, SQL.self, Replicate.self, Changes.self, Apply.self, Digest.self, Status.self, Conflicts.self,
            Compact.self, Serve.self, Demo.self,
        ]
    )
}

/// The database option every subcommand takes.
struct DatabaseOptions: ParsableArguments {
    @Option(name: .long, help: "Path of the SQLite database file.")
    var db: String

    func open(nodeName: String? = nil) throws -> Store {
        var options = StoreOptions()
        options.nodeName = nodeName
        return try Store(path: db, options: options)
    }
}

extension ShoalCommand {
    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create the database and its site id (idempotent); prints the site id."
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "A human-readable name for this node.") var name: String?

        func run() throws {
            let store = try database.open(nodeName: name)
            print(store.siteID.hex)
        }
    }

    struct SQL: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "sql",
            abstract: "Run SQL statements; the rows of the last one are printed as a table."
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print rows as JSON lines instead of a table.") var json = false
        @Argument(help: "The SQL to run (several statements separated by ';').") var sql: String

        func run() throws {
            let store = try database.open()
            let result = try store.execute(sql)
            guard !result.columns.isEmpty else { return }
            if json {
                for row in result.rows { print(Output.jsonLine(columns: result.columns, row: row)) }
            } else {
                print(Output.table(columns: result.columns, rows: result.rows), terminator: "")
            }
        }
    }

    struct Replicate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Mark a table replicated; rows already in it become changes."
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The table (it must have a PRIMARY KEY).") var table: String
        @Option(name: .customLong("counter"), help: "A column that merges as a PN-counter (repeatable).")
        var counters: [String] = []

        func run() throws {
            let store = try database.open()
            try store.replicate(table: table, counters: counters)
            print("replicating \(table)" + (counters.isEmpty ? "" : " (counters: \(counters.joined(separator: ", ")))"))
        }
    }

    struct Changes: ParsableCommand {
        static let configuration = CommandConfiguration(
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
            abstract: "Apply a change stream from a file or stdin, all or nothing."
        )

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The stream file, or - for stdin.") var file: String = "-"

        func run() throws {
            let store = try database.open()
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
            case .start(let site, let since, let claim): stream = (site, since, claim)
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
        }
    }

    struct Digest: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the state digest; two databases have converged exactly when their digests match."
        )

        @OptionGroup var database: DatabaseOptions

        func run() throws {
            let store = try database.open()
            let digest = try store.digest()
            print("rows: \(digest.rowCount)")
            print(digest.hex)
        }
    }

    struct Compact: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Drop overwritten entries from the change log (a running node also does this on its own).",
            discussion: """
                What any peer would be sent stays exactly the same; only entries whose every row has been \
                overwritten since go. Safe while a node runs on the same database.
                """
        )

        @OptionGroup var database: DatabaseOptions

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
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show site id, version vector, replicated tables, tombstones and conflicts."
        )

        @OptionGroup var database: DatabaseOptions
        @Flag(help: "Print one JSON object.") var json = false

        func run() throws {
            let store = try database.open()
            let status = try store.status()
            let live = LiveStatus.read(forDatabase: database.db)
            print(
                json ? Output.json(status, live: live) : Output.text(status, live: live),
                terminator: json ? "\n" : ""
            )
        }
    }

    struct Conflicts: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the most recent conflicts, newest first.")

        @OptionGroup var database: DatabaseOptions
        @Option(help: "How many to show.") var limit = 20

        func run() throws {
            let store = try database.open()
            let rows = try store.conflicts(limit: limit).map { conflict in
                [
                    SQLValue.text(conflict.table), .text(conflict.primaryKey.map(\.description).joined(separator: ",")),
                    .text(conflict.column), conflict.localValue, conflict.remoteValue, .text(conflict.winner.rawValue),
                ]
            }
            print(
                Output.table(columns: ["table", "key", "column", "local", "remote", "winner"], rows: rows),
                terminator: ""
            )
        }
    }
}
