import Testing

@testable import ShoalCore

@Suite struct ClockTests {
    @Test func tickIsMonotonicWhenPhysicalTimeStepsBack() {
        var clock = HybridClock()
        let first = clock.tick(now: 10_000)
        let second = clock.tick(now: 9_000)
        let third = clock.tick(now: 9_000)
        #expect(first < second && second < third)
        #expect(second.milliseconds == 10_000 && second.logical == 1)
        #expect(clock.tick(now: 20_000) == HLC(milliseconds: 20_000, logical: 0))
    }

    @Test func observingARemoteClockMovesLocalTimePastIt() throws {
        var clock = HybridClock(maximumDriftMilliseconds: 1_000)
        try clock.observe(HLC(milliseconds: 10_500, logical: 7), now: 10_000)
        #expect(clock.tick(now: 10_000) == HLC(milliseconds: 10_500, logical: 8))
    }

    @Test func aRemoteClockBeyondTheBoundIsRefusedAndNotAdopted() {
        var clock = HybridClock(maximumDriftMilliseconds: 1_000)
        let before = clock.latest
        #expect(throws: ShoalError.self) { try clock.observe(HLC(milliseconds: 11_001, logical: 0), now: 10_000) }
        do {
            try clock.observe(HLC(milliseconds: 11_001, logical: 0), now: 10_000)
        } catch {
            #expect(error.code == .clockTooFarAhead)
            #expect(error.message.contains("1001 ms ahead"))
        }
        #expect(clock.latest == before)
        #expect(clock.accepts(HLC(milliseconds: 11_000, logical: 5), now: 10_000))
    }

    @Test func versionVectorsCompareAndMerge() {
        let a = SiteID(high: 0, low: 1)
        let b = SiteID(high: 0, low: 2)
        let left = VersionVector([a: 3, b: 1])
        #expect(left.compare(VersionVector([a: 3, b: 1])) == .equal)
        #expect(left.compare(VersionVector([a: 2])) == .dominates)
        #expect(left.compare(VersionVector([a: 3, b: 2])) == .dominated)
        #expect(left.compare(VersionVector([a: 1, b: 5])) == .concurrent)
        #expect(left.merging(VersionVector([a: 1, b: 5])) == VersionVector([a: 3, b: 5]))
        #expect(left.covers(Dot(site: a, seq: 3)) && !left.covers(Dot(site: b, seq: 2)))
        #expect(VersionVector([a: 0]).isEmpty)
    }

    @Test func siteIDsRoundTripThroughHexAndBytes() {
        let site = SiteID(high: 0x0123_4567_89ab_cdef, low: 0xfedc_ba98_7654_3210)
        #expect(site.hex == "0123456789abcdeffedcba9876543210")
        #expect(SiteID(hex: site.hex) == site)
        #expect(SiteID(bytes: site.bytes) == site)
        #expect(SiteID(hex: "xyz") == nil)
        #expect(SiteID(bytes: [1, 2, 3]) == nil)
    }
}
