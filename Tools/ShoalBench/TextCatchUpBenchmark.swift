import Foundation
import Shoal
import ShoalProcesses
import ShoalTestSupport

/// A fresh node catches up rows of JSON documents (a few KB each, the documents the compression tests use), with
/// compression and without (`--no-compression`), side by side in one run: bytes on the wire per row over the LAN link
/// (TLS records through a counting proxy) and stored at the relay per row (sealed change sets), and the loopback
/// catch-up time of each (the median of several runs, the modes alternating).
extension SyncBenchmark {
    func textCatchUp(_ directory: String) async throws -> [(String, Double)] {
        let source = try makeTextDatabase(directory + "/source.db", name: "source")
        var generator = SplitMix(state: 2026)
        let insert = try source.prepare("INSERT INTO docs(id, body) VALUES (?, ?)")
        var documentBytes = 0
        for start in stride(from: 0, to: textRows, by: 500) {
            try source.transaction {
                for id in start..<min(textRows, start + 500) {
                    let document = JSONDocuments.document(id, &generator)
                    documentBytes += document.utf8.count
                    try insert.execute([.integer(Int64(id)), .text(document)])
                }
            }
        }
        let rows = Double(textRows)
        var figures: [(String, Double)] = [("text_document_bytes_per_row", Double(documentBytes) / rows)]
        // Loopback stands in for a LAN link, compressed when asked (`--compress-loopback`); the default on loopback sends
        // it as it is, like `--no-compression`.
        let modes: [(name: String, extra: [String])] = [
            ("compressed", ["--compress-loopback"]), ("raw", ["--no-compression"]), ("default", []),
        ]
        var seconds: [String: [Double]] = [:]
        for run in 0..<textRuns {
            for mode in modes {
                let name = "\(mode.name)-\(run)"
                let target = try makeTextDatabase(directory + "/\(name).db", name: name)
                let timed = try await textCatchUpOnce(directory, source: source, target: target, name: name, extra: mode.extra)
                seconds[mode.name, default: []].append(timed.seconds)
            }
        }
        for mode in modes where mode.name != "default" {
            let name = "\(mode.name)-counted"
            let target = try makeTextDatabase(directory + "/\(name).db", name: name)
            let counter = ByteCounter()
            _ = try await textCatchUpOnce(directory, source: source, target: target, name: name, extra: mode.extra, counter: counter)
            figures.append(("text_lan_\(mode.name)_wire_bytes_per_row", Double(await counter.total) / rows))
        }
        for mode in modes where mode.name != "default" {
            let relayData = directory + "/relay-\(mode.name)"
            let relayProcess = try RelayProcess.start(data: relayData)
            defer { relayProcess.stop() }
            let cluster = try KeyFile.load(forDatabase: directory + "/source.db").cluster.idHex
            let relay = BenchRelay(url: relayProcess.url, token: try RelayProcess.token(data: relayData, cluster: cluster))
            let name = "\(mode.name)-relayed"
            let target = try makeTextDatabase(directory + "/\(name).db", name: name)
            let timed = try await textCatchUpOnce(directory, source: source, target: target, name: name, extra: mode.extra, relay: relay)
            figures.append(("text_relay_\(mode.name)_stored_bytes_per_row", try storedBytes(relayData) / rows))
            figures.append(("text_relay_\(mode.name)_catchup_seconds", timed.seconds))
        }
        func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
        let compressed = median(seconds["compressed"]!)
        let raw = median(seconds["raw"]!)
        let byDefault = median(seconds["default"]!)
        figures += [
            ("text_lan_wire_compressed_over_raw", figures.first { $0.0 == "text_lan_compressed_wire_bytes_per_row" }!.1
                / figures.first { $0.0 == "text_lan_raw_wire_bytes_per_row" }!.1),
            ("text_relay_stored_compressed_over_raw", figures.first { $0.0 == "text_relay_compressed_stored_bytes_per_row" }!.1
                / figures.first { $0.0 == "text_relay_raw_stored_bytes_per_row" }!.1),
            ("text_catchup_compressed_median_s", compressed), ("text_catchup_raw_median_s", raw),
            ("text_catchup_compressed_over_raw", compressed / raw),
            ("text_catchup_default_median_s", byDefault), ("text_catchup_default_over_raw", byDefault / raw),
        ]
        return figures
    }

    private func makeTextDatabase(_ path: String, name: String) throws -> Store {
        try? FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent,
            withIntermediateDirectories: true
        )
        var options = StoreOptions()
        options.nodeName = name
        let store = try Store(path: path, options: options)
        try store.execute("CREATE TABLE IF NOT EXISTS docs(id INTEGER PRIMARY KEY, body TEXT)")
        try store.replicate(table: "docs")
        return store
    }

    /// Starts a node on the source, then a fresh one on `target` catching up from it (through a counting proxy when
    /// `counter` is given, or only through the relay when `relay` is); the seconds until the target holds everything
    /// (checked by digest).
    private func textCatchUpOnce(
        _ directory: String,
        source: Store,
        target: Store,
        name: String,
        extra: [String],
        counter: ByteCounter? = nil,
        relay: BenchRelay? = nil
    ) async throws -> (seconds: Double, bytes: Int) {
        let goal = try source.versionVector()
        try Membership.formLocally([directory + "/source.db", directory + "/\(name).db"], now: SystemWallClock().nowMilliseconds())
        let relayArguments = relay.map { ["--relay", $0.url, "--relay-token", $0.token] } ?? []
        let serving = try ServeProcess.startIsolated(
            database: directory + "/source.db", name: "source", peers: [], extra: extra + relayArguments
        )
        defer { serving.stop() }
        if let relay {
            // The source uploads everything first (not timed): the fresh node then pulls it all from the relay.
            let deadline = Date().addingTimeInterval(900)
            while !relay.holds(goal) {
                guard Date() < deadline else { throw ServeError(message: "the upload to the relay stalled") }
                try await Task.sleep(for: .milliseconds(50))  // polling the relay, not synchronisation
            }
        }
        var port = serving.port
        if let counter { port = try await CountingProxy.start(to: serving.port, counter: counter) }
        let started = Date()
        let catching = try ServeProcess.startIsolated(
            database: directory + "/\(name).db", name: name, peers: relay == nil ? [port] : [], extra: extra + relayArguments
        )
        defer { catching.stop() }
        // Done when the target holds the source's rows (equal digests): the source's version vector also names the
        // roster records of the targets before, which a fresh node need not be able to claim.
        while try target.digest() != source.digest() {
            guard Date().timeIntervalSince(started) < 600 else { throw ServeError(message: "catch-up stalled") }
            try await Task.sleep(for: .milliseconds(20))  // sampling, not synchronisation
        }
        let seconds = Date().timeIntervalSince(started)
        return (seconds, await counter?.total ?? 0)
    }

    /// The bytes of the sealed change sets the relay at `data` stores (read with the `sqlite3` shell).
    private func storedBytes(_ data: String) throws -> Double {
        let process = Process()
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        process.arguments = [data + "/relay.sqlite", "SELECT coalesce(sum(bytes), 0) FROM ranges WHERE snapshot = 0"]
        process.standardOutput = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard let bytes = Double(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw ServeError(message: "could not read the relay's stored bytes: \(text)")
        }
        return bytes
    }
}
