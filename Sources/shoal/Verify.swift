import ArgumentParser
import Foundation
import Shoal

extension ShoalCommand {
    struct Verify: AsyncParsableCommand, DescribedActivity {
        static let configuration = CommandConfiguration(
            commandName: "verify",
            abstract: "List the rows in which this database and a peer's differ (read-only on both sides).",
            discussion: """
                Without --peer, checks this file alone: recomputes the digest from a scan of every data row and \
                every row's metadata, and lists each row whose data and metadata disagree, with what to do (as \
                `shoal digest --full`; exit 1 if any). With --peer:
                Connects to the node at --peer as a sync link does (mutual TLS with the roster check, or \
                --insecure-plaintext for a plaintext cluster), compares each table's digest, then the row hashes of \
                the tables that differ, a page at a time: no row travels. Prints each differing row by table and \
                key, and whether it is missing here, missing on the peer, or differs. Run it when `shoal status` \
                says a peer diverged (same version, different digests). Exits 0 when the two replicas are equal, \
                1 when rows differ. The peer must run a Shoal that speaks protocol version 3.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "The peer to compare with, HOST:PORT (as `shoal status` names it).") var peer: String?
        @Flag(help: "The cluster runs with --insecure-plaintext (no TLS).") var insecurePlaintext = false
        @Option(help: "With --insecure-plaintext only: the cluster id.") var cluster: String?
        @Option(help: "List at most this many rows.") var limit = 1_000
        @Flag(help: "Print one JSON object.") var json = false

        var activity: String { peer == nil ? "this file's check failed" : "could not compare with the peer" }

        func validate() throws {
            guard limit > 0 else { throw ValidationError("--limit takes a positive number") }
        }

        func run() async throws {
            guard let peer else {
                // Without a peer: this file alone, its data rows against Shoal's metadata.
                try ShoalCommand.Digest.checkConsistency(of: try database.open(), limit: limit)
                return
            }
            guard let address = PeerAddress(parsing: peer) else {
                throw ShoalError(code: .invalidArgument, message: "--peer wants HOST:PORT, got \"\(peer)\"")
            }
            try database.requireExisting()
            var configuration = NodeConfiguration(databasePath: database.db)
            if insecurePlaintext {
                configuration.insecurePlaintext = true
                configuration.clusterID = cluster ?? "default"
            } else {
                guard cluster == nil else {
                    throw ShoalError(
                        code: .invalidArgument,
                        message: "--cluster goes with --insecure-plaintext only: with TLS the cluster is the one in "
                            + "the node key"
                    )
                }
                let store = try database.open()
                let security = try NodeSecurity(databasePath: database.db, store: store)
                try security.configure(&configuration)
            }
            let report = try await PeerVerifier.verify(configuration: configuration, address: address, limit: limit)
            print(json ? Self.json(report, address: peer) : Self.text(report, address: peer), terminator: "")
            if !report.rows.isEmpty || !report.sameDigest { throw ExitCode(1) }
        }

        static func text(_ report: VerifyReport, address: String) -> String {
            func version(_ vector: VersionVector) -> String {
                vector.sorted.map { "\($0.site.hex.prefix(8)):\($0.seq)" }.joined(separator: " ")
            }
            func hex(_ bytes: [UInt8]) -> String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }
            var text = "peer:       \(report.peerName) \(report.peerSite.hex.prefix(8)) at \(address)\n"
            text += "here:       version \(version(report.localVersionVector)), digest \(hex(report.localDigest))\n"
            text += "there:      version \(version(report.peerVersionVector)), digest \(hex(report.peerDigest))\n"
            switch (report.sameVersion, report.sameDigest) {
            case (_, true):
                text += "verdict:    equal: the same rows on both sides\n"
            case (true, false):
                text +=
                    "verdict:    DIVERGED: the same changes but different rows; syncing between these two will not mend the rows below\n"
            case (false, false):
                text +=
                    "verdict:    different versions: one side lacks changes the other holds (a sync is under way, "
                    + "or the link fails); the rows below may differ only for that\n"
            }
            let differing = report.differingTables.isEmpty ? "" : " (\(report.differingTables.joined(separator: ", ")))"
            text += "tables:     \(report.tables.count) compared, \(report.differingTables.count) differ\(differing)\n"
            if report.rows.isEmpty {
                text += "rows:       none differ\n"
                return text
            }
            let more = report.truncated ? "+ (only the first listed; --limit)" : ""
            text += "rows:       \(report.rows.count)\(more) differ\n"
            for row in report.rows {
                text += "  \(row.table) \(row.keyDescription): \(row.difference.rawValue)\n"
            }
            return text
        }

        static func json(_ report: VerifyReport, address: String) -> String {
            func hex(_ bytes: [UInt8]) -> String { bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }
            func vector(_ vector: VersionVector) -> [String: UInt64] {
                Dictionary(uniqueKeysWithValues: vector.entries.map { ($0.key.hex, $0.value) })
            }
            let object: [String: Any] = [
                "peer": ["name": report.peerName, "site": report.peerSite.hex, "address": address],
                "local": ["version_vector": vector(report.localVersionVector), "digest": hex(report.localDigest)],
                "remote": ["version_vector": vector(report.peerVersionVector), "digest": hex(report.peerDigest)],
                "same_version": report.sameVersion,
                "same_digest": report.sameDigest,
                "diverged": report.sameVersion && !report.sameDigest,
                "tables": report.tables,
                "differing_tables": report.differingTables,
                "truncated": report.truncated,
                "rows": report.rows.map { row in
                    [
                        "table": row.table,
                        "key": Dictionary(uniqueKeysWithValues: zip(row.keyColumns, row.key.map(Output.jsonValue))),
                        "difference": row.difference.rawValue,
                    ] as [String: Any]
                },
            ]
            return Output.serialize(object) + "\n"
        }
    }
}
