import Testing

@testable import ShoalCore
@testable import ShoalStore

/// A transaction the database holds (its version vector covers the dot) is not merged again, whatever comes with its
/// dot later: a replay changes nothing, and once tombstones are collected it cannot bring back what was collected.
@Suite struct HeldTransactionTests {
    @Test func aChangeWhoseDotTheVectorCoversIsSkippedEvenWithAValueThatWouldWin() throws {
        let store = try makeStore()
        try makeItems(store)
        let site = SiteID(high: 7, low: 7)
        func change(_ name: String, milliseconds: UInt64, seq: UInt64) -> Change {
            Change(
                table: "items",
                primaryKey: [.integer(1)],
                payload: .column("name", .text(name)),
                causalLength: 1,
                stamp: Stamp(hlc: HLC(milliseconds: milliseconds, logical: 0), site: site, seq: seq)
            )
        }
        let start: UInt64 = 1_700_000_000_000
        let first = try store.apply([change("first", milliseconds: start, seq: 1)], claim: VersionVector([site: 1]))
        #expect(first.applied == 1)
        // The same dot again, with a later clock (a replay, or a forgery): skipped, counted as known.
        let replay = change("again", milliseconds: start + 500, seq: 1)
        let again = try store.apply([replay], claim: VersionVector([site: 1]))
        #expect(again.applied == 0 && again.alreadyKnown == 1)
        #expect(try rows(store, "SELECT name FROM items") == [[.text("first")]])
        // The next transaction of that site applies as ever.
        let next = try store.apply([change("next", milliseconds: start + 500, seq: 2)], claim: VersionVector([site: 2]))
        #expect(next.applied == 1)
        #expect(try rows(store, "SELECT name FROM items") == [[.text("next")]])
        #expect(try store.digest() == store.fullScanDigest())
    }
}
