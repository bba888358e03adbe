import Testing

@testable import ShoalCore
@testable import ShoalProtocol

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)

private func hello(_ site: SiteID) -> Hello {
    Hello(versions: 1...2, clusterID: "lab", siteID: site, nodeName: "n", schemaFingerprint: "t", listenPort: 0)
}

/// A session past its handshake with siteB.
private func established(_ configure: (inout SyncSession.Configuration) -> Void = { _ in }) -> SyncSession {
    var configuration = SyncSession.Configuration()
    configure(&configuration)
    var session = SyncSession(local: hello(siteA), configuration: configuration, now: 0)
    _ = session.start()
    _ = session.receive(.hello(hello(siteB)), now: 0)
    return session
}

private func change(_ seq: UInt64, value: SQLValue = .integer(1)) -> Change {
    Change(
        table: "t",
        primaryKey: [.integer(Int64(seq))],
        payload: .column("v", value),
        causalLength: 1,
        stamp: Stamp(hlc: HLC(milliseconds: 1_700_000_000_000, logical: 0), site: siteA, seq: seq)
    )
}

/// The rules of the exchange that the session owns (the driver only carries out its actions).
@Suite struct SessionRulesTests {
    @Test func version4FieldsTravelOnlyToPeersThatReadThem() throws {
        let head = Stamp(hlc: HLC(milliseconds: 1_700_000_000_000, logical: 3), site: siteB, seq: 42)
        func request(peerVersions: ClosedRange<UInt16>) -> SyncRequest? {
            var session = SyncSession(local: Hello(clusterID: "lab", siteID: siteA, nodeName: "n", schemaFingerprint: "t", listenPort: 0), now: 0)
            _ = session.start()
            var peer = hello(siteB)
            peer.versions = peerVersions
            _ = session.receive(.hello(peer), now: 0)
            let actions = session.startRound(
                versionVector: VersionVector([siteB: 42]),
                now: 1,
                wallClock: 1_700_000_000_123,
                writingSite: siteA,
                answererHead: head
            )
            guard case .send(.syncRequest(let request)) = actions.first else { return nil }
            return request
        }
        let current = try #require(request(peerVersions: 1...WireProtocol.maximumVersion))
        #expect(current.wallClockMilliseconds == 1_700_000_000_123)
        #expect(current.writingSite == siteA && current.answererHead == head)
        #expect(try WireMessage.decode(WireMessage.syncRequest(current).encoded()) == .syncRequest(current))
        // Without a head (the peer's site is not held here yet), and to a version 3 peer: none of them at all.
        var headless = current
        headless.answererHead = nil
        #expect(try WireMessage.decode(WireMessage.syncRequest(headless).encoded()) == .syncRequest(headless))
        let older = try #require(request(peerVersions: 1...3))
        #expect(older.wallClockMilliseconds == nil && older.writingSite == nil && older.answererHead == nil)
        #expect(WireMessage.syncRequest(older).encoded().count < WireMessage.syncRequest(headless).encoded().count)
        // A truncated version 4 request, or an unknown head flag, is malformed.
        let bytes = WireMessage.syncRequest(current).encoded()
        #expect(throws: ShoalError.self) { try WireMessage.decode(Array(bytes.dropLast(4))) }
        var flagged = WireMessage.syncRequest(headless).encoded()
        flagged[flagged.count - 1] = 7
        #expect(throws: ShoalError.self) { try WireMessage.decode(flagged) }
    }

    @Test func aPullBackFollowsServingOnlyWhenThePeerHoldsSomethingWeLack() {
        var session = established()
        let request = SyncRequest(requestID: 1, versionVector: VersionVector([siteB: 3]))
        #expect(session.receive(.syncRequest(request), now: 1) == [.serve(request)])
        // The peer holds siteB:3, we hold siteB:2: pull back in the same round.
        #expect(session.served(request, localVersionVector: VersionVector([siteB: 2])) == [.wantRound])
        // Two idle peers: nothing more, or they would prompt each other forever.
        let idle = SyncRequest(requestID: 2, versionVector: VersionVector([siteA: 5]))
        _ = session.receive(.syncRequest(idle), now: 2)
        #expect(session.served(idle, localVersionVector: VersionVector([siteA: 5, siteB: 3])) == [])
    }

