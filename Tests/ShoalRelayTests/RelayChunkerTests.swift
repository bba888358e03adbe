import ShoalCore
import ShoalRelayClient
import ShoalRelayProtocol
import Testing

@Suite struct RelayChunkerTests {
    private func change(_ site: SiteID, _ seq: UInt64) -> Change {
        Change(
            table: "kv",
            primaryKey: [.integer(Int64(seq))],
            payload: .column("v", .integer(Int64(seq))),
            causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: seq << 16), site: site, seq: seq)
        )
    }

    /// A batch whose claim is held back below changes it carries (the sender waits until what overwrote part of a
    /// transaction is sent) leaves its range open: a range never holds a change beyond its end, which members would
    /// refuse as outside its range.
    @Test func aRangeEndsOnlyOnceTheClaimCoversEveryChangeItHolds() throws {
        let site = SiteID.random()
        var chunker = RelayChunker(
            cluster: "c", seal: RelaySeal(clusterSecret: Array(repeating: 7, count: 32)), heads: VersionVector([site: 2]),
            pieceBytes: 1 << 20
        )
        let first = try chunker.envelopes(
            for: ChangeBatch(changes: (3...6).map { change(site, $0) }, claim: VersionVector([site: 4]))
        )
        #expect(first.count == 1 && !first[0].endsRange && first[0].from == 2)
        let second = try chunker.envelopes(for: ChangeBatch(changes: [], claim: VersionVector([site: 6])))
        #expect(second.count == 1)
        #expect(second[0].endsRange && second[0].from == 2 && second[0].to == 6)
        #expect(second[0].upload == first[0].upload && second[0].index == first[0].index + 1)
        // The next range starts where that one ended.
        let third = try chunker.envelopes(
            for: ChangeBatch(changes: [change(site, 7)], claim: VersionVector([site: 7]))
        )
        #expect(third.count == 1 && third[0].endsRange && third[0].from == 6 && third[0].to == 7)
    }
}
