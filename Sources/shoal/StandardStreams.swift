import Foundation
import Shoal

/// Raw reads and writes on file descriptors, for streams of any size.
enum StandardStreams {
    /// Writes all of `bytes` to stdout.
    static func write(_ bytes: [UInt8]) throws(ShoalError) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Foundation.write(1, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                throw ShoalError(
                    code: .invalidArgument,
                    message: "cannot write the stream to stdout: \(String(cString: strerror(errno)))"
                )
            }
            offset += written
        }
    }

    /// Reads `descriptor` to its end, handing each line (without its newline) to `body` as it arrives.
    static func readLines(
        _ descriptor: Int32,
        _ body: (UnsafeBufferPointer<UInt8>) throws(ShoalError) -> Void
    ) throws(ShoalError) {
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var filled = 0
        while true {
            if filled == buffer.count { buffer.append(contentsOf: [UInt8](repeating: 0, count: buffer.count)) }
            let count = buffer[filled...].withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw ShoalError(
                    code: .invalidArgument,
                    message: "cannot read the stream: \(String(cString: strerror(errno)))"
                )
            }
            let scanFrom = filled
            filled += count
            var consumed = 0
            try buffer.withUnsafeBufferPointer { (all) throws(ShoalError) in
                var index = scanFrom
                while index < filled {
                    if all[index] == 0x0A {
                        try body(UnsafeBufferPointer(rebasing: all[consumed..<index]))
                        consumed = index + 1
                    }
                    index += 1
                }
                if count == 0, consumed < filled {
                    // The last line has no newline.
                    try body(UnsafeBufferPointer(rebasing: all[consumed..<filled]))
                    consumed = filled
                }
            }
            if consumed > 0 {
                buffer.withUnsafeMutableBufferPointer { all in
                    let rest = filled - consumed
                    if rest > 0 {
                        memmove(all.baseAddress!, all.baseAddress! + consumed, rest)
                    }
                }
                filled -= consumed
            }
            if count == 0 { return }
        }
    }
}

/// Hands a change stream from a reading thread to the applying one, a bounded number of chunks at a time.
///
/// `@unchecked Sendable`: every access to `items` and `closed` holds `condition`.
final class StreamChunks: @unchecked Sendable {
    enum Item {
        case start(site: SiteID, since: VersionVector, claim: VersionVector, schema: String?, heads: [Stamp])
        case chunk([Change])
        case end
        case failure(ShoalError)
    }

    private let condition = NSCondition()
    private var items: [Item] = []
    private var closed = false
    private let capacity = 4

    /// Reads and parses `descriptor` on a thread of its own, handing over about `chunkSize` changes at a time.
    static func reading(_ descriptor: Int32, chunkSize: Int = 20_000) -> StreamChunks {
        let chunks = StreamChunks()
        let thread = Thread {
            var parser = ChangeStream.Parser()
            var started = false
            do throws(ShoalError) {
                try StandardStreams.readLines(descriptor) { (line) throws(ShoalError) in
                    try parser.consume(line: line)
                    if !started, let start = parser.start {
                        started = true
                        chunks.put(
                            .start(
                                site: start.site,
                                since: start.since,
                                claim: start.claim,
                                schema: parser.schema,
                                heads: parser.heads
                            )
                        )
                    }
                    if parser.pendingCount >= chunkSize { chunks.put(.chunk(parser.takeChanges())) }
                }
                let contents = try parser.finish()
                if !started {
                    chunks.put(
                        .start(
                            site: contents.site,
                            since: contents.since,
                            claim: contents.claim,
                            schema: contents.schema,
                            heads: parser.heads
                        )
                    )
                }
                chunks.put(.chunk(contents.changes))
                chunks.put(.end)
            } catch {
                chunks.put(.failure(error))
            }
        }
        thread.start()
        return chunks
    }

    func put(_ item: Item) {
        condition.lock()
        defer { condition.unlock() }
        while items.count >= capacity && !closed { condition.wait() }
        guard !closed else { return }
        items.append(item)
        condition.broadcast()
    }

    func take() -> Item {
        condition.lock()
        defer { condition.unlock() }
        while items.isEmpty { condition.wait() }
        condition.broadcast()
        return items.removeFirst()
    }

    /// Stops accepting items (the reader's `put` returns at once), when the applying side gives up.
    func close() {
        condition.lock()
        closed = true
        condition.broadcast()
        condition.unlock()
    }
}
