import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport
@testable import ShoalProtocol

/// The system clock shifted by a fixed amount.
private struct ShiftedClock: WallClock {
    let shift: Int64
    func nowMilliseconds() -> UInt64 { UInt64(Int64(SystemWallClock().nowMilliseconds()) + shift) }
}

/// Waits (polling, with a deadline) until `node` has failed with its peer `count` times in a row.
private func failures(of node: RunningNode, reach count: Int, within seconds: Double) async -> PeerStatus? {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if let peer = await node.node.peerStatuses().first, peer.consecutiveFailures >= count { return peer }
        _ = await node.log.next(within: 0.2) { _ in true }
    }
    return nil
}

/// Counts the events of `log` that would be printed as failure lines.
private func failureLines(_ log: NodeEventLog) async -> Int {
    await log.events.filter { event in
        switch event {
        case .connectionFailed, .inboundConnectionFailed, .peerDisconnected: true
        default: false
        }
    }.count
}

@Suite struct BackoffTests {
    @Test func aNodeStartedWithItsClockADayAheadOfTwoPeersStampsWithTheirTimeAndSyncs() async throws {
        let directory = try temporaryDirectory("ahead-at-start")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        let ahead = try await startNode(in: directory, name: "ahead", peers: [a.port, b.port]) { configuration in
            configuration.storeOptions.clock = ShiftedClock(shift: 86_400_000)
        }
        // Its first rounds bring the peers' clocks (in their requests): two agree that its clock is the one ahead.
        let deadline = Date().addingTimeInterval(30)
        while await ahead.node.clockAheadOfPeers() == nil, Date() < deadline {
            _ = await ahead.log.next(within: 0.5) { _ in true }
        }
        let gap = try #require(await ahead.node.clockAheadOfPeers())
        #expect(gap > 86_000_000 && gap < 87_000_000)
        #expect(await a.node.clockAheadOfPeers() == nil)
        // Its writes are stamped with the peer's time: the peer takes them, and both files hold the same rows.
        try await ahead.node.execute("INSERT INTO kv(k, v) VALUES ('from the machine ahead', 1)")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('from a', 2)")
        #expect(try await converge(a, ahead, within: 30))
        #expect(try await converge(b, ahead, within: 30))
        for peer in [a, b] {
            #expect(
                try SQLiteConnection(path: peer.path).applicationTableContents()
                    == SQLiteConnection(path: ahead.path).applicationTableContents()
            )
        }
        #expect(try await a.node.execute("SELECT count(*) FROM kv").rows == [[.integer(2)]])
        await ahead.stop()
        await b.stop()
        await a.stop()
    }

    @Test func aNodeWhoseClockIsADayBehindIsRedialledWithBackoffAndToldWhy() async throws {
        let directory = try temporaryDirectory("skew")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('from now', 1)")
        let day: Int64 = 86_400_000
        let late = try await startNode(in: directory, name: "late", peers: [a.port]) { configuration in
            configuration.storeOptions.clock = ShiftedClock(shift: -day)
            configuration.backoffInitialMilliseconds = 20
            configuration.backoffMaximumMilliseconds = 60_000
        }
        guard let peer = await failures(of: late, reach: 7, within: 60) else {
            Issue.record("the late node did not keep failing: \(await late.node.peerStatuses())")
            return
        }
        // One dial per failure, each after a delay that doubled: 20 ms · 2⁶ (± 20 % jitter) by the seventh.
        let dials = await late.node.dialCount(PeerAddress(host: "127.0.0.1", port: a.port))
        #expect(dials <= peer.consecutiveFailures + 1)
        #expect((peer.retryDelayMilliseconds ?? 0) >= 20 * 64 * 8 / 10)
        // The failure is said once (not once per retry), on both sides.
        #expect(await failureLines(late.log) <= 2)
        #expect(await failureLines(a.log) <= 2)
        // The message says how far apart the clocks are in human units, that no third node can tell which is
        // wrong, and what happens meanwhile.
        let reason = peer.lastError ?? ""
        #expect(reason.contains("23 h 59 min") || reason.contains("1 d"))
        #expect(reason.contains("cannot be told which"))
        #expect(reason.contains("held back until"))
        let aSaw = await a.node.peerStatuses().first?.lastError ?? ""
        #expect(aSaw.contains("the peer refused") && aSaw.contains("held back"))
        await late.stop()
        await a.stop()
    }

    @Test func withThreeNodesTheRefusalBlamesTheClockTheOthersDisagreeWith() async throws {
        let directory = try temporaryDirectory("third")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('from a', 1)")
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('from b', 1)")
        // Three hours behind both of them.
        let late = try await startNode(in: directory, name: "late", peers: [a.port, b.port]) { configuration in
            configuration.storeOptions.clock = ShiftedClock(shift: -3 * 3_600_000)
        }
        let deadline = Date().addingTimeInterval(60)
        var blamesItself = false
        while Date() < deadline && !blamesItself {
            let reasons = await late.node.peerStatuses().compactMap(\.lastError)
            blamesItself = reasons.contains { $0.contains("so this node's clock looks 2 h 59 min behind") }
            if !blamesItself { _ = await late.log.next(within: 0.5) { _ in true } }
        }
        let reasons = await late.node.peerStatuses().map(\.lastError)
        #expect(blamesItself, "\(reasons)")
        await late.stop()
        await b.stop()
        await a.stop()
    }

    @Test func aStoreThatCannotApplyBacksOffAndRecovers() async throws {
        let directory = try temporaryDirectory("readonly")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) { configuration in
            configuration.backoffInitialMilliseconds = 20
            configuration.backoffMaximumMilliseconds = 60_000
        }
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        // b's database refuses every write from now on (a real SQLite failure, as on a read-only file).
        try await b.node.execute("PRAGMA query_only = 1")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('cannot land', 1)")
        guard let peer = await failures(of: b, reach: 6, within: 60) else {
            Issue.record("b did not keep failing: \(await b.node.peerStatuses())")
            return
        }
        let dials = await b.node.dialCount(PeerAddress(host: "127.0.0.1", port: a.port))
        #expect(dials <= peer.consecutiveFailures + 2)
        #expect((peer.retryDelayMilliseconds ?? 0) >= 20 * 32 * 8 / 10)
        #expect(await failureLines(b.log) <= 3)
        #expect(peer.lastError?.contains("readonly") == true || peer.lastError?.contains("read-only") == true)
        // Once writes work again, the next retry syncs and the failure is cleared.
        try await b.node.execute("PRAGMA query_only = 0")
        #expect(try await converge(a, b, within: 120))
        await b.stop()
        await a.stop()
    }

    @Test func aClockRefusalBlamesTheClockTheThirdViewDisagreesWith() {
        let other = ClockView(ahead: -2_000, refused: false)
        let blamed = ClockRefusal.message(
            peer: "b 12345678",
            aheadMilliseconds: 11_520_000,
            boundMilliseconds: 300_000,
            otherViews: [("c", other)]
        )
        #expect(blamed.contains("3 h 12 min ahead"))
        #expect(blamed.contains("b 12345678's clock looks 3 h 12 min ahead"))
        let alsoAhead = ClockView(ahead: 11_400_000, refused: true)
        let selfBlamed = ClockRefusal.message(
            peer: "b",
            aheadMilliseconds: 11_520_000,
            boundMilliseconds: 300_000,
            otherViews: [("c", alsoAhead)]
        )
        #expect(selfBlamed.contains("this node's clock looks 3 h 12 min behind"))
        #expect(selfBlamed.contains("within the allowed") == false && selfBlamed.contains("5 min"))
    }

    @Test func durationsReadInHumanUnits() {
        #expect(ClockRefusal.humanDuration(milliseconds: 850) == "850 ms")
        #expect(ClockRefusal.humanDuration(milliseconds: 42_000) == "42 s")
        #expect(ClockRefusal.humanDuration(milliseconds: 185_000) == "3 min 5 s")
        #expect(ClockRefusal.humanDuration(milliseconds: 11_520_000) == "3 h 12 min")
        #expect(ClockRefusal.humanDuration(milliseconds: 86_399_000) == "23 h 59 min")
        #expect(ClockRefusal.humanDuration(milliseconds: 187_200_000) == "2 d 4 h")
    }

    @Test func aRepeatingFailureIsSaidOnceWithACount() {
        var failures = RepeatingFailures()
        var lines: [String] = []
        for attempt in 1...120 {
            if let line = failures.note("peer", "a clock \(attempt * 7) ms ahead") { lines.append(line) }
        }
        #expect(lines.count == 3)
        #expect(lines[1].contains("10 times in a row") && lines[2].contains("100 times in a row"))
        #expect(failures.note("peer", "another reason") == "another reason")
        failures.clear("peer")
        #expect(failures.note("peer", "another reason") == "another reason")
    }
}
