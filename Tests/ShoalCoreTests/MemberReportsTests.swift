import ShoalTestSupport
import Testing

@testable import ShoalCore

/// The rule that says which deletes every member has (``MemberReports``): worked examples, then a random causal
/// history checked against what the rule promises.
@Suite struct MemberReportsTests {
    private let a = SiteID(high: 1, low: 1)
    private let b = SiteID(high: 2, low: 2)
    private let own = SiteID(high: 3, low: 3)

    @Test func theCutIsTheLeastOfEachMembersLatestReportThisNodeHoldsWhole() {
        var reports = MemberReports()
        reports.record(VersionVector([a: 5, b: 3, own: 2]), from: a)
        reports.record(VersionVector([a: 4, b: 6, own: 2]), from: b)
        let held = VersionVector([a: 5, b: 6, own: 2])
        #expect(reports.stableCut(members: [a, b, own], own: own, held: held) == VersionVector([a: 4, b: 3, own: 2]))
        // A later report this node does not hold whole yet (a's write 9 is not here): a's earlier one counts.
        reports.record(VersionVector([a: 9, b: 6, own: 2]), from: a)
        #expect(reports.stableCut(members: [a, b, own], own: own, held: held) == VersionVector([a: 4, b: 3, own: 2]))
        // Once it is here, the later one.
        let more = VersionVector([a: 9, b: 6, own: 2])
        #expect(reports.stableCut(members: [a, b, own], own: own, held: more) == VersionVector([a: 4, b: 6, own: 2]))
        // A member that never reported holds everything back; one that left the roster no longer counts.
        let joined = SiteID(high: 4, low: 4)
        #expect(reports.stableCut(members: [a, b, own, joined], own: own, held: more).isEmpty)
        reports.forget(b)
        #expect(reports.stableCut(members: [a, own], own: own, held: more) == VersionVector([a: 9, b: 6, own: 2]))
    }

    @Test func reportsOnlyGrowAndOnlyTheNewestAreKept() {
        var reports = MemberReports()
        reports.record(VersionVector([a: 2]), from: a)
        reports.record(VersionVector([a: 1, b: 1]), from: a)  // late, from an older path: merged
        reports.record(VersionVector([a: 2]), from: a)  // nothing new: dropped
        #expect(reports.history[a] == [VersionVector([a: 2]), VersionVector([a: 2, b: 1])])
        for seq in 3...40 { reports.record(VersionVector([a: UInt64(seq)]), from: a) }
        #expect(reports.history[a]?.count == MemberReports.historyLimit)
        #expect(reports.history[a]?.last == VersionVector([a: 40, b: 1]))
    }

    /// A member reports its own write 4, then loses it (restored from an older copy before it sent it): no node will
    /// ever hold it. What the member itself says of its own site afterwards is taken as said, so its later reports
    /// count again; merged with the lost one, none would ever be held whole. A passed-on report is merged as before.
    @Test func whatAMemberSaysOfItsOwnSiteIsTakenAsSaid() {
        var reports = MemberReports()
        reports.record(VersionVector([a: 4, b: 2]), from: a, direct: true)
        let held = VersionVector([a: 3, b: 5, own: 1])
        #expect(reports.stableCut(members: [a, own], own: own, held: held).isEmpty)
        reports.record(VersionVector([a: 3, b: 5]), from: a, direct: true)
        #expect(reports.history[a]?.last == VersionVector([a: 3, b: 5]))
        #expect(reports.stableCut(members: [a, own], own: own, held: held) == VersionVector([a: 3, b: 5]))
        // Passed on by a peer, an older word of the member's own site does not lower it.
        reports.record(VersionVector([a: 2, b: 6]), from: a)
        #expect(reports.history[a]?.last == VersionVector([a: 3, b: 6]))
    }

    /// Sites write, sync with each other pairwise, and report what they hold to a collector, at random. Whenever the
    /// collector's cut covers a delete, every write concurrent with that delete (made by a site that had not seen it,
    /// or before it) is already held by the collector: a late update can never find the row forgotten.
    @Test(arguments: 0..<40)
    func noWriteConcurrentWithAStableDeleteIsStillToCome(seed: UInt64) {
        var random = SplitMix(state: seed &+ 1_000)
        let sites = (0..<4).map { SiteID(high: 10 + UInt64($0), low: UInt64($0)) }
        let collector = sites[0]
        var vectors = Dictionary(uniqueKeysWithValues: sites.map { ($0, VersionVector()) })
        // Each write: its dot, and what its maker held when it made it (its causal past, itself included).
        var writes: [(dot: Dot, past: VersionVector)] = []
        var reports = MemberReports()
        var inFlight: [(SiteID, VersionVector)] = []
        var stable = 0
        for step in 0..<300 {
            let site = sites[Int(random.next() % UInt64(sites.count))]
            switch random.next() % 3 {
            case 0:
                var vector = vectors[site]!
                let dot = Dot(site: site, seq: vector[site] + 1)
                vector.advance(site, to: dot.seq)
                vectors[site] = vector
                writes.append((dot, vector))
            case 1:
                // Pairwise sync: the two end holding both. (A pull takes whole transactions of a site in order, so a
                // vector always names what its node holds.)
                let other = sites[Int(random.next() % UInt64(sites.count))]
                var merged = vectors[site]!
                merged.merge(vectors[other]!)
                vectors[site] = merged
                vectors[other] = merged
            default:
                // Reports travel by any path and arrive late or out of order: one is sent, or one sent earlier
                // arrives.
                if random.next() % 2 == 0 || inFlight.isEmpty {
                    inFlight.append((site, vectors[site]!))
                } else {
                    let (from, vector) = inFlight.remove(at: Int(random.next() % UInt64(inFlight.count)))
                    reports.record(vector, from: from)
                }
            }
            let held = vectors[collector]!
            let cut = reports.stableCut(members: Set(sites), own: collector, held: held)
            for delete in writes where cut.covers(delete.dot) {
                stable += 1
                #expect(held.covers(delete.dot), "seed \(seed) step \(step): a stable delete not held here")
                for write in writes {
                    let concurrent = !delete.past.covers(write.dot) && !write.past.covers(delete.dot)
                    guard concurrent else { continue }
                    #expect(
                        held.covers(write.dot),
                        "seed \(seed) step \(step): \(write.dot) is concurrent with stable \(delete.dot) and not here"
                    )
                }
            }
        }
        // The rule lets deletes go in such a history (the check above is not empty).
        #expect(stable > 0, "seed \(seed): no delete ever became stable")
    }
}
