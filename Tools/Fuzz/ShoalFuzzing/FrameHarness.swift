import NIOCore
import NIOEmbedded
import ShoalCore
import ShoalProtocol
import ShoalTransport

extension ShoalFuzzing {
    /// Feeds the bytes (after the first) through `WireMessageDecoder` in a channel pipeline, in chunks whose
    /// sizes the first byte picks, then closes the input. The messages and the error must be those of decoding
    /// the same bytes in one piece: how TCP splits a stream changes nothing.
    public static func fuzzFrame(_ bytes: UnsafeRawBufferPointer) {
        guard let control = bytes.first else { return }
        let stream = UnsafeRawBufferPointer(rebasing: bytes.dropFirst())
        // A small maximum too, so that frames over it are cheap to make.
        let maximum = control & 0x80 != 0 ? 1024 : WireProtocol.defaultMaximumFrameLength

        // Reference: the whole stream in one buffer.
        var whole = ByteBuffer(bytes: stream)
        var expected: [[UInt8]] = []
        var expectedError: ShoalError?
        while true {
            do throws(ShoalError) {
                // The decoder holds a connection's first frame (the hello) to a smaller limit.
                let limit = expected.isEmpty ? min(maximum, WireProtocol.maximumHelloFrameLength) : maximum
                guard let message = try WireMessageDecoder.nextMessage(from: &whole, maximumFrameLength: limit)
                else { break }
                checkRoundTrip(message)
                expected.append(message.encoded())
            } catch {
                expectWireError(error, "the frame decoder")
                expectedError = error
                break
            }
        }
        let leftOver = expectedError == nil && whole.readableBytes > 0

        // The same bytes in chunks, through the channel handler.
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(WireMessageDecoder(maximumFrameLength: maximum)))
        var received: [[UInt8]] = []
        var failure: ShoalError?
        func drain() {
            while let message = try? channel.readInbound(as: WireMessage.self) { received.append(message.encoded()) }
        }
        func note(_ error: any Error) {
            guard let error = error as? ShoalError else { fatalError("the frame decoder threw \(error)") }
            expectWireError(error, "the frame decoder")
            if failure == nil { failure = error }
        }
        var offset = 0
        var step = UInt32(control & 0x7F) | 1
        while offset < stream.count, failure == nil {
            // Chunk sizes from 1 to 64 bytes, or everything left when the control byte's low bits are zero.
            step = step &* 1_103_515_245 &+ 12345
            let size = control & 0x7F == 0 ? stream.count - offset : min(stream.count - offset, Int(step >> 16 & 63) + 1)
            do {
                try channel.writeInbound(ByteBuffer(bytes: UnsafeRawBufferPointer(rebasing: stream[offset..<offset + size])))
            } catch {
                note(error)
            }
            drain()
            offset += size
        }
        if failure == nil {
            channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
            drain()
        }
        do {
            _ = try channel.finish(acceptAlreadyClosed: true)
        } catch {
            note(error)
        }
        drain()

        guard received == expected else {
            fatalError("chunked decoding gave \(received.count) messages, whole decoding \(expected.count)")
        }
        switch (expectedError, failure) {
        case (let expectedError?, let failure?):
            guard expectedError.code == failure.code else {
                fatalError("chunked decoding failed with \(failure), whole decoding with \(expectedError)")
            }
        case (nil, let failure?):
            guard leftOver, failure.code == .malformedMessage else {
                fatalError("chunked decoding failed with \(failure); whole decoding did not")
            }
        case (let expectedError?, nil):
            fatalError("whole decoding failed with \(expectedError); chunked decoding did not")
        case (nil, nil):
            guard !leftOver else { fatalError("a frame cut short at the end of the input went unreported") }
        }
    }
}
