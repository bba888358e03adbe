import ArgumentParser
import Foundation
import Shoal
import ShoalCore
import ShoalProtocol
import ShoalStore

/// What a schema change costs: `ALTER TABLE … ADD COLUMN` on a large replicated table, on the node that makes it and
/// on a peer that applies it (time, change-log entries written on each, bytes on the wire, sealed bytes the relay
/// stores), the same for a counter column (``Store/addCounterColumn(_:to:)``), and how fast values held for a column
/// a node lacked are replayed once it adds the column. Two stores in this process, on files.
struct SchemaBenchmark: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "schema",
        abstract: "ADD COLUMN and a counter column on a large table (origin and peer: time, log entries, wire and relay bytes) and the replay rate of held values."
    )

    @Flag(help: "Print one JSON object instead of a table.") var json = false
    @Option(help: "Rows in the table.") var rows = 1_000_000
    @Option(help: "Values held on the peer and replayed when it adds the column.") var held = 100_000

    func run() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shoal-schema-bench-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let origin = try Store(path: directory.appendingPathComponent("a.db").path)
        let peerPath = directory.appendingPathComponent("b.db").path
        var peer: Store? = try Store(path: peerPath)
        for store in [origin, peer!] {
            try store.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER, c REAL)")
            try store.replicate(table: "t")
        }
        try origin.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(rows)) "
                + "INSERT INTO t(id, a, b, c) SELECT i, printf('row %d', i), i * 7, i / 3.0 FROM n"
        )
        _ = try Self.sync(origin, peer!)
        var figures: [(String, Double)] = []

        // ADD COLUMN, then a counter column, each on the origin (the statement, its adoption and its one schema change
        // set), then applied by the peer (the change set crosses, and the ALTER runs in the apply).
        let changes: [(name: String, make: (Store) throws -> Void)] = [
            ("add column", { try $0.execute("ALTER TABLE t ADD COLUMN note TEXT DEFAULT 'none'") }),
            ("add counter column", { try $0.addCounterColumn("hits", to: "t") }),
        ]
        var start = DispatchTime.now()
        for (name, make) in changes {
            let (originBefore, peerBefore) = (try Self.logEntries(origin), try Self.logEntries(peer!))
            let vectorBefore = try origin.versionVector()
            start = DispatchTime.now()
            try make(origin)
            figures.append(("\(name) on \(rows) rows, origin (ms)", Self.milliseconds(since: start)))
            figures.append(("\(name): change-log entries written, origin", Double(try Self.logEntries(origin) - originBefore)))
            figures.append(("\(name): sealed bytes the relay stores", Double(try Self.relayBytes(origin, since: vectorBefore))))
            start = DispatchTime.now()
            let wire = try Self.sync(origin, peer!)
            figures.append(("\(name) on \(rows) rows, peer apply (ms)", Self.milliseconds(since: start)))
            figures.append(("\(name): change-log entries written, peer", Double(try Self.logEntries(peer!) - peerBefore)))
            figures.append(("\(name): bytes on the wire to one peer", Double(wire)))
            let digestsAgree = try origin.digest() == peer!.digest()
            figures.append(("\(name): digests agree afterwards (1 = yes)", digestsAgree ? 1 : 0))
        }

        // Replay: the peer follows schema changes by hand, receives `held` values for a column it lacks, then adds it.
        peer = nil
        var options = StoreOptions()
        options.schemaChanges = .manual
        peer = try Store(path: peerPath, options: options)
        try origin.execute("ALTER TABLE t ADD COLUMN tag TEXT")
        try origin.execute("UPDATE t SET tag = 'tag ' || id WHERE id <= \(held)")
        _ = try Self.sync(origin, peer!)
        let heldCount = try peer!.heldChanges()["t"] ?? 0
        start = DispatchTime.now()
        try peer!.execute("ALTER TABLE t ADD COLUMN tag TEXT")
        let replay = Self.milliseconds(since: start)
        figures.append(("replay: values held", Double(heldCount)))
        figures.append(("replay: add column and replay them (ms)", replay))
        figures.append(("replay: values per second", Double(heldCount) / max(replay, 0.001) * 1000))
        let replayedAgree = try origin.digest() == peer!.digest() && peer!.heldChanges().isEmpty
        figures.append(("replay: digests agree afterwards (1 = yes)", replayedAgree ? 1 : 0))

        if json {
            print(String(data: try JSONSerialization.data(withJSONObject: Dictionary(uniqueKeysWithValues: figures)), encoding: .utf8)!)
        } else {
            for (name, value) in figures { print("\(name): \(String(format: "%.2f", value))") }
        }
    }

    /// Applies what `to` lacks from `from`, batch by batch as a link does; returns the batches' encoded bytes.
    private static func sync(_ from: Store, _ to: Store) throws -> Int {
        var bytes = 0
        var received: [SiteID: UInt64] = [:]
        let batches = try from.changes(since: to.versionVector())
        for (index, batch) in batches.enumerated() {
            let message = WireMessage.changeBatch(
                ChangeBatchMessage(requestID: 1, sequence: UInt32(index), isLast: index == batches.count - 1, batch: batch)
            )
            bytes += message.encoded().count
            let report = try to.apply(batch.changes, claim: batch.claim, received: received)
            received.merge(report.acceptedHighest) { max($0, $1) }
        }
        return bytes
    }

    /// What the relay stores of the change sets `store` holds beyond `vector`, as a node uploads them: each batch
    /// compressed when that pays and sealed (``RelayChunker``), envelope headers included.
    private static func relayBytes(_ store: Store, since vector: VersionVector) throws -> Int {
        let seal = RelaySeal(clusterSecret: (0..<32).map { _ in UInt8.random(in: 0...255) })
        // A cluster id as a node's key file names it: 32 hexadecimal digits.
        var chunker = RelayChunker(
            cluster: String(repeating: "0", count: 32), seal: seal, heads: vector, pieceBytes: 1024 * 1024
        )
        let cursor = try store.deltaCursor(since: vector)
        var bytes = 0
        while let batch = try store.nextBatch(cursor, maxChanges: 20_000, maxBytes: 1024 * 1024) {
            bytes += try chunker.envelopes(for: batch).reduce(0) { $0 + $1.encodedCount }
        }
        return bytes
    }

    private static func logEntries(_ store: Store) throws -> Int {
        Int(try store.execute("SELECT count(*) FROM shoal_log").rows.first?.first?.integerValue ?? 0)
    }

    private static func milliseconds(since start: DispatchTime) -> Double {
        Double(DispatchTime.now().uptimeNanoseconds - start.uptimeNanoseconds) / 1_000_000
    }
}
