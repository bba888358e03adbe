import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalTransport

private let siteA = SiteID(high: 1, low: 1)
private let siteB = SiteID(high: 2, low: 2)
private let configured = PeerAddress(host: "127.0.0.1", port: 7_401)

private func hello(_ site: SiteID, name: String = "b", listenPort: UInt16 = 7_402) -> Hello {
    Hello(clusterID: "c", siteID: site, nodeName: name, schemaFingerprint: "t", listenPort: listenPort)
}

/// The node's peer records, as plain data: no socket.
@Suite struct PeerDirectoryTests {
    @Test func aPeerFoundByMDNSIsListedBeforeItConnectsThenConnected() {
        var directory = PeerDirectory()
        let address = PeerAddress(host: "10.0.0.2", port: 7_400)
        let named = PeerAddress(host: "b.local", port: 7_400)
        directory.found(PeerCandidate(siteID: siteB, name: "b", address: address, otherAddresses: [named], origin: .mdns))
        var status = directory.statuses()
        #expect(status.count == 1 && !status[0].isConnected && !status[0].everConnected)
        #expect(status[0].foundBy == .mdns && status[0].addresses == ["10.0.0.2:7400", "b.local:7400"])

        directory.learnSite(siteB, at: address)
        let reachable = directory.connected(hello(siteB), address: "10.0.0.2:7400", dialed: true, remoteIP: "10.0.0.2")
        #expect(reachable == address)
        status = directory.statuses()
        #expect(status[0].isConnected && status[0].everConnected && status[0].foundBy == .mdns)
        directory.disconnected(siteB)
        #expect(!directory.isConnected(siteB))
    }

