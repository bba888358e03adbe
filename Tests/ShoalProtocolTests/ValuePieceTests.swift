import Testing

@testable import ShoalCore
@testable import ShoalProtocol

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)

private func hello(_ site: SiteID, versions: ClosedRange<UInt16> = 1...2) -> Hello {
    Hello(versions: versions, clusterID: "lab", siteID: site, nodeName: "n", schemaFingerprint: "t", listenPort: 0)
}

private func change(_ key: Int64, _ value: SQLValue, seq: UInt64 = 1) -> Change {
    Change(
        table: "t",
        primaryKey: [.integer(key)],
        payload: .column("v", value),
        causalLength: 1,
        stamp: Stamp(hlc: HLC(rawValue: 1 << 20), site: siteB, seq: seq)
    )
}

/// A session of `siteA` established with `siteB` (version 2) and pulling (request 1).
private func pullingSession(maximumValueBytes: Int = WireProtocol.maximumValueBytes) -> SyncSession {
    var configuration = SyncSession.Configuration()
    configuration.maximumValueBytes = maximumValueBytes
    var session = SyncSession(local: hello(siteA), configuration: configuration, now: 0)
    _ = session.start()
    _ = session.receive(.hello(hello(siteB)), now: 0)
    _ = session.startRound(versionVector: VersionVector(), now: 0)
    return session
}

/// Everything a sender puts on the wire for `message`, through the codec (as bytes would travel).
private func wire(_ message: ChangeBatchMessage, inlineLimit: Int, pieceBytes: Int) throws -> [WireMessage] {
    let prepared = try SyncSession.outgoing(message, version: 2, inlineLimit: inlineLimit)
    var messages: [WireMessage] = []
    for (index, encoded) in prepared.pieced {
        for piece in SyncSession.pieces(
            requestID: message.requestID,
            sequence: message.sequence,
            change: index,
            of: encoded,
            pieceBytes: pieceBytes
        ) {
            messages.append(piece)
        }
    }
    messages.append(.changeBatch(prepared.message))
    return try messages.map { try WireMessage.decode($0.encoded()) }
}

private func refusal(_ actions: [SyncSession.Action]) -> Rejection.Reason? {
    for case .send(.reject(let rejection)) in actions { return rejection.reason }
    return nil
}

@Suite struct ValuePieceTests {
    @Test func largeValuesTravelInPiecesAndComeBackExact() throws {
        var random = SystemRandomNumberGenerator()
        let big = SQLValue.blob((0..<300_000).map { _ in UInt8.random(in: 0...255, using: &random) })
        let text = SQLValue.text(String(repeating: "é€x", count: 40_000))
        let changes = [change(1, .integer(7)), change(2, big), change(3, .text("small")), change(4, text)]
        var claim = VersionVector()
        claim.advance(siteB, to: 1)
        let message = ChangeBatchMessage(
            requestID: 1,
            isLast: true,
            batch: ChangeBatch(changes: changes, claim: claim)
        )
        let sent = try wire(message, inlineLimit: 1_000, pieceBytes: 65_536)
        // 300,011 bytes in 5 pieces, 240,011 in 4, then the batch.
        #expect(sent.count == 5 + 4 + 1)
        for case .valuePiece(let piece) in sent { #expect(piece.bytes.count <= 65_536) }
        guard case .changeBatch(let batch) = sent.last else {
            Issue.record("the batch comes last")
            return
        }
        #expect(batch.piecedValues == [1, 3])
        #expect(batch.maximumEncodedSize >= WireMessage.changeBatch(batch).encoded().count)
        #expect(WireMessage.changeBatch(batch).encoded().count < 1_000)

        var session = pullingSession()
        var applied: ChangeBatchMessage?
        for message in sent {
            for case .apply(let batch) in session.receive(message, now: 1) { applied = batch }
        }
        #expect(applied?.batch.changes == changes)
        #expect(applied?.piecedValues == [])
        #expect(applied?.batch.claim == claim)
    }

    @Test func aVersionOnePeerGetsValuesInline() throws {
        let message = ChangeBatchMessage(
            requestID: 1,
            isLast: true,
            batch: ChangeBatch(changes: [change(1, .blob(Array(repeating: 9, count: 5_000)))], claim: VersionVector())
        )
        let prepared = try SyncSession.outgoing(message, version: 1, inlineLimit: 1_000)
        #expect(prepared.pieced.isEmpty && prepared.message == message)
    }

    @Test func aValueOverTheMaximumCannotBeSentAndSaysWhy() {
        let message = ChangeBatchMessage(
            requestID: 1,
            isLast: true,
            batch: ChangeBatch(changes: [change(1, .blob(Array(repeating: 1, count: 10_000)))], claim: VersionVector())
        )
        #expect {
            try SyncSession.outgoing(message, version: 2, inlineLimit: 1_000, maximumValueBytes: 5_000)
        } throws: { error in
            let error = error as? ShoalError
            return error?.code == .frameTooLarge && error?.message.contains("cannot be sent") == true
        }
    }

