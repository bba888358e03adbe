import NIOCore
import NIOEmbedded
import NIOTestUtils
import ShoalProcesses
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalTransport

private let siteA = SiteID(high: 0x0102_0304_0506_0708, low: 0x090A_0B0C_0D0E_0F10)
private let siteB = SiteID(high: 42, low: 7)

private func sampleChanges() -> [Change] {
    let values: [SQLValue] = [
        .null, .integer(-1), .integer(.max), .real(-0.0), .real(.infinity), .text("héllo"), .blob([0, 255]),
    ]
    var changes = values.enumerated().map { index, value in
        Change(
            table: index < 4 ? "items" : "notes",
            primaryKey: [.integer(Int64(index)), .text("k")],
            payload: .column("c\(index)", value),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(milliseconds: 1_700_000_000_000, logical: UInt16(index)), site: siteA, seq: 3),
            previous: index.isMultiple(of: 2) ? Dot(site: siteB, seq: 9) : nil
        )
    }
    changes.append(
        Change(
            table: "notes",
            primaryKey: [.blob([1, 2])],
            payload: .row,
            causalLength: 2,
            stamp: Stamp(hlc: HLC(rawValue: 5), site: siteB, seq: 1)
        )
    )
    changes.append(
        Change(
            table: "items",
            primaryKey: [.real(1.5)],
            payload: .counter("hits", increments: .max, decrements: 2),
            causalLength: 3,
            stamp: Stamp(hlc: HLC(rawValue: 6), site: siteB, seq: 2)
        )
    )
    return changes
}

private let messages: [WireMessage] = [
    .hello(
        Hello(
            clusterID: "lab",
            siteID: siteA,
            nodeName: "bench 1",
            schemaFingerprint: "items(id|name)",
            listenPort: 7_400
        )
    ),
    .syncRequest(SyncRequest(requestID: 7, versionVector: VersionVector([siteA: 3, siteB: 1]))),
    .changeBatch(
        ChangeBatchMessage(
            requestID: 7,
            isLast: true,
            batch: ChangeBatch(changes: sampleChanges(), claim: VersionVector([siteA: 3]))
        )
    ),
    .changeBatch(
        ChangeBatchMessage(
            requestID: 8,
            sequence: 3,
            isLast: false,
            estimatedRemaining: 12_345,
            batch: ChangeBatch(changes: [], claim: VersionVector())
        )
    ),
    .ack(Ack(requestID: 7, versionVector: VersionVector([siteB: 2]), digest: Array(repeating: 0xAB, count: 32))),
    .ack(Ack(requestID: 8, versionVector: VersionVector())),
    .ping(.max),
    .pong(0),
    .reject(Rejection(.clusterMismatch, "this node belongs to cluster \"lab\"")),
]

private func frameBuffer(_ message: WireMessage) -> ByteBuffer {
    var buffer = ByteBuffer()
    try! WireMessageEncoder.write(message, to: &buffer, maximumFrameLength: WireProtocol.defaultMaximumFrameLength)
    return buffer
}

private func decodeError(_ bytes: [UInt8], maximum: Int = 1024) -> ShoalError? {
    var buffer = ByteBuffer(bytes: bytes)
    do {
        _ = try WireMessageDecoder.nextMessage(from: &buffer, maximumFrameLength: maximum)
        return nil
    } catch {
        return error
    }
}

/// The frame decoder and encoder, and the codec through them.
@Suite struct WireFramingTests {
    @Test func everyMessageRoundTrips() throws {
        for message in messages {
            #expect(try WireMessage.decode(message.encoded()) == message)
        }
    }

    @Test func theDecoderHandlesAnyFragmentation() throws {
        let pairs = messages.map { (frameBuffer($0), [$0]) }
        try ByteToMessageDecoderVerifier.verifyDecoder(inputOutputPairs: pairs) { WireMessageDecoder() }
    }

    @Test func versionRangesNegotiateTheHighestCommonVersion() {
        #expect(WireProtocol.negotiate(1...3, 2...5) == 3)
        #expect(WireProtocol.negotiate(1...1, 1...1) == 1)
        #expect(WireProtocol.negotiate(1...1, 2...4) == nil)
    }

    @Test func anOversizedFrameIsRefusedFromItsHeaderAlone() {
        // Only the 4-byte length has arrived: the frame is refused before its body is buffered.
        #expect(decodeError([0x00, 0x10, 0x00, 0x01])?.code == .frameTooLarge)
        var big = ByteBuffer()
        let message = WireMessage.reject(Rejection(.other, String(repeating: "x", count: 2_000)))
        #expect(throws: ShoalError.self) { try WireMessageEncoder.write(message, to: &big, maximumFrameLength: 1024) }
    }

