import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// Where a suspended member's writes made while away must be kept, not left out: nodes that simply lack a row yet, a
/// notice written again, a row another member deleted. Each failed on the first version of the leave-out rule (found by
/// a review); rows and digests compared.
@Suite struct SuspendedWritesEdgeTests {
    /// `sync` with a chosen batch size (each batch its own apply, as a real answer's batches or slices are).
    @discardableResult
    func syncBatched(_ from: Store, _ to: Store, size: Int) throws -> ApplyReport {
        var total = ApplyReport()
        var received: [SiteID: UInt64] = [:]
        let batches = try from.changes(since: to.versionVector(), maxChangesPerBatch: size)
        for (index, batch) in batches.enumerated() {
            let report = try to.apply(
                batch.changes, claim: batch.claim, received: received,
                completing: index == batches.count - 1 && !total.withheldAny
            )
            received.merge(report.acceptedHighest) { max($0, $1) }
            total.add(report)
        }
        return total
    }

    /// Two stores ordered by site: the first sorts before the second.
    func orderedPair(_ directory: URL, _ a: String, _ b: String) throws -> (Store, Store) {
        let x = try makeFileStore(directory, a)
        let y = try makeFileStore(directory, b)
        return x.siteID < y.siteID ? (x, y) : (y, x)
    }

    /// A live row whose every cell the suspended member wrote while away reaches a node that does not hold the row yet
    /// (a newcomer catching up from the collector, the floor and notice in earlier batches): the update is kept (it
    /// was once left out there, and claimed: the row never appeared).
    @Test func aNewcomerCatchingUpKeepsALiveRowTheSuspendedMemberUpdated() throws {
        let directory = try temporaryDirectory("probe-newcomer")
        defer { try? FileManager.default.removeItem(at: directory) }
        // The collector's changes must come before the member's in (site, seq) order.
        let (collector, member) = try orderedPair(directory, "c", "m")
        let newcomer = try makeFileStore(directory, "n")
        try collector.execute("INSERT INTO pairs VALUES ('live', 1, 'old'), ('gone', 1, 'x')")
        try sync(collector, member)
        try sync(member, collector)
        // Away: the member updates a live row (its only column).
        try member.execute("UPDATE pairs SET v = 'new' WHERE a = 'live'")
        let uploaded = try member.changes(since: collector.versionVector())
        try collector.execute("DELETE FROM pairs WHERE a = 'gone'")
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        // The collector downloads the member's range: it holds the row, and takes the update.
        try applyDownloaded(uploaded, to: collector)
        #expect(try rows(collector, "SELECT a, v FROM pairs ORDER BY a") == [[.text("live"), .text("new")]])
        // A newcomer catches up from the collector, one transaction per batch.
        let report = try syncBatched(collector, newcomer, size: 1)
        #expect(try newcomer.versionVector().dominatesOrEquals(collector.versionVector()))
        #expect(try rows(newcomer, "SELECT a, v FROM pairs ORDER BY a") == [[.text("live"), .text("new")]])
        #expect(try newcomer.digest() == collector.digest())
        // Nothing brings it back: the newcomer claims the update.
        try syncBatched(collector, newcomer, size: 1)
        #expect(try rows(newcomer, "SELECT a, v FROM pairs ORDER BY a") == [[.text("live"), .text("new")]])
    }

    /// The same, with the row's creator sorting after the member: the newcomer gets the whole row (it once got the
    /// insert's cells without the member's update of `name`).
    @Test func aNewcomerGetsTheWholeRowWhenItsCreatorSortsAfterTheMember() throws {
        let directory = try temporaryDirectory("probe-newcomer-half")
        defer { try? FileManager.default.removeItem(at: directory) }
        let first = try makeFileStore(directory, "s1")
        let second = try makeFileStore(directory, "s2")
        let third = try makeFileStore(directory, "s3")
        let sorted = [first, second, third].sorted { $0.siteID < $1.siteID }
        // collector < member < creator in site order.
        let (collector, member, creator) = (sorted[0], sorted[1], sorted[2])
        let newcomer = try makeFileStore(directory, "n")
        try creator.execute("INSERT INTO items(id, name, qty) VALUES (5, 'five', 7)")
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one')")
        for (a, b) in [(creator, collector), (collector, member), (collector, creator)] { try sync(a, b) }
        try member.execute("UPDATE items SET name = 'FIVE' WHERE id = 5")
        let uploaded = try member.changes(since: collector.versionVector())
        try collector.execute("DELETE FROM items WHERE id = 1")
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        try applyDownloaded(uploaded, to: collector)
        try syncBatched(collector, newcomer, size: 1)
        let expected = try rows(collector, "SELECT id, name, qty FROM items ORDER BY id")
        #expect(try rows(newcomer, "SELECT id, name, qty FROM items ORDER BY id") == expected)
        #expect(try newcomer.digest() == collector.digest())
    }