    @Test func theReceiverRefusesAValueBeyondItsMaximumBeforeBufferingIt() {
        var session = pullingSession(maximumValueBytes: 1_000)
        let piece = ValuePiece(requestID: 1, sequence: 0, change: 0, totalLength: 1 << 40, offset: 0, bytes: [4])
        #expect(refusal(session.receive(.valuePiece(piece), now: 1)) == .valueTooLarge)
        #expect(session.phase == .closed)
    }

    @Test func piecesOutOfOrderOrIncompleteAreRefused() {
        let first = ValuePiece(requestID: 1, sequence: 0, change: 0, totalLength: 10, offset: 0, bytes: [4, 8, 1, 2])
        // A gap.
        var session = pullingSession()
        #expect(session.receive(.valuePiece(first), now: 1).isEmpty)
        var gap = first
        gap.offset = 6
        #expect(refusal(session.receive(.valuePiece(gap), now: 1)) == .malformedMessage)
        // A piece for another request or batch.
        session = pullingSession()
        var stray = first
        stray.sequence = 3
        #expect(refusal(session.receive(.valuePiece(stray), now: 1)) == .malformedMessage)
        // The batch before the value is whole.
        session = pullingSession()
        _ = session.receive(.valuePiece(first), now: 1)
        let batch = ChangeBatchMessage(
            requestID: 1,
            isLast: true,
            batch: ChangeBatch(changes: [change(1, .null)], claim: VersionVector()),
            piecedValues: [0]
        )
        #expect(refusal(session.receive(.changeBatch(batch), now: 1)) == .malformedMessage)
        // A batch announcing a value in pieces that never came.
        session = pullingSession()
        #expect(refusal(session.receive(.changeBatch(batch), now: 1)) == .malformedMessage)
        // Pieces that do not form one value (a blob claiming 8 bytes, holding 2).
        session = pullingSession()
        let bad = ValuePiece(requestID: 1, sequence: 0, change: 0, totalLength: 4, offset: 0, bytes: [4, 8, 1, 2])
        _ = session.receive(.valuePiece(bad), now: 1)
        #expect(refusal(session.receive(.changeBatch(batch), now: 1)) == .malformedMessage)
    }

    @Test func reassembledEncodingsDecodeToExactlyOneValue() {
        #expect(SyncSession.decodeWhole([4, 0]) == .blob([]))
        #expect(SyncSession.decodeWhole([4, 2, 7, 9]) == .blob([7, 9]))
        #expect(SyncSession.decodeWhole([4, 0x80, 0x01] + Array(repeating: 5, count: 128)) == .blob(Array(repeating: 5, count: 128)))
        #expect(SyncSession.decodeWhole([3, 2, 0x68, 0x69]) == .text("hi"))
        #expect(SyncSession.decodeWhole([4]) == nil)
        #expect(SyncSession.decodeWhole([4, 3, 1]) == nil)
        #expect(SyncSession.decodeWhole([4, 1, 1, 1]) == nil)
        #expect(SyncSession.decodeWhole([4, 0x80]) == nil)
        #expect(SyncSession.decodeWhole([9, 1]) == nil)
    }

    @Test func valuePiecesAndPiecedChangesRoundTripThroughTheCodec() throws {
        let piece = ValuePiece(requestID: 9, sequence: 4, change: 17, totalLength: 1_000, offset: 500, bytes: [1, 2, 3])
        #expect(try WireMessage.decode(WireMessage.valuePiece(piece).encoded()) == .valuePiece(piece))
        // A piece running past the value's end, and an empty one, are malformed.
        var past = piece
        past.offset = 999
        #expect(throws: ShoalError.self) { try WireMessage.decode(WireMessage.valuePiece(past).encoded()) }
        var empty = piece
        empty.bytes = []
        #expect(throws: ShoalError.self) { try WireMessage.decode(WireMessage.valuePiece(empty).encoded()) }
        let batch = ChangeBatchMessage(
            requestID: 1,
            isLast: false,
            batch: ChangeBatch(changes: [change(1, .integer(1)), change(2, .null)], claim: VersionVector()),
            piecedValues: [1]
        )
        #expect(try WireMessage.decode(WireMessage.changeBatch(batch).encoded()) == .changeBatch(batch))
    }
}