    @Test func theFirstFrameIsHeldToTheHelloLimitAndLaterOnesToTheMaximum() throws {
        // Before the hello, a stranger cannot make the node buffer a large frame: refused from its header.
        let first = EmbeddedChannel(handler: ByteToMessageHandler(WireMessageDecoder()))
        var header = ByteBuffer()
        header.writeInteger(UInt32(WireProtocol.maximumHelloFrameLength + 1))
        #expect(throws: ShoalError.self) { try first.writeInbound(header) }
        _ = try? first.finish()

        // After a first frame, frames up to the full maximum pass.
        let later = EmbeddedChannel(handler: ByteToMessageHandler(WireMessageDecoder()))
        let big = WireMessage.reject(Rejection(.other, String(repeating: "x", count: 200_000)))
        try later.writeInbound(frameBuffer(.ping(1)))
        try later.writeInbound(frameBuffer(big))
        #expect(try later.readInbound(as: WireMessage.self) == .ping(1))
        #expect(try later.readInbound(as: WireMessage.self) == big)
        _ = try later.finish()
    }

    @Test func malformedPayloadsGetTypedErrors() {
        #expect(decodeError([0, 0, 0, 1, 99])?.code == .unknownMessageType)
        #expect(decodeError([0, 0, 0, 0])?.code == .malformedMessage)
        // A ping with its nonce cut short, and one with a byte too many.
        #expect(decodeError([0, 0, 0, 5, 5, 1, 2, 3, 4])?.code == .malformedMessage)
        #expect(decodeError([0, 0, 0, 10, 5, 1, 2, 3, 4, 5, 6, 7, 8, 9])?.code == .malformedMessage)
        // A hello without the magic.
        #expect(decodeError([0, 0, 0, 5, 1, 0, 0, 0, 0])?.code == .malformedMessage)
        // A reject whose reason claims more bytes than the frame has, and one that is not UTF-8.
        #expect(decodeError([0, 0, 0, 5, 7, 0, 1, 0x7F, 0x41])?.code == .malformedMessage)
        #expect(decodeError([0, 0, 0, 6, 7, 0, 1, 2, 0xC3, 0x28])?.code == .malformedMessage)
        // A change batch announcing a billion changes in a few bytes is refused before anything is reserved.
        let billion = decodeError(
            [0, 0, 0, 22, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0x80, 0x94, 0xEB, 0xDC, 0x03])
        #expect(billion?.code == .malformedMessage)
        #expect(billion?.message.contains("1000000000 changes cannot fit") == true)
    }

    @Test func aPartialFrameAtEndOfStreamIsAnError() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(WireMessageDecoder()))
        var bytes = frameBuffer(.ping(1))
        bytes.moveWriterIndex(to: bytes.writerIndex - 2)
        try channel.writeInbound(bytes)
        #expect(try channel.readInbound(as: WireMessage.self) == nil)
        #expect(throws: ShoalError.self) { try channel.finish() }
    }

    @Test func randomCorruptionNeverCrashesTheDecoder() {
        // Seeded, and the seed printed, so a failure replays with SHOAL_TEST_SEED=<seed>.
        var random = SeededRandom.fromEnvironment(test: "randomCorruptionNeverCrashesTheDecoder")
        let valid = messages.map { Array(frameBuffer($0).readableBytesView) }
        var refused = 0
        for _ in 0..<5_000 {
            var bytes = valid.randomElement(using: &random)!
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                switch Int.random(in: 0..<3, using: &random) {
                case 0:
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                case 1: bytes.removeLast(Int.random(in: 0...min(3, bytes.count - 1), using: &random))
                default:
                    bytes.insert(
                        UInt8.random(in: 0...255, using: &random),
                        at: Int.random(in: 0...bytes.count, using: &random)
                    )
                }
            }
            var buffer = ByteBuffer(bytes: bytes)
            do {
                // Whatever decodes is a well-formed message: it survives a round trip unchanged.
                if let message = try WireMessageDecoder.nextMessage(from: &buffer, maximumFrameLength: 1 << 20) {
                    #expect(try WireMessage.decode(message.encoded()) == message)
                }
            } catch {
                refused += 1
            }
        }
        #expect(refused > 0)
    }
}
