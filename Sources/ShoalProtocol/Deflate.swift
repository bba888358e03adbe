import CZlib
import ShoalCore

/// zlib's deflate (RFC 1950 streams: a 2-byte header, the deflate data, an Adler-32 of what it holds), the one
/// compression of Shoal's wire frames and of the change sets it seals for the relay.
///
/// Compression gives up as soon as its output passes a budget, so incompressible input (an already-compressed
/// BLOB) costs at most one pass and is then sent as it is. Decompression is bounded: it never produces more than the
/// length announced beside the stream (which the caller has checked against its own limit), so a decompression bomb
/// or a corrupt or cut stream ends in a ``ShoalError`` (`.malformedMessage`), never in unbounded memory.
public enum Deflate {
    /// The level new streams are made at: zlib's fastest, which keeps a LAN catch-up no slower than sending the
    /// bytes as they are (JSON-like text still comes out at about a quarter of its size).
    public static let defaultLevel: Int32 = 1

    /// `prefix` followed by `input` compressed at `level`, or `nil` when that would take more than `budget` bytes in
    /// all (found out as soon as the output passes the budget, not after compressing everything).
    public static func compress(
        _ input: ArraySlice<UInt8>,
        level: Int32 = defaultLevel,
        prefix: [UInt8] = [],
        budget: Int
    ) -> [UInt8]? {
        let room = budget - prefix.count
        guard room > 0, input.count < Int(UInt32.max) else { return nil }
        var stream = z_stream()
        guard shoal_deflate_init(&stream, level) == Z_OK else { return nil }
        defer { deflateEnd(&stream) }
        var finished = false
        let output = [UInt8](unsafeUninitializedCapacity: budget) { buffer, count in
            for (index, byte) in prefix.enumerated() { buffer.initializeElement(at: index, to: byte) }
            count = prefix.count
            input.withUnsafeBufferPointer { source in
                stream.next_in = UnsafeMutablePointer(mutating: source.baseAddress)
                stream.avail_in = UInt32(source.count)
                stream.next_out = buffer.baseAddress! + prefix.count
                stream.avail_out = UInt32(room)
                // One call: with all the input and a fixed output room, Z_FINISH either ends the stream or stops when
                // the room is full (Z_OK or Z_BUF_ERROR), which means it does not pay.
                finished = deflate(&stream, Z_FINISH) == Z_STREAM_END
            }
            // zlib wrote these bytes (initialized them) before reporting them.
            if finished { count = prefix.count + Int(stream.total_out) }
        }
        return finished ? output : nil
    }

    /// `input`, a whole zlib stream, decompressed: exactly `length` bytes, or a ``ShoalError`` (`.malformedMessage`)
    /// when the stream is corrupt, cut short, holds more or fewer bytes than `length`, or is followed by other bytes.
    /// Memory grows with what the stream really produces (never past `length`), not with what it announces.
    public static func decompress(_ input: ArraySlice<UInt8>, length: Int) throws(ShoalError) -> [UInt8] {
        func malformed(_ detail: String) -> ShoalError {
            ShoalError(code: .malformedMessage, message: "malformed message: a compressed payload \(detail)")
        }
        guard length > 0, input.count < Int(UInt32.max) else { throw malformed("announces \(length) bytes") }
        var stream = z_stream()
        guard shoal_inflate_init(&stream) == Z_OK else { throw malformed("could not be opened (zlib)") }
        defer { inflateEnd(&stream) }
        // One byte beyond the announced length, so that a stream holding more is caught rather than cut.
        let capacity = length + 1
        var output = [UInt8](repeating: 0, count: min(capacity, 1 << 20))
        var failure: String?
        input.withUnsafeBufferPointer { source in
            stream.next_in = UnsafeMutablePointer(mutating: source.baseAddress)
            stream.avail_in = UInt32(source.count)
            while true {
                let produced = Int(stream.total_out)
                if produced == output.count {
                    guard output.count < capacity else {
                        failure = "holds more than the \(length) bytes it announces"
                        return
                    }
                    // Doubling, up to the announced length: a bomb stops at the length, a lie about it costs only
                    // what the stream really produced.
                    output.append(contentsOf: repeatElement(0, count: min(capacity, output.count * 2) - output.count))
                }
                let status = output.withUnsafeMutableBufferPointer { buffer in
                    stream.next_out = buffer.baseAddress! + produced
                    stream.avail_out = UInt32(buffer.count - produced)
                    return inflate(&stream, Z_NO_FLUSH)
                }
                switch status {
                case Z_STREAM_END:
                    if stream.avail_in != 0 { failure = "is followed by \(stream.avail_in) other bytes" }
                    return
                case Z_OK:
                    continue
                case Z_BUF_ERROR where stream.avail_in == 0:
                    failure = "is cut short"
                    return
                case Z_BUF_ERROR:
                    continue
                default:
                    failure = "is corrupt (\(stream.msg.map { String(cString: $0) } ?? "zlib error \(status)"))"
                    return
                }
            }
        }
        if let failure { throw malformed(failure) }
        let produced = Int(stream.total_out)
        guard produced == length else {
            throw malformed(
                produced > length
                    ? "holds more than the \(length) bytes it announces"
                    : "holds \(produced) bytes, not the \(length) it announces"
            )
        }
        output.removeLast(output.count - produced)
        return output
    }
}
