import Foundation
import Logging
import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelayClient

/// The pure helpers the relay link's shell leans on: how envelopes are gathered into upload requests, what the link
/// derives from its configuration, and when the pull session has the relay's heads read.
@Suite struct RelayLinkHelperTests {
    private func envelope(index: UInt32, bytes: Int = 100) -> RelayEnvelope {
        RelayEnvelope(
            cluster: "c", epoch: 0, site: SiteID(high: 1, low: 1), from: 0, to: 1, upload: 7, index: index,
            flags: [], sealed: Array(repeating: 1, count: bytes)
        )
    }

    private func configuration(_ url: String, token: String = "t") -> RelayClientConfiguration {
        RelayClientConfiguration(
            url: url, token: token, clusterID: "c", clusterSecret: Array(repeating: 1, count: 32),
            logger: Logger(label: "test")
        )
    }

    @Test func envelopesGoUpInRequestsOfAboutTheRequestSizeAndWhatIsLeftAtTheEnd() {
        let size = envelope(index: 0).encodedCount
        var buffer = RelayUploadBuffer(requestBytes: 3 * size)
        var requests: [[UInt32]?] = [buffer.flush()?.map(\.index)]
        for index: UInt32 in 0..<4 { requests.append(buffer.add(envelope(index: index))?.map(\.index)) }
        requests.append(buffer.flush()?.map(\.index))
        requests.append(buffer.flush()?.map(\.index))
        // An envelope larger than the size goes alone, at once.
        requests.append(buffer.add(envelope(index: 4, bytes: 10 * size))?.map(\.index))
        // The third reaches the size: the request goes with all three, the buffer starts again empty, and what is left
        // goes at the end.
        #expect(requests == [nil, nil, nil, [0, 1, 2], nil, [3], nil, [4]])
    }

    @Test func theLinksInstancesAreCheckedAndItsBackoffAndHTTPClientFollowTheConfiguration() throws {
        var links = configuration("https://relay.example//")
        links.otherURLs = ["http://127.0.0.1:9000/"]
        links.initialBackoffMilliseconds = 10
        links.maximumBackoffMilliseconds = 20
        #expect(try links.checkedBases() == ["https://relay.example", "http://127.0.0.1:9000"])
        #expect(links.backoff.initialMilliseconds == 10 && links.backoff.maximumMilliseconds == 20)
        #expect(links.httpConfiguration.httpVersion == .http1Only)
        // Plain http:// anywhere but loopback would send the token in clear; no token, no link.
        #expect(throws: ShoalError.self) { try configuration("http://relay.example").checkedBases() }
        #expect(throws: ShoalError.self) { try configuration("ftp://relay.example").checkedBases() }
        #expect(throws: ShoalError.self) { try configuration("https://relay.example", token: "").checkedBases() }
        var unreadable = configuration("https://relay.example")
        unreadable.caCertificatePath = NSTemporaryDirectory() + "/no-such-ca-\(UInt64.random(in: 1...UInt64.max)).pem"
        #expect(throws: ShoalError.self) { try unreadable.checkedBases() }
    }

    @Test func thePullSessionHasTheHeadsReadAfterAFailureOrAnEarlyEmptyPage() {
        let site = SiteID(high: 2, low: 2)
        var session = RelayPullSession(
            site: SiteID(high: 9, low: 9), cluster: "c",
            backoff: Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000, jitter: 1...1)
        )
        #expect(!session.headsDue)
        _ = session.request(held: VersionVector(), now: 0, wait: 25_000, maximumBytes: 1 << 20)
        // A page with chunks, or an empty one at the end of its wait, says nothing of the relay's storage.
        session.answered(chunks: 3, after: 10)
        session.answered(chunks: 0, after: 20_000)
        #expect(!session.headsDue)
        // Empty long before its wait was up: the relay may have shut down and come back from an older copy.
        session.answered(chunks: 0, after: 12_499)
        #expect(session.headsDue)
        // The heads read: the relay lacks what the node holds (the uploader is woken), or it does not.
        let lacking = session.headsRead(VersionVector([site: 3]), held: VersionVector([site: 5]))
        #expect(lacking && !session.headsDue)
        session.failed()
        #expect(session.headsDue)
        let holding = session.headsRead(VersionVector([site: 5]), held: VersionVector([site: 5]))
        #expect(!holding && !session.headsDue)
    }

    /// However fast the app writes, pulls that bring change sets follow one another no sooner than the spacing after
    /// the last was asked (what a busy writer uploads meanwhile comes in one page); a long-poll that waited that long
    /// goes again at once. And the ranges the relay served are handed to the uploader once each, so it never sends
    /// them back; a failure forgets them (the relay may come back with less).
    @Test func pullsThatBringChangeSetsArePacedAndWhatTheRelayServedIsNotSentBack() throws {
        let writer = SiteID(high: 2, low: 2)
        let seal = RelaySeal(clusterSecret: Array(repeating: 7, count: 32))
        var chunker = RelayChunker(cluster: "c", seal: seal, heads: VersionVector(), pieceBytes: 1 << 20)
        let change = Change(
            table: "kv", primaryKey: [.integer(1)], payload: .column("v", .integer(1)), causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: 1 << 16), site: writer, seq: 1)
        )
        let envelopes = try chunker.envelopes(for: ChangeBatch(changes: [change], claim: VersionVector([writer: 1])))
        #expect(envelopes.count == 1 && envelopes[0].endsRange)
        var session = RelayPullSession(
            site: SiteID(high: 9, low: 9), cluster: "c",
            backoff: Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000, jitter: 1...1),
            spacingMilliseconds: 10
        )
        _ = session.request(held: VersionVector(), now: 0, wait: 25_000, maximumBytes: 1 << 20)
        session.answered(chunks: 1, after: 3)
        #expect(session.check(envelopes[0], now: 0) == .open)
        let piece = session.opened(
            envelopes[0], plaintext: Result { () throws(ShoalError) in try seal.open(envelopes[0]) }, now: 0
        )
        guard case .apply(_, let received) = piece else {
            Issue.record("the change set was not handed over: \(piece)")
            return
        }
        // Served whole: told before it is applied (the apply's commit wakes the uploader), once.
        #expect(session.takeServed() == VersionVector([writer: 1]))
        #expect(session.takeServed().isEmpty)
        session.applied(envelopes[0], received: received, held: VersionVector([writer: 1]))
        // Asked 3 ms ago: the next pull waits the other 7.
        #expect(session.pageEnded() == 7)
        // A page that came back after the spacing, or one that brought nothing, is followed at once.
        _ = session.request(held: VersionVector([writer: 1]), now: 30, wait: 25_000, maximumBytes: 1 << 20)
        session.answered(chunks: 0, after: 25_000)
        #expect(session.pageEnded() == nil)
        // Served, then failed before it was taken: forgotten.
        var again = RelayPullSession(
            site: SiteID(high: 9, low: 9), cluster: "c",
            backoff: Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000)
        )
        _ = again.request(held: VersionVector(), now: 40, wait: 25_000, maximumBytes: 1 << 20)
        #expect(again.check(envelopes[0], now: 40) == .open)
        let opened = Result { () throws(ShoalError) in try seal.open(envelopes[0]) }
        _ = again.opened(envelopes[0], plaintext: opened, now: 40)
        again.failed()
        #expect(again.takeServed().isEmpty)
    }
}