    /// The collector writes its notice again at a later pass: the member's own entry in the cut stays where it was, so
    /// the member still counts its writes since as made while suspended (a cut that moved past the writes the
    /// collector claimed once made the member's fresh state remove, silently, the row it began while away, which a
    /// keeper kept).
    @Test func aNoticeWrittenAgainStillShowsTheWritesMadeWhileAway() throws {
        let directory = try temporaryDirectory("probe-renotice")
        defer { try? FileManager.default.removeItem(at: directory) }
        let collector = try makeFileStore(directory, "collector")
        let keeper = try makeFileStore(directory, "keeper")
        let member = try makeFileStore(directory, "member")
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        for (from, to) in [(collector, keeper), (collector, member), (member, collector)] { try sync(from, to) }
        try member.execute("INSERT INTO items(id, name) VALUES (9, 'nine')")
        let uploaded = try member.changes(since: collector.versionVector())
        // The keeper downloads the member's range before any notice.
        try sync(member, keeper)
        try collector.execute("DELETE FROM items WHERE id = 1")
        try sync(collector, keeper)
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        #expect(try applyDownloaded(uploaded, to: collector) == 0)
        // A later pass: others wrote meanwhile, the collector records the member again (its cut moved).
        try collector.execute("INSERT INTO items(id, name) VALUES (20, 'twenty')")
        let rewritten = try collector.suspend([member.siteID], cut: try collector.versionVector())
        try sync(collector, keeper)
        try sync(keeper, collector)
        // The member returns, learns of the notice, and takes its fresh state from the collector.
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        let report = try takeFreshState(member, from: collector)
        try member.freshStateTaken(covering: try collector.versionVector())
        try member.settleSuspensions()
        let stores = [collector, keeper, member]
        for _ in 0..<2 {
            for from in stores { for to in stores where to !== from { try sync(from, to) } }
        }
        // The member's row 9 (nobody deleted it) should live on every node.
        for store in stores {
            #expect(try rows(store, "SELECT id FROM items WHERE id = 9") == [[.integer(9)]])
            #expect(try store.digest() == keeper.digest())
        }
    }

    /// The member's row begun while away reaches a keeper (relay, before any notice); the keeper deletes it; the
    /// collector takes the delete and collects it without the member. The member's fresh state from the collector
    /// removes the row (it once kept it as begun here and wrote it again: the deleted row came back everywhere).
    @Test func aRowBegunWhileAwayAndDeletedByAnotherStaysDeleted() throws {
        let directory = try temporaryDirectory("probe-deleted-by-other")
        defer { try? FileManager.default.removeItem(at: directory) }
        let collector = try makeFileStore(directory, "collector")
        let keeper = try makeFileStore(directory, "keeper")
        let member = try makeFileStore(directory, "member")
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        for (from, to) in [(collector, keeper), (collector, member), (member, collector)] { try sync(from, to) }
        try member.execute("INSERT INTO items(id, name) VALUES (9, 'nine')")
        try sync(member, keeper)
        try collector.execute("DELETE FROM items WHERE id = 1")
        try sync(collector, keeper)
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        try sync(collector, keeper)
        // The member pulls once (the notice), learns it is suspended, and is away again.
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        // The keeper deletes the member's row 9; the collector takes the delete and collects it.
        try keeper.execute("DELETE FROM items WHERE id = 9")
        try sync(keeper, collector)
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        let collected = try collector.collectTombstones(upTo: try collector.versionVector()).collected
        try sync(collector, keeper)
        try keeper.collectTombstones(upTo: try collector.versionVector())
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        let report = try takeFreshState(member, from: collector)
        try member.freshStateTaken(covering: try collector.versionVector())
        try member.settleSuspensions()
        let stores = [collector, keeper, member]
        for _ in 0..<2 {
            for from in stores { for to in stores where to !== from { try sync(from, to) } }
        }
        for store in stores {
            #expect(try rows(store, "SELECT id FROM items WHERE id = 9") == [])
        }
    }

