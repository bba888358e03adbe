import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalTransport

/// Every node learns what every member holds: directly from its peers, and passed on by them about members it never
/// meets (``WireMessage/members(_:)``).
@Suite struct MemberDirectoryTests {
    private let a = SiteID(high: 1, low: 1)
    private let b = SiteID(high: 2, low: 2)
    private let c = SiteID(high: 3, low: 3)

    @Test func anEntryMovesOnWhenItHoldsMoreAndStaysFreshWhenItHoldsTheSame() {
        var members = MemberDirectory()
        let new = members.heard(b, holds: VersionVector([b: 2]), at: 100, from: .direct)
        #expect(new)
        let first = members.generation
        // Passed on later, holding more: taken, with its source.
        let more = members.heard(b, holds: VersionVector([b: 3, c: 1]), at: 150, from: .peer(c))
        #expect(more)
        #expect(
            members.entries[b] == .init(versionVector: VersionVector([b: 3, c: 1]), reportedAtMs: 150, source: .peer(c))
        )
        #expect(members.generation == first + 1)
        // An older, smaller report arriving late changes nothing.
        let late = members.heard(b, holds: VersionVector([b: 1]), at: 200, from: .direct)
        #expect(!late)
        #expect(members.entries[b]?.reportedAtMs == 150)
        // The same, more recently: fresher, from itself, and no new generation (nothing to pass on for it).
        let same = members.heard(b, holds: VersionVector([b: 3, c: 1]), at: 300, from: .direct)
        #expect(!same)
        #expect(members.entries[b]?.reportedAtMs == 300 && members.entries[b]?.source == .direct)
        #expect(members.generation == first + 1)
        // A passed-on word of the same does not replace the member's own as the source.
        _ = members.heard(b, holds: VersionVector([b: 3, c: 1]), at: 400, from: .peer(c))
        #expect(members.entries[b]?.source == .direct && members.entries[b]?.reportedAtMs == 400)
        // What a peer passed on is not passed back to it, and a report that went round a loop (a few ms fresher)
        // does not change hands; one fresher by more than the allowance does.
        let aSite = SiteID(high: 9, low: 9)
        members.heard(aSite, holds: VersionVector([aSite: 1]), at: 400, from: .peer(c))
        #expect(members.gossip(for: c, now: 500).map(\.site) == [b])
        members.heard(aSite, holds: VersionVector([aSite: 1]), at: 405, from: .peer(b))
        #expect(members.entries[aSite]?.source == .peer(c) && members.entries[aSite]?.reportedAtMs == 405)
        members.heard(aSite, holds: VersionVector([aSite: 1]), at: 2_000, from: .peer(b))
        #expect(members.entries[aSite]?.source == .peer(b))
        // Every report is in the collection rule's history.
        #expect(members.reports.history[b]?.last == VersionVector([b: 3, c: 1]))
        members.forget(b)
        #expect(members.entries[b] == nil && members.reports.history[b] == nil)
    }

    @Test func whatIsPassedOnKeepsItsAgeAndLeavesOutTheReceiverAndTheReceiversOwnState() throws {
        var atB = MemberDirectory()
        atB.heard(b, holds: VersionVector([b: 5]), at: 1_000, from: .local)
        atB.heard(c, holds: VersionVector([c: 7]), at: 900, from: .direct)
        atB.named(c, "cé")
        atB.heard(a, holds: VersionVector([a: 1]), at: 950, from: .direct)
        let gossip = atB.gossip(for: a, now: 1_000)
        #expect(gossip.map(\.site) == [b, c])
        #expect(gossip.map(\.ageMilliseconds) == [0, 100] && gossip.map(\.name) == ["", "cé"])
        // On the wire and back.
        let message = WireMessage.members(gossip)
        #expect(try WireMessage.decode(message.encoded()) == message)
        var tooMany = [UInt8(15)]
        tooMany.appendVarint(UInt64(MemberGossip.maximumCount + 1))
        #expect(throws: ShoalError.self) { try WireMessage.decode(tooMany) }
        // a's clock reads 5,000 when it arrives: ages count back from there.
        var atA = MemberDirectory()
        atA.heard(a, holds: VersionVector([a: 2]), at: 5_000, from: .local)
        let aboutA = MemberGossip(site: a, ageMilliseconds: 0, versionVector: VersionVector())
        atA.passedOn(gossip + [aboutA], by: b, own: a, now: 5_000)
        #expect(atA.entries[b] == .init(versionVector: VersionVector([b: 5]), reportedAtMs: 5_000, source: .direct))
        #expect(atA.entries[c] == .init(versionVector: VersionVector([c: 7]), reportedAtMs: 4_900, source: .peer(b)))
        #expect(atA.names[c] == "cé" && atA.statuses().first { $0.siteID == c }?.name == "cé")
        #expect(atA.entries[a]?.versionVector == VersionVector([a: 2]))
    }

    @Test func aNodeLearnsWhatAMemberItNeverMeetsHoldsThroughThePeerBetween() async throws {
        let directory = try temporaryDirectory("members")
        defer { try? FileManager.default.removeItem(at: directory) }
        // A chain: c knows only b, b knows a and c, a knows only b. Periodic ticks every 100 ms pass reports on.
        let a = try await startNode(in: directory, name: "a") { $0.roundIntervalMilliseconds = 100 }
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) { $0.roundIntervalMilliseconds = 100 }
        let c = try await startNode(in: directory, name: "c", peers: [b.port]) { $0.roundIntervalMilliseconds = 100 }
        try await c.node.execute("INSERT INTO kv(k, v) VALUES ('from c', 1)")
        let cSite = c.node.siteID
        let target = try await c.node.versionVector()
        let learnt = try await waitUntil(within: 30) {
            await a.node.memberStatuses().contains { $0.siteID == cSite && $0.versionVector.dominatesOrEquals(target) }
        }
        #expect(learnt)
        let statuses = await a.node.memberStatuses()
        let ofC = try #require(statuses.first { $0.siteID == cSite })
        #expect(ofC.source == "relayed" && ofC.via == b.node.siteID, "\(statuses)")
        // Its name is passed on with it, and the others are named as they said in their hellos.
        let names = [a.node.siteID: "a", b.node.siteID: "b", cSite: "c"]
        #expect(statuses.map(\.name) == statuses.map { names[$0.siteID] })
        #expect(statuses.first { $0.siteID == b.node.siteID }?.source == "direct")
        #expect(statuses.first { $0.siteID == a.node.siteID }?.source == "local")
        // c's row reaches a (what a member holds may be passed on before the data), and the rows match outside Shoal.
        #expect(try await waitUntil(within: 30) { try await a.node.versionVector().dominatesOrEquals(target) })
        let rowsA = try sqlite3Shell(a.path, "SELECT k, quote(v) FROM kv ORDER BY k").stdout
        let rowsC = try sqlite3Shell(c.path, "SELECT k, quote(v) FROM kv ORDER BY k").stdout
        #expect(rowsA == rowsC && rowsA.contains("from c"))
        for node in [c, b, a] { await node.stop() }
    }
}
