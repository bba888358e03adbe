import Testing

@testable import ShoalCore
@testable import ShoalProtocol

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)

private func hello(
    _ site: SiteID,
    cluster: String = "lab",
    versions: ClosedRange<UInt16> = 1...1,
    schema: String = "t"
)
    -> Hello
{
    Hello(versions: versions, clusterID: cluster, siteID: site, nodeName: "n", schemaFingerprint: schema, listenPort: 0)
}

/// The reason a session refused the peer, if its last actions are a reject and a close.
private func refusal(_ actions: [SyncSession.Action]) -> (Rejection.Reason, ShoalError.Code)? {
    guard actions.count == 2, case .send(.reject(let rejection)) = actions[0], case .close(let error) = actions[1]
    else { return nil }
    return (rejection.reason, error.code)
}

@Suite struct SyncSessionTests {
    @Test func aGoodHelloEstablishesAndStartsARound() {
        var session = SyncSession(local: hello(siteA), now: 0)
        #expect(session.start() == [.send(.hello(hello(siteA)))])
        let actions = session.receive(.hello(hello(siteB)), now: 10)
        #expect(actions == [.established(hello(siteB), version: 1), .wantRound])
        #expect(session.phase == .established)
    }

    @Test func peersThatCarrySchemaChangesKeepSyncingAcrossSchemas() {
        let current = 1...WireProtocol.maximumVersion
        var session = SyncSession(local: hello(siteA, versions: current), now: 0)
        _ = session.start()
        let peer = hello(siteB, versions: current, schema: "u")
        #expect(session.receive(.hello(peer), now: 1).first == .established(peer, version: WireProtocol.maximumVersion))
        // A peer whose Shoal is older is told to upgrade, by name.
        var old = SyncSession(local: hello(siteA, versions: current), now: 0)
        _ = old.start()
        let actions = old.receive(.hello(hello(siteB, versions: 1...4, schema: "u")), now: 1)
        #expect(refusal(actions)?.0 == .schemaMismatch)
        if case .send(.reject(let rejection)) = actions.first { #expect(rejection.message.hasPrefix("upgrade Shoal on n: ")) }
    }

    @Test func aCommitIsAnnouncedToAPeerOfVersion7AndStartsARoundWithAnOlderOne() throws {
        let vector = VersionVector([siteA: 3, siteB: 1])
        var session = SyncSession(local: hello(siteA, versions: 1...WireProtocol.maximumVersion), now: 0)
        _ = session.start()
        _ = session.receive(.hello(hello(siteB, versions: 1...WireProtocol.holdingVersion)), now: 1)
        #expect(session.committed() == [.announce])
        // The periodic round is still a round.
        #expect(session.localChange() == [.wantRound])
        // What the peer says it holds is for the shell to compare with the local vector.
        #expect(session.receive(.holding(vector), now: 2) == [.peerHolds(vector)])
        let encoded = WireMessage.holding(vector).encoded()
        #expect(try WireMessage.decode(encoded) == .holding(vector))
        #expect(throws: ShoalError.self) { try WireMessage.decode(encoded.dropLast()) }
        // A peer of version 6 does not read message 14: it gets a round.
        var older = SyncSession(local: hello(siteA, versions: 1...WireProtocol.maximumVersion), now: 0)
        _ = older.start()
        _ = older.receive(.hello(hello(siteB, versions: 1...(WireProtocol.holdingVersion - 1))), now: 1)
        #expect(older.committed() == [.wantRound])
        // An inspection takes no announcement.
        var inspection = SyncSession(local: hello(siteA, versions: 1...WireProtocol.maximumVersion), now: 0)
        _ = inspection.start()
        _ = inspection.receive(.inspect(hello(siteB, versions: 1...WireProtocol.maximumVersion)), now: 1)
        #expect(inspection.committed().isEmpty)
        #expect(refusal(inspection.receive(.holding(vector), now: 2))?.0 == .malformedMessage)
    }

    @Test func badHellosAreRefusedWithTheirReason() {
        let cases: [(Hello, Rejection.Reason, ShoalError.Code)] = [
            (hello(siteB, versions: 2...3), .versionMismatch, .versionMismatch),
            (hello(siteB, cluster: "other"), .clusterMismatch, .clusterMismatch),
            (hello(siteA), .selfConnection, .selfConnection),
            // Different schemas only with a peer too old to carry schema changes (these hellos speak version 1).
            (hello(siteB, schema: "u"), .schemaMismatch, .unsupportedSchema),
        ]
        for (peer, reason, code) in cases {
            var session = SyncSession(local: hello(siteA), now: 0)
            let result = refusal(session.receive(.hello(peer), now: 1))
            #expect(result?.0 == reason && result?.1 == code)
            #expect(session.phase == .closed)
            #expect(session.receive(.ping(1), now: 2).isEmpty)
        }
    }

    @Test func anythingBeforeHelloIsRefused() {
        var session = SyncSession(local: hello(siteA), now: 0)
        #expect(refusal(session.receive(.ping(3), now: 1))?.0 == .malformedMessage)
    }

    @Test func aSilentPeerTimesOutOnInjectedTime() {
        var configuration = SyncSession.Configuration()
        configuration.handshakeTimeout = 100
        configuration.keepaliveInterval = 50
        configuration.idleTimeout = 200
        var waiting = SyncSession(local: hello(siteA), configuration: configuration, now: 1_000)
        #expect(waiting.tick(now: 1_099).isEmpty)
        #expect(refusal(waiting.tick(now: 1_100))?.1 == .timeout)

        var session = SyncSession(local: hello(siteA), configuration: configuration, now: 0)
        _ = session.receive(.hello(hello(siteB)), now: 0)
        #expect(session.tick(now: 49).isEmpty)
        #expect(session.tick(now: 50) == [.send(.ping(50))])
        #expect(session.tick(now: 60).isEmpty)  // one ping at a time
        #expect(session.receive(.pong(50), now: 70).isEmpty)
        #expect(refusal(session.tick(now: 270))?.1 == .timeout)
    }

    @Test func roundsDoNotOverlapAndAStrayBatchIsRefused() {
        var session = SyncSession(local: hello(siteA), now: 0)
        _ = session.receive(.hello(hello(siteB)), now: 0)
        let vector = VersionVector([siteA: 2])
        #expect(
            session.startRound(versionVector: vector, now: 1) == [
                .send(.syncRequest(SyncRequest(requestID: 1, versionVector: vector)))
            ]
        )
        #expect(session.startRound(versionVector: vector, now: 2).isEmpty)
        // The peer pulls while our pull runs: serve it (pulling back is the shell's call).
        let request = SyncRequest(requestID: 9, versionVector: VersionVector())
        #expect(session.receive(.syncRequest(request), now: 3) == [.serve(request)])
        let last = ChangeBatchMessage(requestID: 1, isLast: true, batch: ChangeBatch(changes: [], claim: vector))
        #expect(session.receive(.changeBatch(last), now: 4) == [.apply(last)])
        let done = session.applied(last, versionVector: vector, digest: nil, now: 5)
        #expect(
            done == [.send(.ack(Ack(requestID: 1, versionVector: vector))), .roundFinished(requestID: 1), .wantRound]
        )
        let stray = ChangeBatchMessage(requestID: 1, isLast: true, batch: ChangeBatch(changes: [], claim: vector))
        #expect(refusal(session.receive(.changeBatch(stray), now: 6))?.0 == .malformedMessage)
    }

    @Test func batchesOutOfOrderAreRefused() {
        var session = SyncSession(local: hello(siteA), now: 0)
        _ = session.receive(.hello(hello(siteB)), now: 0)
        _ = session.startRound(versionVector: VersionVector(), now: 1)
        let empty = ChangeBatch(changes: [], claim: VersionVector([siteB: 5]))
        let first = ChangeBatchMessage(requestID: 1, sequence: 0, isLast: false, batch: empty)
        #expect(session.receive(.changeBatch(first), now: 2) == [.apply(first)])
        // The third batch arrives before the second: its claim would cover changes not yet applied.
        let third = ChangeBatchMessage(requestID: 1, sequence: 2, isLast: true, batch: empty)
        #expect(refusal(session.receive(.changeBatch(third), now: 3))?.0 == .malformedMessage)
    }

    @Test func aRejectFromThePeerClosesWithItsReason() {
        var session = SyncSession(local: hello(siteA), now: 0)
        let actions = session.receive(.reject(Rejection(.tooManyConnections, "full")), now: 1)
        guard actions.count == 2, case .peerRefused(let rejection) = actions[0], case .close(let error) = actions[1]
        else {
            Issue.record("expected the refusal, then a close: \(actions)")
            return
        }
        #expect(rejection.reason == .tooManyConnections)
        #expect(error.code == .rejected && error.message.contains("full"))
    }
}
