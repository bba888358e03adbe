import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore

/// A member suspended for collection whose writes made while away travel before it knows (uploaded to the relay, then
/// passed on by a node that took them): a node that collected the rows they touch leaves them out, the member's fresh
/// state counts none of them as held by its peer, and once it settles, every node holds the same rows, checked outside
/// Shoal too.
@Suite struct SuspendedWritesTests {
    /// `member` updates row 1 and begins row 9 while away; `collector` deletes row 1 and collects it without the
    /// member; `keeper` (which keeps the tombstone) takes the member's writes, as a download of the member's range from
    /// the relay would, and passes them on to the collector. Row 1 once came back on the collector (a row new to it),
    /// and from there on every node. The member takes its fresh state from `source`.
    @Test(arguments: ["collector", "keeper"])
    func writesMadeWhileSuspendedBringNoCollectedRowBack(source: String) throws {
        let directory = try temporaryDirectory("suspended-writes-\(source)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let collector = try makeFileStore(directory, "collector")
        let keeper = try makeFileStore(directory, "keeper")
        let member = try makeFileStore(directory, "member")
        try collector.execute("INSERT INTO items(id, name) VALUES (1, 'one'), (2, 'two'), (3, 'three')")
        try member.execute("INSERT INTO items(id, name) VALUES (4, 'four')")
        for (from, to) in [(collector, keeper), (collector, member), (member, collector), (collector, keeper)] {
            try sync(from, to)
        }
        // Away: the member writes to row 1, and begins row 9 (its counter too).
        try member.execute("UPDATE items SET name = 'ONE' WHERE id = 1")
        try member.execute("INSERT INTO items(id, name, hits) VALUES (9, 'nine', 5)")
        let away = try member.versionVector()[member.siteID]
        // What it uploads to the relay before it knows (its pull came back empty: nothing was suspended yet).
        let uploaded = try member.changes(since: collector.versionVector(), maxChangesPerBatch: 7)
        try collector.execute("DELETE FROM items WHERE id = 1")
        try sync(collector, keeper)
        // The keeper downloads that range: the tombstone beats the update, row 9 is new to it.
        try sync(member, keeper)
        let kept: [[SQLValue]] = [[.integer(2)], [.integer(3)], [.integer(4)], [.integer(9)]]
        #expect(try rows(keeper, "SELECT id FROM items ORDER BY id") == kept)
        // The collector collects without the member, after recording it; the keeper gets the notice.
        #expect(try collector.suspend([member.siteID], cut: try collector.versionVector()) == [member.siteID])
        #expect(try collector.collectTombstones(upTo: try collector.versionVector()).collected == 1)
        try sync(collector, keeper)
        #expect(
            try collector.suspendedWriteRanges()[member.siteID]
                == [Store.SuspendedWrites(site: member.siteID, after: away - 2, through: .max)]
        )
        // The collector downloads the member's range, and the keeper passes on what it holds: neither brings row 1
        // back (it once came back here, a row new to this node, and from here on every node). Row 9, begun by the
        // member, is kept.
        #expect(try applyDownloaded(uploaded, to: collector) == 1)
        try sync(keeper, collector)
        #expect(try rows(collector, "SELECT id FROM items ORDER BY id") == kept)
        #expect(try collector.versionVector()[member.siteID] == away)
        // The member learns it was suspended, and takes its fresh state.
        let peer = source == "collector" ? collector : keeper
        try sync(peer, member)
        #expect(try member.awaitFreshStateIfSuspended())
        #expect(try member.ownSuspendedWritesAfter() == away - 2)
        let report = try takeFreshState(member, from: peer)
        if source == "collector" {
            // The collector claims the update it left out: row 1 was collected, and the write goes to the conflict
            // log (it once went silently, the peer's claim counted as holding it).
            #expect(report.orphaned == 1 && report.lifted == 0 && report.removed == 0, "\(report)")
        } else {
            // The keeper holds both: row 1 went with the delete it sent.
            #expect(report == FreshStateReport(), "\(report)")
        }
        // Row 9 began below the floor: written again above it when settling.
        try member.freshStateTaken(covering: try peer.versionVector())
        #expect(try member.settleSuspensions() == 1)
        #expect(try member.ownSuspendedWritesAfter() == nil)
        // Its record says which of its writes were made while suspended.
        try sync(member, collector)
        #expect(
            try collector.suspendedWriteRanges()[member.siteID]
                == [Store.SuspendedWrites(site: member.siteID, after: away - 2, through: away)]
        )
        let stores = [collector, keeper, member]
        for _ in 0..<2 {
            for from in stores {
                for to in stores where to !== from { try sync(from, to) }
            }
        }
        let expected: [[SQLValue]] = [
            [.integer(2), .text("two"), .integer(0)], [.integer(3), .text("three"), .integer(0)],
            [.integer(4), .text("four"), .integer(0)], [.integer(9), .text("nine"), .integer(5)],
        ]
        for store in stores {
            #expect(try rows(store, "SELECT id, name, hits FROM items ORDER BY id") == expected)
            #expect(try store.digest() == collector.digest())
            #expect(try store.verify().isConsistent)
        }
        // Row 9 lives above the floor (2) everywhere: a node that held a tombstone of its key would keep it too.
        for store in stores {
            let table = store.capture.tables[store.capture.tableNumbers["items"]!]
            #expect(try store.loadState(table: table, key: [.integer(9)])?.causalLength == 3)
        }
        let files = ["collector", "keeper", "member"].map { directory.appendingPathComponent("\($0).db") }
        #expect(try sameContents(files[0], files[1]) && sameContents(files[0], files[2]))
        if source == "collector" {
            #expect(try rows(member, "SELECT count(*) FROM shoal_conflicts WHERE local_value = 'ONE'") == [[.integer(1)]])
        }
    }
}

/// Applies `batches` (a member's range downloaded from the relay) to `store` in order, each batch's claim taken as far
/// as the changes received so far prove it, as the relay link does; returns how many changes it left out as a
/// suspended member's writes made while away.
@discardableResult
func applyDownloaded(_ batches: [ChangeBatch], to store: Store) throws -> Int {
    var leftOut = 0
    var received: [SiteID: UInt64] = [:]
    for batch in batches {
        let report = try store.apply(batch.changes, claim: batch.claim, received: received)
        received.merge(report.acceptedHighest) { max($0, $1) }
        leftOut += report.suspendedWritesLeftOut
    }
    return leftOut
}