    /// A member suspended twice; a node that still holds the first notice alive (it was away since) catches up in one
    /// answer carrying the member's second record: the first notice's range ends where the first suspension was
    /// settled, so the member's writes made between the two suspensions are kept there.
    @Test func aNoticeCoveredByALaterRecordEndsWhereItsSuspensionWasSettled() throws {
        let directory = try temporaryDirectory("probe-twice")
        defer { try? FileManager.default.removeItem(at: directory) }
        let collector = try makeFileStore(directory, "collector")
        let member = try makeFileStore(directory, "member")
        let lagger = try makeFileStore(directory, "lagger")
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        for (from, to) in [(collector, member), (collector, lagger)] { try sync(from, to) }
        // First suspension.
        try collector.execute("DELETE FROM items WHERE id = 1")
        try sync(collector, lagger)
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        try sync(collector, lagger)  // the lagger holds the first notice and the floor, then is away
        try member.execute("INSERT INTO items(id, name) VALUES (40, 'away-1')")
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        try takeFreshState(member, from: collector)
        try member.freshStateTaken(covering: try collector.versionVector())
        #expect(try member.settleSuspensions() == 1)
        try sync(member, collector)
        #expect(try collector.readmit(member.siteID, covering: try collector.freshStatesTaken()[member.siteID]!))
        // Back as a member, not suspended: it begins row 50, which the collector takes.
        try member.execute("INSERT INTO items(id, name) VALUES (50, 'fifty')")
        try sync(member, collector)
        // Second suspension; the member writes while away again, and settles again.
        try collector.execute("INSERT INTO items(id, name) VALUES (3, 'three')")
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        try member.execute("INSERT INTO items(id, name) VALUES (60, 'away-2')")
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        try takeFreshState(member, from: collector)
        try member.freshStateTaken(covering: try collector.versionVector())
        #expect(try member.settleSuspensions() == 1)
        try sync(member, collector)
        // The lagger returns and catches up from the collector in one answer.
        let report = try sync(collector, lagger)
        let query = "SELECT id, name FROM items ORDER BY id"
        #expect(try rows(lagger, query) == rows(collector, query))
        #expect(try lagger.digest() == collector.digest())
    }
    /// As the first, but the newcomer joins after the member settled: only the member's record names the range, and it
    /// travels in the member's own range, with the update: kept.
    @Test func aNewcomerAfterSettlingKeepsALiveRowTheMemberUpdatedWhileAway() throws {
        let directory = try temporaryDirectory("probe-newcomer-settled")
        defer { try? FileManager.default.removeItem(at: directory) }
        let (collector, member) = try orderedPair(directory, "c", "m")
        let newcomer = try makeFileStore(directory, "n")
        try collector.execute("INSERT INTO pairs VALUES ('live', 1, 'old'), ('gone', 1, 'x')")
        try sync(collector, member)
        try member.execute("UPDATE pairs SET v = 'new' WHERE a = 'live'")
        let uploaded = try member.changes(since: collector.versionVector())
        try collector.execute("DELETE FROM pairs WHERE a = 'gone'")
        try collector.suspend([member.siteID], cut: try collector.versionVector())
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        try applyDownloaded(uploaded, to: collector)
        try sync(collector, member)
        #expect(try member.awaitFreshStateIfSuspended())
        try takeFreshState(member, from: collector)
        try member.freshStateTaken(covering: try collector.versionVector())
        #expect(try member.settleSuspensions() == 1)
        try sync(member, collector)
        #expect(try rows(collector, "SELECT a, v FROM pairs ORDER BY a") == [[.text("live"), .text("new")]])
        // The cluster goes on: the collector writes more rows.
        try collector.execute("INSERT INTO items(id, name) VALUES (100, 'a'), (101, 'b'), (102, 'c')")
        // Later, a newcomer catches up from the collector (the protocol's batches of 7 changes).
        let report = try sync(collector, newcomer)
        #expect(try rows(newcomer, "SELECT a, v FROM pairs ORDER BY a") == [[.text("live"), .text("new")]])
        #expect(try newcomer.digest() == collector.digest())
    }
    /// A member that writes under a fresh site it signed (restored or copied before) is named in a notice by its
    /// membership: with the roster's binding of that site (``Store/memberWritingSites``), a collector leaves out its
    /// update of a collected row all the same (without it, nothing named the writing site, and the row came back),
    /// and a notice written again keeps that site's entry of the cut where it was.
    @Test func writesUnderAFreshSiteTheMemberSignedAreLeftOutToo() throws {
        let directory = try temporaryDirectory("probe-fresh-site")
        defer { try? FileManager.default.removeItem(at: directory) }
        let collector = try makeFileStore(directory, "c")
        let member = try makeFileStore(directory, "m")
        let membership = SiteID(high: 0x5EED, low: 1)
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two')")
        try sync(collector, member)
        try member.execute("INSERT INTO items(id, name) VALUES (3, 'three')")
        try sync(member, collector)
        // Away: the member updates row 1, under its writing site.
        try member.execute("UPDATE items SET name = 'ONE' WHERE id = 1")
        let uploaded = try member.changes(since: collector.versionVector())
        try collector.execute("DELETE FROM items WHERE id = 1")
        let cut = try collector.versionVector()
        #expect(try collector.suspend([membership], cut: cut) == [membership])
        #expect(try collector.collectTombstones(upTo: cut).collected == 1)
        #expect(try collector.suspendedWriteRanges()[member.siteID] == nil)
        collector.memberWritingSites = [membership: [member.siteID]]
        let expected = [Store.SuspendedWrites(site: member.siteID, after: cut[member.siteID], through: .max)]
        #expect(try collector.suspendedWriteRanges()[member.siteID] == expected)
        #expect(try applyDownloaded(uploaded, to: collector) == 1)
        #expect(try rows(collector, "SELECT id FROM items ORDER BY id") == [[.integer(2)], [.integer(3)]])
        // The collector claims the update it left out, and writes its notice again past a write of its own: the
        // member's writing site stays where it first collected without it.
        #expect(try collector.versionVector()[member.siteID] > cut[member.siteID])
        try collector.execute("INSERT INTO items(id, name) VALUES (4, 'four')")
        try collector.execute("DELETE FROM items WHERE id = 2")
        #expect(try collector.suspend([membership], cut: try collector.versionVector()) == [membership])
        #expect(try collector.suspendedWriteRanges()[member.siteID] == expected)
        #expect(try collector.verify().isConsistent)
    }
}