    @Test func batchesOfAnAnswerAreNumberedFromZeroPerRequest() throws {
        var session = established()
        let first = SyncRequest(requestID: 7, versionVector: VersionVector())
        _ = session.receive(.syncRequest(first), now: 1)
        var numbers: [UInt32] = []
        for seq in 1...3 {
            let batch = ChangeBatch(changes: [change(UInt64(seq))], claim: VersionVector([siteA: UInt64(seq)]))
            let prepared = try session.outgoingBatch(answering: first, batch, isLast: seq == 3, estimatedRemaining: 0)
            #expect(prepared.message.requestID == 7)
            #expect(prepared.message.isLast == (seq == 3))
            numbers.append(prepared.message.sequence)
        }
        #expect(numbers == [0, 1, 2])
        _ = session.served(first, localVersionVector: VersionVector([siteA: 3]))
        let second = SyncRequest(requestID: 8, versionVector: VersionVector())
        _ = session.receive(.syncRequest(second), now: 2)
        let batch = ChangeBatch(changes: [], claim: VersionVector())
        #expect(try session.outgoingBatch(answering: second, batch, isLast: true, estimatedRemaining: 0).message.sequence == 0)
    }

    @Test func aBatchThatCannotFitAFrameIsUnsendable() {
        var session = established { $0.maximumFrameLength = 1_000 }
        let request = SyncRequest(requestID: 1, versionVector: VersionVector())
        _ = session.receive(.syncRequest(request), now: 1)
        // A 5,000-byte primary key cannot travel in pieces: the batch is refused, with the reason sent to the peer.
        var big = change(1)
        big.primaryKey = [.text(String(repeating: "k", count: 5_000))]
        let batch = ChangeBatch(changes: [big], claim: VersionVector([siteA: 1]))
        #expect(throws: ShoalError.self) {
            try session.outgoingBatch(answering: request, batch, isLast: true, estimatedRemaining: 0)
        }
        #expect(SyncSession.reason(forFailureHere: .frameTooLarge) == .unsendableChange)
    }

    @Test func failuresMapToTheReasonThePeerIsSent() {
        #expect(SyncSession.reason(forFailureHere: .clockTooFarAhead) == .applyFailed)
        #expect(SyncSession.reason(forFailureHere: .sqlite) == .applyFailed)
        #expect(SyncSession.reason(forFailureHere: .timeout) == .timeout)
        #expect(SyncSession.reason(forFailureHere: .network) == .other)
        #expect(SyncSession.reason(forDecodingFailure: .frameTooLarge) == .frameTooLarge)
        #expect(SyncSession.reason(forDecodingFailure: .unknownMessageType) == .unknownMessageType)
        #expect(SyncSession.reason(forDecodingFailure: .malformedMessage) == .malformedMessage)

        var session = established()
        let error = ShoalError(code: .sqlite, message: "disk I/O error")
        let actions = session.fail(error, now: 10)
        #expect(actions == [.send(.reject(Rejection(.applyFailed, "disk I/O error"))), .close(error)])
        #expect(session.phase == .lingering)
    }

    @Test func aPeerTakingALongAnswerIsNotSilent() {
        // The puller says nothing until it has applied the last batch; an answer may outlast the idle timeout.
        var session = established {
            $0.keepaliveInterval = 5_000
            $0.idleTimeout = 15_000
        }
        let request = SyncRequest(requestID: 1, versionVector: VersionVector())
        #expect(session.receive(.syncRequest(request), now: 1_000) == [.serve(request)])
        for now in stride(from: UInt64(2_000), through: 30_000, by: 2_000) { session.peerIsReading(now: now) }
        _ = session.served(request, localVersionVector: VersionVector())
        #expect(session.tick(now: 30_100) == [])
        #expect(session.tick(now: 35_000) == [.send(.ping(35_000))])
        guard case .send(.reject(let rejection)) = session.tick(now: 45_000).first else {
            Issue.record("a peer silent for the idle timeout after the answer should be refused")
            return
        }
        #expect(rejection.reason == .timeout)
    }

    @Test func timeThisSideCouldNotWatchIsNotThePeersSilence() {
        var session = established {
            $0.keepaliveInterval = 5_000
            $0.idleTimeout = 15_000
        }
        _ = session.receive(.ping(1), now: 1_000)
        // The loop was busy (or the process starved) for 17 s: the peer's messages from then wait unread.
        session.couldNotWatch(milliseconds: 16_900, now: 18_000)
        #expect(session.tick(now: 18_000) == [])
        // It counts only up to now, and the keepalive and the idle timeout run from there.
        session.couldNotWatch(milliseconds: 60_000, now: 19_000)
        #expect(session.tick(now: 23_999) == [])
        #expect(session.tick(now: 24_000) == [.send(.ping(24_000))])
        #expect(session.tick(now: 33_999) == [])
        guard case .send(.reject(let rejection)) = session.tick(now: 34_000).first else {
            Issue.record("a peer silent for the idle timeout of watched time should be refused")
            return
        }
        #expect(rejection.reason == .timeout)
        // An unsolicited pong (a busy peer's heartbeat) is hearing from the peer, and is otherwise ignored.
        var busy = established {
            $0.keepaliveInterval = 5_000
            $0.idleTimeout = 15_000
        }
        #expect(busy.receive(.pong(0), now: 14_000) == [])
        #expect(busy.tick(now: 28_999) == [.send(.ping(28_999))])
        #expect(busy.phase == .established)
    }

    @Test func aSideThatSendsNoKeepalivesStillTimesASilentPeerOut() {
        var listening = established {
            $0.keepaliveInterval = 5_000
            $0.idleTimeout = 15_000
            $0.sendsKeepalives = false
        }
        #expect(listening.tick(now: 10_000) == [])
        // The dialler's ping is hearing from it, and is answered.
        #expect(listening.receive(.ping(7), now: 10_000) == [.send(.pong(7))])
        #expect(listening.tick(now: 24_999) == [])
        guard case .send(.reject(let rejection)) = listening.tick(now: 25_000).first else {
            Issue.record("a silent peer should be refused after the idle timeout, pings or not")
            return
        }
        #expect(rejection.reason == .timeout)
    }

    @Test func afterAFailureHereThePeersOwnRefusalIsStillHeard() {
        var session = established()
        _ = session.fail(ShoalError(code: .network, message: "send cut short"), now: 10)
        // Anything but a refusal is ignored while lingering; the refusal ends it and is reported.
        #expect(session.receive(.ping(1), now: 11) == [])
        let refusal = Rejection(.applyFailed, "clock too far ahead")
        #expect(session.receive(.reject(refusal), now: 12) == [.peerRefused(refusal)])
        #expect(session.phase == .closed)
    }

    @Test func lingeringEndsAtItsDeadlineOrWhenTheStreamEnds() {
        var quiet = established { $0.lingerTimeout = 500 }
        _ = quiet.fail(ShoalError(code: .network, message: "x"), now: 1_000)
        #expect(quiet.tick(now: 1_499) == [] && quiet.phase == .lingering)
        _ = quiet.tick(now: 1_500)
        #expect(quiet.phase == .closed)

        var ended = established()
        _ = ended.fail(ShoalError(code: .network, message: "x"), now: 0)
        #expect(ended.streamEnded(nil) == [])
        #expect(ended.phase == .closed)
    }

    @Test func aStreamThatEndsOrCannotBeDecodedClosesTheSession() {
        var clean = established()
        let actions = clean.streamEnded(nil)
        guard case .close(let error) = actions.first else {
            Issue.record("expected a close, got \(actions)")
            return
        }
        #expect(error.code == .rejected)
        var garbled = established()
        let bad = ShoalError(code: .unknownMessageType, message: "type 99")
        #expect(garbled.streamEnded(bad) == [.send(.reject(Rejection(.unknownMessageType, "type 99"))), .close(bad)])
    }

    @Test func localChangesStartRoundsOnlyOnceEstablished() {
        let handshaking = SyncSession(local: hello(siteA), now: 0)
        #expect(handshaking.localChange() == [])
        #expect(established().localChange() == [.wantRound])
    }
}
