import ShoalCore
import ShoalProtocol

/// The fuzzing harnesses: one entry point per target, each taking the fuzzer's bytes.
///
/// A harness never crashes on any input: bad input must come back as a typed ``ShoalError``. What a harness
/// checks beyond that (round trips, chunking, "a refused batch writes nothing") ends in `fatalError` with the
/// reason, which the fuzzer reports as a crash and keeps the input for. The entry points are plain library
/// code: `Tools/fuzz.sh` links them into a libFuzzer binary, and the corpus-replay test calls them directly.
public enum ShoalFuzzing {
    /// The fuzz targets, by the names `Tools/fuzz.sh` uses.
    public enum Target: String, CaseIterable, Sendable {
        /// The NIO frame decoder, fed in chunks, with the codec behind it.
        case frame
        /// One frame payload through the message codec.
        case codec
        /// The offline change stream (JSON lines) parser.
        case stream
        /// A change batch applied to a store: validation, merge and write.
        case apply
        /// A connection's first frame (at the hello limit) and the session's handshake with it.
        case hello
        /// The join exchange's messages, the member's welcome, roster records, invite codes.
        case join
    }

    /// Runs `target` on one input.
    public static func run(_ target: Target, _ bytes: UnsafeRawBufferPointer) {
        switch target {
        case .frame: fuzzFrame(bytes)
        case .codec: fuzzCodec(bytes)
        case .stream: fuzzStream(bytes)
        case .apply: fuzzApply(bytes)
        case .hello: fuzzHello(bytes)
        case .join: fuzzJoin(bytes)
        }
    }

    /// Runs `target` on one input held in an array.
    public static func run(_ target: Target, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { run(target, $0) }
    }

    /// Decodes the bytes as one frame payload; a decoded message must re-encode to bytes that decode to the
    /// same message, within the size bound batches are cut by. The same bytes go through the change batch body
    /// decoder too (``fuzzBatchBody(_:)``).
    public static func fuzzCodec(_ bytes: UnsafeRawBufferPointer) {
        fuzzBatchBody(Array(bytes))
        let message: WireMessage
        do throws(ShoalError) {
            message = try WireMessage.decode(Array(bytes))
        } catch {
            expectWireError(error, "the codec")
            return
        }
        checkRoundTrip(message)
    }

    /// Decodes the bytes as a change batch's body, as the relay's sealed change sets hold it
    /// (``ChangeBatch/init(decodingBody:)``): a decoded batch must re-encode to bytes that decode to the same batch.
    static func fuzzBatchBody(_ bytes: [UInt8]) {
        let batch: ChangeBatch
        do throws(ShoalError) {
            batch = try ChangeBatch(decodingBody: bytes)
        } catch {
            expectWireError(error, "the change batch body codec")
            return
        }
        let encoded = batch.encodedBody()
        let again: ChangeBatch
        do throws(ShoalError) {
            again = try ChangeBatch(decodingBody: encoded)
        } catch {
            fatalError("a decoded change batch body does not decode once re-encoded: \(error)")
        }
        guard again.encodedBody() == encoded else {
            fatalError("a decoded change batch body changes when re-encoded: \(batch) became \(again)")
        }
    }

    /// `encode(decode(encode(m))) == encode(m)`: the codec loses nothing it accepted. (Bytes, not messages,
    /// are compared: a NaN is not equal to itself.)
    static func checkRoundTrip(_ message: WireMessage) {
        let encoded = message.encoded()
        let again: WireMessage
        do throws(ShoalError) {
            again = try WireMessage.decode(encoded)
        } catch {
            fatalError("a decoded message does not decode once re-encoded: \(error)")
        }
        guard again.encoded() == encoded else {
            fatalError("a decoded message changes when re-encoded: \(message) became \(again)")
        }
        if case .changeBatch(let batch) = message, encoded.count > batch.maximumEncodedSize {
            fatalError("a change batch of \(encoded.count) bytes exceeds its bound of \(batch.maximumEncodedSize)")
        }
    }

    /// The errors a peer's bytes may cause.
    static func expectWireError(_ error: ShoalError, _ what: String) {
        switch error.code {
        case .malformedMessage, .unknownMessageType, .frameTooLarge: break
        default: fatalError("\(what) refused input with an unexpected error: \(error)")
        }
    }
}
