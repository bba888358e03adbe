import Foundation
import ServiceLifecycle
import Shoal

/// `shoal serve --apply-log FILE` (for `shoal demo`): one line appended per change set this node applies from
/// another node, timed here, in-process, from the node's own commit notifications (its change feed): `SITE SEQ
/// ORIGIN_MS APPLIED_MS`, the dot, its origin's clock (the commit there, in wall milliseconds) and the wall time the
/// apply here was seen committed. The demo reads the nodes' files for the propagation figure it prints, which is
/// thus measured apart from the dashboard's (the demo's own follower of every node's file).
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
                let line = "\(set.dot.site.hex) \(set.dot.seq) \(set.hlc.milliseconds) \(now)\n"
                try? file.write(contentsOf: Data(line.utf8))
            }
        }
    }

    /// One line of a log: the change set's origin and sequence number, its origin's clock and when it was applied.
    struct Entry: Hashable {
        var site: String
        var seq: UInt64
        var originMs: UInt64
        var appliedMs: UInt64

        /// The entries of the file at `path` (none if it is missing; a torn last line is skipped).
        static func read(_ path: String) -> [Entry] {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
            return text.split(separator: "\n").compactMap { line in
                let fields = line.split(separator: " ")
                guard fields.count == 4, let seq = UInt64(fields[1]), let origin = UInt64(fields[2]),
                    let applied = UInt64(fields[3])
                else { return nil }
                return Entry(site: String(fields[0]), seq: seq, originMs: origin, appliedMs: applied)
            }
        }
    }
}
