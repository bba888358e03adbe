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
                throw ShoalError(code: .invalidArgument, message: "cannot read the stream: \(String(cString: strerror(errno)))")
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
