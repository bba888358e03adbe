import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Tells when a database file may have changed, so that another process's commit is noticed at once without polling.
///
/// On Linux it watches the file and its write-ahead log with inotify (every commit writes to one of them: the log in
/// WAL mode, the file itself otherwise) and wakes on each write; the node then asks SQLite whether another connection
/// committed (`PRAGMA data_version`), which costs one read. An idle database makes no wake-up at all but one safety
/// look every `safetyMilliseconds` (a watch that could not be set, a log file that came later). Where inotify is
/// missing, that look is the poll.
///
/// A write to the files comes before the commit is there to see: the writer makes its commit visible in the log's
/// index, in shared memory (no file event), after it wrote the log and, with `synchronous = FULL` (SQLite's default),
/// synced it. So each wake-up is followed by a few more (``followUpMilliseconds``), soon after and then further apart
/// (one cheap read each): a commit is seen within tens of milliseconds, or about as long after its writer's sync ended
/// when that took longer (a disk busy with other work can take seconds), not at the next safety look.
///
/// The watching runs on a thread of its own, which blocks in `poll(2)` (never on Swift's cooperative pool), and ends
/// when the stream's consumer goes away. That thread sets the watches after the stream was handed out, so the stream's
/// first element comes once they are set, whether anything was written or not: a commit made before is seen then.
final class DatabaseFileWatcher: Sendable {
    /// After a write to the files, the wake-ups that follow, each this long after the one before (a new write starts
    /// them again).
    static let followUpMilliseconds: [Int32] = [2, 8, 32, 128, 512, 1_024, 2_048, 4_096]

    private let path: String
    private let safetyMilliseconds: Int32
    private let stopped = Atomic<Bool>(false)

    /// A watcher of the database at `path`; without inotify, it wakes every `fallbackMilliseconds`.
    init(path: String, safetyMilliseconds: Int32 = 1_000, fallbackMilliseconds: Int32 = 20) {
        self.path = path
        #if os(Linux)
        self.safetyMilliseconds = safetyMilliseconds
        #else
        self.safetyMilliseconds = fallbackMilliseconds
        #endif
    }

    /// One element per wake-up (coalesced: a burst of writes is one element while the consumer is busy).
    func changes() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        continuation.onTermination = { _ in self.stopped.store(true, ordering: .relaxed) }
        let thread = Thread { self.watch(continuation) }
        thread.name = "shoal-file-watch"
        thread.start()
        return stream
    }

    private func watch(_ continuation: AsyncStream<Void>.Continuation) {
        defer { continuation.finish() }
        #if os(Linux)
        let descriptor = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        defer { if descriptor >= 0 { close(descriptor) } }
        var watched: Set<String> = []
        func addWatches() {
            guard descriptor >= 0 else { return }
            for file in [path, path + "-wal"] where !watched.contains(file) {
                let mask = UInt32(IN_MODIFY | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF | IN_ATTRIB)
                if inotify_add_watch(descriptor, file, mask) >= 0 { watched.insert(file) }
            }
        }
        addWatches()
        // A commit made before the watches were set sent no event to them (a node starts watching after its first
        // look, and an app may commit in between): look once now, and follow up as after a write.
        continuation.yield()
        var buffer = [UInt8](repeating: 0, count: 4096)
        var followUp: Int? = 0
        while !stopped.load(ordering: .relaxed) {
            var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let timeout = followUp.map { Self.followUpMilliseconds[$0] } ?? safetyMilliseconds
            let ready = descriptor >= 0 ? poll(&entry, 1, timeout) : poll(nil, 0, timeout)
            if ready > 0 {
                followUp = 0
                // Drain: the events themselves do not matter, only that a write happened. A file moved or removed
                // (the log deleted when the last other connection closed) is watched again when it is back.
                var removed = false
                while true {
                    let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
                    guard count > 0 else { break }
                    var offset = 0
                    while offset + MemoryLayout<inotify_event>.size <= count {
                        let event = buffer.withUnsafeBytes {
                            $0.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                        }
                        if event.mask & UInt32(IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF) != 0 { removed = true }
                        offset += MemoryLayout<inotify_event>.size + Int(event.len)
                    }
                }
                if removed { watched.removeAll() }
            } else if let step = followUp {
                followUp = step + 1 < Self.followUpMilliseconds.count ? step + 1 : nil
            } else {
                addWatches()
            }
            continuation.yield()
        }
        #else
        while !stopped.load(ordering: .relaxed) {
            usleep(useconds_t(safetyMilliseconds) * 1_000)
            continuation.yield()
        }
        #endif
    }
}
