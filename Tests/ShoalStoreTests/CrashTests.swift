import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

@Suite struct CrashTests {
    @Test func applyKilledAtRandomPointsIsAllOrNothingAndResumes() throws {
        let directory = try temporaryDirectory("crash")
        defer { try? FileManager.default.removeItem(at: directory) }
        let rowCount = 2_000

        // A source database with one large transaction and some later ones.
        let source = try Store(path: directory.appendingPathComponent("source.db").path)
        try makeItems(source)
        let insert = try source.prepare("INSERT INTO items(id, name, qty, hits) VALUES (?, ?, ?, ?)")
        try source.transaction {
            for id in 0..<rowCount {
                try insert.execute([.integer(Int64(id)), .text("item \(id)"), .integer(Int64(id % 7)), .integer(1)])
            }
        }
        try source.execute("UPDATE items SET qty = qty + 1 WHERE id % 3 = 0")
        try source.execute("DELETE FROM items WHERE id % 10 = 0")
        let sourceDigest = try source.digest()
        let batches = try source.changes(since: VersionVector())
        let claim = batches.last!.claim
        var lines = [ChangeStream.headerLine(.init(site: source.siteID, since: VersionVector(), claim: claim))]
        let changes = batches.flatMap(\.changes)
        lines += changes.map(ChangeStream.line(for:))
        lines.append(ChangeStream.trailerLine(count: changes.count))
        let streamFile = directory.appendingPathComponent("stream.jsonl")
        try lines.joined(separator: "\n").write(to: streamFile, atomically: true, encoding: .utf8)

        let template = directory.appendingPathComponent("template.db")
        do {
            let target = try Store(path: template.path)
            try makeItems(target)
        }
        let executable = try shoalExecutable()
        /// Starts `shoal apply` and returns once it has parsed the stream and begun writing.
        func startApply(_ database: URL) throws -> Process {
            try? FileManager.default.removeItem(at: database)
            try FileManager.default.copyItem(at: template, to: database)
            let process = Process()
            process.executableURL = executable
            process.arguments = ["apply", "--db", database.path, streamFile.path]
            process.standardOutput = FileHandle.nullDevice
            let announcements = Pipe()
            process.standardError = announcements
            try process.run()
            var said = Data()
            while !String(decoding: said, as: UTF8.self).contains("applying") {
                let chunk = announcements.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                said.append(chunk)
            }
            return process
        }

        // One undisturbed run: it succeeds, and tells how long an apply takes here.
        let baseline = directory.appendingPathComponent("baseline.db")
        let full = try startApply(baseline)
        let started = Date()
        full.waitUntilExit()
        let duration = Date().timeIntervalSince(started)
        #expect(full.terminationStatus == 0)
        #expect(try Store(path: baseline.path).digest() == sourceDigest)

        var kills = 0
        var applied = 0
        var attempts = 0
        // The window the kill falls in. One timed run says little on a shared machine (a first run pays for cold
        // caches, a later one for a neighbour's build): each run that finishes before its kill narrows it.
        var window = duration * 0.95
        while kills < 50 && attempts < 150 {
            attempts += 1
            let database = directory.appendingPathComponent("victim.db")
            let process = try startApply(database)
            // The random point of failure: somewhere inside the write phase.
            usleep(useconds_t(Double.random(in: 0...window) * 1_000_000))
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            guard process.terminationReason == .uncaughtSignal else {
                // Finished first: complete, as the undisturbed run was.
                #expect(process.terminationStatus == 0)
                #expect(try Store(path: database.path).digest() == sourceDigest)
                window *= 0.7
                continue
            }
            kills += 1

            let store = try Store(path: database.path)
            #expect(try store.connection.scalar("PRAGMA integrity_check") == .text("ok"))
            let present = try store.execute("SELECT count(*) FROM items").rows[0][0]
            let vector = try store.versionVector()
            if vector[source.siteID] == 0 {
                #expect(present == .integer(0), "a killed apply left rows without its version")
            } else {
                applied += 1
                #expect(vector == claim, "the version vector must match the data")
                #expect(try store.digest() == sourceDigest, "a committed apply must be complete")
            }
            // Applying again completes, whatever the kill left.
            let report = try store.apply(changes, claim: claim, since: VersionVector())
            #expect(report.applied + report.alreadyKnown == changes.count)
            #expect(try store.digest() == sourceDigest)
            #expect(try store.versionVector() == claim)
        }
        #expect(kills >= 50, "only \(kills) of \(attempts) runs were killed before they finished")
        print("crash test: \(kills) kills, \(applied) after the commit, \(kills - applied) before it")
    }
}
