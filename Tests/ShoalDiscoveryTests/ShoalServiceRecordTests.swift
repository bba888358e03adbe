import Testing

@testable import ShoalCore
@testable import ShoalDiscovery

private let site = SiteID(high: 0x0123_4567_89AB_CDEF, low: 0x1111_2222_3333_4444)

/// The one place the mDNS instance name and TXT record are written and read.
@Suite struct ShoalServiceRecordTests {
    @Test func aRecordRoundTripsThroughItsInstanceNameAndTXT() {
        let record = ShoalServiceRecord(name: "kitchen tablet", siteID: site, clusterHint: "home", nodeID: "NODE", port: 7_400, protocolVersion: "2")
        #expect(record.instanceName == "kitchen tablet 0123456789ab 7400")
        #expect(record.txt == ["site": site.hex, "hint": "home", "node": "NODE", "proto": "2"])
        #expect(ShoalServiceRecord(instance: record.instanceName, port: 7_400, txt: record.txt) == record)
    }

    @Test func longNamesAreCutToFortyCharacters() {
        let record = ShoalServiceRecord(
            name: String(repeating: "n", count: 100),
            siteID: site,
            clusterHint: "c",
            port: 1,
            protocolVersion: "2"
        )
        #expect(record.name.count == 40)
        #expect(ShoalServiceRecord(instance: record.instanceName, port: 1, txt: record.txt)?.name.count == 40)
    }

    @Test func aRecordWithoutAValidSiteOrHintIsNotAShoalNode() {
        #expect(ShoalServiceRecord(instance: "x 0123456789ab 1", port: 1, txt: ["hint": "c"]) == nil)
        #expect(ShoalServiceRecord(instance: "x", port: 1, txt: ["site": "not hex", "hint": "c"]) == nil)
        #expect(ShoalServiceRecord(instance: "x", port: 1, txt: ["site": site.hex]) == nil)
        #expect(ShoalServiceRecord(instance: "x", port: 1, txt: ["site": String(site.hex.dropLast()), "hint": "c"]) == nil)
    }

    @Test func anInstanceNameOfAnotherShapeIsTakenWhole() {
        // Another implementation may name its instance freely: the name is all of it.
        let txt = ["site": site.hex, "hint": "c"]
        #expect(ShoalServiceRecord(instance: "printer", port: 9, txt: txt)?.name == "printer")
        #expect(ShoalServiceRecord(instance: "a b 0123456789ab 10", port: 9, txt: txt)?.name == "a b 0123456789ab 10")
        #expect(ShoalServiceRecord(instance: "a b 0123456789ab 9", port: 9, txt: txt)?.name == "a b")
        #expect(ShoalServiceRecord(instance: "", port: 9, txt: txt)?.name == "")
        #expect(ShoalServiceRecord(instance: "a b", port: 9, txt: txt)?.protocolVersion == "")
    }
}