    /// A catch-up's ETA follows its recent pace (the last 3 s of reports), not its average since the start: a
    /// catch-up that slowed to a quarter of its first pace shows the ETA of the new pace; none before the reports
    /// span a second.
    @Test func aCatchUpsETAFollowsItsRecentPace() {
        var directory = PeerDirectory()
        directory.learnSite(siteB, at: configured)
        _ = directory.connected(hello(siteB), address: "127.0.0.1:7401", dialed: true, remoteIP: "127.0.0.1")
        // 10,000 changes a second for 4 s, then 2,500 a second for 12 s; 100,000 left then.
        var changes = 0
        for second in 1...16 {
            changes += second <= 4 ? 10_000 : 2_500
            let remaining = UInt64(max(0, 160_000 - changes))
            let report = CatchUpProgress(changes: changes, remaining: remaining, milliseconds: UInt64(second) * 1_000)
            directory.progress(siteB, report)
            if second == 1 { #expect(directory.statuses()[0].catchUp?.secondsLeft == nil) }
        }
        let progress = directory.statuses()[0].catchUp
        let left = progress?.secondsLeft ?? 0
        // At 2,500 a second, 90,000 changes take 36 s; the average since the start (4,375 a second) would say 20.6.
        #expect(left > 33 && left < 40, "ETA \(left) s; recent rate \(progress?.recentRate ?? 0)")
        #expect(abs((progress?.rate ?? 0) - 4_375) < 1)
    }

    @Test func theSameSightingTwiceChangesNothing() {
        var directory = PeerDirectory()
        let candidate = PeerCandidate(siteID: siteB, name: "b", address: configured, origin: .mdns)
        directory.found(candidate)
        let once = directory.statuses()
        directory.found(candidate)
        #expect(directory.statuses() == once)
    }

    @Test func aConfiguredAddressIsUnreachedUntilItsSiteIsLearnt() {
        var directory = PeerDirectory()
        directory.found(PeerCandidate(siteID: nil, address: configured, origin: .static))
        directory.dialed(configured)
        directory.dialFailed(configured, site: nil, reason: "connection refused")
        directory.retry(configured, site: nil, in: 180)
        let unreached = directory.unreachedPeers()
        #expect(unreached.count == 1)
        #expect(unreached[0].address == "127.0.0.1:7401" && unreached[0].foundBy == .static)
        #expect(unreached[0].attempts == 1 && unreached[0].consecutiveFailures == 1)
        #expect(unreached[0].lastError == "connection refused" && unreached[0].retryDelayMilliseconds == 180)
        #expect(directory.statuses().isEmpty)

        // Its first handshake says who answers there: it is a peer now, found by its configured address.
        directory.learnSite(siteB, at: configured)
        _ = directory.connected(hello(siteB), address: configured.description, dialed: true, remoteIP: "127.0.0.1")
        #expect(directory.unreachedPeers().isEmpty)
        #expect(directory.site(at: configured) == siteB)
        #expect(directory.statuses().map(\.foundBy) == [.static])
    }

    @Test func failuresCountUntilARoundFinishesOrThePeerAcknowledges() {
        var directory = PeerDirectory()
        _ = directory.connected(hello(siteB), address: "127.0.0.2:5000", dialed: false, remoteIP: "127.0.0.2")
        // Our refusal of its changes: over when our next pull finishes.
        directory.failed(siteB, reason: "clock too far ahead", refusedByPeer: false)
        directory.failed(siteB, reason: "clock too far ahead", refusedByPeer: false)
        #expect(directory.status(of: siteB)?.consecutiveFailures == 2)
        let recovered = directory.roundFinished(siteB, milliseconds: 12, now: 1_000)
        #expect(recovered)
        #expect(directory.status(of: siteB)?.consecutiveFailures == 0 && directory.status(of: siteB)?.lastError == nil)
        #expect(directory.status(of: siteB)?.lastSuccessfulSync == 1_000)

        // Its refusal of ours: a pull of ours finishing says nothing; its acknowledgement ends it.
        directory.failed(siteB, reason: "the peer refused: apply failed", refusedByPeer: true)
        let stillRefused = !directory.roundFinished(siteB, milliseconds: 5, now: 2_000)
        #expect(stillRefused)
        #expect(directory.status(of: siteB)?.consecutiveFailures == 1)
        let ack = Ack(requestID: 1, versionVector: VersionVector([siteA: 3]), digest: [0x0f, 0xa0])
        let acknowledged = directory.acknowledged(siteB, ack)
        #expect(acknowledged)
        #expect(directory.status(of: siteB)?.consecutiveFailures == 0)
        #expect(directory.status(of: siteB)?.digest == "0fa0")
        #expect(directory.highestAcknowledged(of: siteA) == 3)
    }

    @Test func aPeerThatDialledUsIsRememberedAtItsListeningPort() {
        var directory = PeerDirectory()
        let reachable = directory.connected(
            hello(siteB, listenPort: 7_402),
            address: "127.0.0.3:51000",
            dialed: false,
            remoteIP: "127.0.0.3"
        )
        #expect(reachable == PeerAddress(host: "127.0.0.3", port: 7_402))
        #expect(directory.statuses()[0].foundBy == .inbound)
        #expect(directory.statuses()[0].addresses == ["127.0.0.3:7402"])
        // A peer that does not listen is not remembered.
        let silent = directory.connected(hello(siteA, listenPort: 0), address: "127.0.0.4:1", dialed: false, remoteIP: nil)
        #expect(silent == nil)
    }

    @Test func aRememberedPeerKeepsItsOriginUntilTheNetworkShowsIt() {
        var directory = PeerDirectory()
        let remembered = PeerAddress(host: "127.0.0.5", port: 7_405)
        directory.found(PeerCandidate(siteID: siteB, address: remembered, origin: .remembered))
        #expect(directory.statuses()[0].foundBy == .remembered && directory.origin(of: remembered) == .remembered)
        directory.found(PeerCandidate(siteID: siteB, name: "b", address: remembered, origin: .mdns))
        #expect(directory.origin(of: remembered) == .mdns)
    }
}
