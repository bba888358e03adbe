import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)

private func hello(_ site: SiteID, versions: ClosedRange<UInt16>) -> Hello {
    Hello(versions: versions, clusterID: "lab", siteID: site, nodeName: "n", schemaFingerprint: "t", listenPort: 0)
}

/// A batch of `count` rows holding JSON documents of a few KB each, and the documents' total size.
private func jsonBatch(_ count: Int, seed: UInt64 = 7) -> (ChangeBatchMessage, documentBytes: Int) {
    var generator = SplitMix(state: seed)
    var bytes = 0
    let changes = (0..<count).map { index in
        let document = JSONDocuments.document(index, &generator)
        bytes += document.utf8.count
        return Change(
            table: "docs",
            primaryKey: [.integer(Int64(index))],
            payload: .column("body", .text(document)),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: UInt64(index + 1) << 16), site: siteB, seq: UInt64(index + 1))
        )
    }
    let claim = VersionVector([siteB: UInt64(count)])
    return (ChangeBatchMessage(requestID: 1, isLast: true, batch: ChangeBatch(changes: changes, claim: claim)), bytes)
}

private func randomBytes(_ count: Int, seed: UInt64 = 3) -> [UInt8] {
    var generator = SplitMix(state: seed)
    return (0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
}

/// A compressed frame as a peer could forge it: any announced length, any stream.
private func forgedFrame(announcing length: UInt64, stream: [UInt8], method: UInt8 = 1) -> [UInt8] {
    var frame: [UInt8] = [13, method]
    frame.appendVarint(length)
    return frame + stream
}

/// A zlib stream of `input` (at the default level, no budget to speak of).
private func zlib(_ input: [UInt8]) -> [UInt8] {
    Deflate.compress(input[...], budget: input.count + 1024)!
}

@Suite struct CompressionTests {
    @Test func deflateRoundTripsAndRefusesWhatDoesNotPay() throws {
        let text = Array(String(repeating: "a sentence that repeats itself, ", count: 200).utf8)
        let compressed = try #require(Deflate.compress(text[...], budget: text.count))
        #expect(compressed.count < text.count / 10)
        #expect(try Deflate.decompress(compressed[...], length: text.count) == text)
        // Random bytes do not fit 90 % of themselves.
        let random = randomBytes(100_000)
        #expect(Deflate.compress(random[...], budget: random.count * 9 / 10) == nil)
        // A prefix comes first, inside the budget.
        let prefixed = try #require(Deflate.compress(text[...], prefix: [9, 8], budget: text.count))
        #expect(prefixed.prefix(2) == [9, 8] && prefixed.dropFirst(2).elementsEqual(compressed))
    }

    @Test func aBatchOfJSONRowsTravelsCompressedUnderFortyPercentAndDecodesTheSame() throws {
        let (message, documentBytes) = jsonBatch(300)
        let packed = WireMessage.changeBatch(message).packed(compressing: true)
        #expect(packed.isCompressed)
        #expect(packed.uncompressedCount == WireMessage.changeBatch(message).encoded().count)
        #expect(packed.uncompressedCount > documentBytes)
        #expect(Double(packed.payload.count) <= 0.4 * Double(packed.uncompressedCount), "\(packed.payload.count)")
        #expect(try WireMessage.decode(packed.payload) == .changeBatch(message))
        // Not compressing: the plain encoding, the same bytes a peer of any version reads.
        let plain = WireMessage.changeBatch(message).packed(compressing: false)
        #expect(!plain.isCompressed && plain.payload == WireMessage.changeBatch(message).encoded())
    }

    @Test func randomBytesAreSentAsTheyAre() throws {
        // An already-compressed BLOB: a value piece of random bytes, large enough to be sampled first, and a small one.
        for count in [4_000, 1 << 20] {
            let piece = WireMessage.valuePiece(
                ValuePiece(requestID: 1, sequence: 0, change: 0, totalLength: UInt64(count), offset: 0, bytes: randomBytes(count))
            )
            let packed = piece.packed(compressing: true)
            #expect(!packed.isCompressed)
            #expect(packed.payload == piece.encoded() && packed.uncompressedCount == packed.payload.count)
        }
        // Messages other than batches and pieces are never compressed, nor are small ones.
        let ack = WireMessage.ack(Ack(requestID: 1, versionVector: VersionVector(), digest: Array(repeating: 0, count: 64)))
        #expect(!ack.packed(compressing: true).isCompressed)
        #expect(!WireMessage.changeBatch(jsonBatch(0).0).packed(compressing: true).isCompressed)
    }

    @Test func aBombIsRefusedWithinTheAnnouncedLengthAndTheFrameMaximum() throws {
        // 64 MiB of one byte deflate to under 1 % of that; announced as 1 KB, as 16 MiB, and as more than the maximum.
        let zeros = zlib(Array(repeating: 0x7B, count: 64 << 20))
        #expect(zeros.count < (64 << 20) / 100)
        for announced: UInt64 in [1024, UInt64(WireProtocol.defaultMaximumFrameLength)] {
            let error = #expect(throws: ShoalError.self) {
                try WireMessage.decode(forgedFrame(announcing: announced, stream: zeros))
            }
            #expect(error?.code == .malformedMessage && error?.message.contains("more than") == true)
        }
        let over = #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: 64 << 20, stream: zeros))
        }
        #expect(over?.code == .frameTooLarge)
        // A smaller maximum (the hello's, a node's own) holds as well.
        let small = #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: 100_000, stream: zeros), maximumInflatedLength: 65_536)
        }
        #expect(small?.code == .frameTooLarge)
    }

    @Test func everyCutAndDamageOfACompressedFrameIsATypedRefusal() throws {
        let (message, _) = jsonBatch(20)
        let frame = WireMessage.changeBatch(message).packed(compressing: true).payload
        #expect(frame.first == 13)
        for length in 0..<frame.count {
            let cut = Array(frame.prefix(length))
            guard !cut.isEmpty else { continue }
            let error = #expect(throws: ShoalError.self) { try WireMessage.decode(cut) }
            #expect(error?.code == .malformedMessage, "cut at \(length): \(String(describing: error))")
        }
        var generator = SplitMix(state: 11)
        for _ in 0..<500 {
            var damaged = frame
            let position = 3 + Int(generator.next() % UInt64(frame.count - 3))
            damaged[position] ^= UInt8(truncatingIfNeeded: generator.next() | 1)
            do {
                // A flip the checksum misses can only give some message that still decodes; anything else is typed.
                _ = try WireMessage.decode(damaged)
            } catch {
                #expect([.malformedMessage, .unknownMessageType, .frameTooLarge].contains(error.code))
            }
        }
        // Trailing bytes after the stream, an announced length that is short by one, an unknown method.
        #expect(throws: ShoalError.self) { try WireMessage.decode(frame + [0]) }
        let encoding = WireMessage.changeBatch(message).encoded()
        let stream = zlib(encoding)
        #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: UInt64(encoding.count - 1), stream: stream))
        }
        #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: UInt64(encoding.count + 1), stream: stream))
        }
        #expect(try WireMessage.decode(forgedFrame(announcing: UInt64(encoding.count), stream: stream)) == .changeBatch(message))
        #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: UInt64(encoding.count), stream: stream, method: 2))
        }
    }

    @Test func aCompressedFrameHoldsOnlyABatchOrAPiece() throws {
        let inner: [WireMessage] = [
            .hello(hello(siteB, versions: 1...6)),
            .ping(7),
            .reject(Rejection(.other, String(repeating: "x", count: 2_000))),
        ]
        for message in inner {
            let encoding = message.encoded()
            let error = #expect(throws: ShoalError.self) {
                try WireMessage.decode(forgedFrame(announcing: UInt64(encoding.count), stream: zlib(encoding)))
            }
            #expect(error?.code == .malformedMessage)
        }
        // Nor another compressed frame.
        let frame = WireMessage.changeBatch(jsonBatch(20).0).packed(compressing: true).payload
        let nested = #expect(throws: ShoalError.self) {
            try WireMessage.decode(forgedFrame(announcing: UInt64(frame.count), stream: zlib(frame)))
        }
        #expect(nested?.code == .malformedMessage)
    }

    /// A node compresses only on a link that negotiated version 6 (a peer of version 5 gets the plain encoding), and
    /// only with compression on; the receiving session takes what an in-memory stream hands over as it was sent.
    @Test func compressionIsNegotiatedAndTheSessionDecodesWhatItReceives() throws {
        let (message, _) = jsonBatch(50)
        func established(peer versions: ClosedRange<UInt16>, compression: Bool = true) -> SyncSession {
            var configuration = SyncSession.Configuration()
            configuration.compression = compression
            var session = SyncSession(
                local: hello(siteA, versions: 1...WireProtocol.maximumVersion),
                configuration: configuration,
                now: 0
            )
            _ = session.start()
            _ = session.receive(.hello(hello(siteB, versions: versions)), now: 0)
            return session
        }
        #expect(WireProtocol.maximumVersion >= WireProtocol.compressionVersion)
        #expect(established(peer: 1...6).packed(.changeBatch(message)).isCompressed)
        #expect(!established(peer: 1...5).packed(.changeBatch(message)).isCompressed)
        #expect(!established(peer: 1...6, compression: false).packed(.changeBatch(message)).isCompressed)

        var receiver = established(peer: 1...6)
        var sent = message
        sent.requestID = 1
        _ = receiver.startRound(versionVector: VersionVector(), now: 0)
        let frame = established(peer: 1...6).packed(.changeBatch(sent))
        #expect(receiver.receive(.encoded(frame), now: 1) == [.apply(sent)])
        // A frame that does not decode is refused as the codec would.
        var other = established(peer: 1...6)
        _ = other.startRound(versionVector: VersionVector(), now: 0)
        let cut = EncodedMessage(payload: Array(frame.payload.dropLast(4)), uncompressedCount: frame.uncompressedCount)
        let refused = other.receive(.encoded(cut), now: 1)
        guard case .send(.reject(let rejection)) = refused.first else {
            Issue.record("expected a refusal, got \(refused)")
            return
        }
        #expect(rejection.reason == .malformedMessage)
    }
}
