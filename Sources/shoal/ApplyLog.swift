import Foundation
import ServiceLifecycle
import Shoal

/// `shoal serve --apply-log FILE` (for `shoal demo`): one line appended per change set this node applies from
/// another node, timed here, in-process, from the node's own commit notifications (its change feed): `SITE SEQ
/// ORIGIN_MS APPLIED_MS KIND`, the dot, its origin's clock (the commit there, in wall milliseconds), the wall time
/// the apply here was seen committed, and `app` when the change set wrote an app's table or `shoal` when it wrote
/// only Shoal's own (member reports, the roster). The demo reads the nodes' files for the propagation figures it
/// prints and its dashboard shows: the nodes' own timing, the one measurement both report.
struct ApplyLog: Service {
    let node: ShoalNode
    let path: String

    func run() async throws {
        let files = FileManager.default
        guard files.fileExists(atPath: path) || files.createFile(atPath: path, contents: nil),
            let file = FileHandle(forWritingAtPath: path)
        else {
            throw ShoalError(code: .invalidArgument, message: "--apply-log: cannot write \(path)")
        }
        defer { try? file.close() }
        _ = try? file.seekToEnd()
        let start = (try? await node.store.versionVector()) ?? VersionVector()
        try? await cancelWhenGracefulShutdown {
            for try await set in node.changes(after: ChangeFeedCursor(start)) where !set.isLocal {
                let now = SystemWallClock().nowMilliseconds()
                let kind = set.rows.contains { !Store.isShoalTable($0.table) } ? "app" : "shoal"
                let line = "\(set.dot.site.hex) \(set.dot.seq) \(set.hlc.milliseconds) \(now) \(kind)\n"
                try? file.write(contentsOf: Data(line.utf8))
            }
        }
    }

    /// One line of a log: the change set's origin and sequence number, its origin's clock, when it was applied, and
    /// whether it wrote an app's table.
    struct Entry: Hashable {
        var site: String
        var seq: UInt64
        var originMs: UInt64
        var appliedMs: UInt64
        var isApp: Bool

        /// The entry a line holds, or nil for one that is not an entry.
        init?(line: Substring) {
            let fields = line.split(separator: " ")
            guard fields.count == 5, let seq = UInt64(fields[1]), let origin = UInt64(fields[2]),
                let applied = UInt64(fields[3])
            else { return nil }
            self.site = String(fields[0])
            self.seq = seq
            self.originMs = origin
            self.appliedMs = applied
            self.isApp = fields[4] == "app"
        }
    }

    /// Reads a log as it grows: each call returns the entries of the lines completed since the last one.
    struct Tail {
        let path: String
        private var offset: UInt64 = 0

        init(_ path: String) {
            self.path = path
        }

        /// The entries of the whole lines appended since the last call (none while the file is missing).
        mutating func next() -> [Entry] {
            guard let file = FileHandle(forReadingAtPath: path) else { return [] }
            defer { try? file.close() }
            guard (try? file.seek(toOffset: offset)) != nil, let data = try? file.readToEnd(),
                let end = data.lastIndex(of: UInt8(ascii: "\n"))
            else { return [] }
            let whole = data[data.startIndex...end]
            offset += UInt64(whole.count)
            return String(decoding: whole, as: UTF8.self).split(separator: "\n").compactMap(Entry.init(line:))
        }
    }
}
