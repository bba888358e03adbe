import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalTransport

extension SyncNode {
    /// Records, as a report row would, that `site` held nothing more as of `milliseconds`.
    fileprivate func heard(_ site: SiteID, at milliseconds: UInt64) {
        _ = members.heard(site, holds: VersionVector(), at: milliseconds, from: .replicated)
    }
}

/// Who is silent past the horizon (``SyncNode/silentMembers()``), on a running node with a clock the test drives.
@Suite struct SilenceTests {
    /// A node just started (or back after an absence) holds only old reports of the members it did not meet yet: it
    /// counts none of them silent before it had a horizon to hear from them. A member back through the relay once
    /// collected without members online all along at its first pass, and they took fresh states they did not need.
    @Test func aNodeJustStartedCountsNoMemberSilentBeforeItHadAHorizonToHear() async throws {
        let directory = try temporaryDirectory("silence-start")
        defer { try? FileManager.default.removeItem(at: directory) }
        let clock = ManualWallClock(milliseconds: 1_800_000_000_000)
        let running = try await startNode(in: directory, name: "a") { configuration in
            configuration.clock = clock
            configuration.collectionHorizonMilliseconds = 1_000
        }
        let node = running.node
        let (recent, away) = (SiteID(high: 7, low: 1), SiteID(high: 7, low: 2))
        await node.setMembers([recent, away])
        // What it kept: one member reported just now, the other long ago (as old as this node's own absence).
        await node.heard(recent, at: clock.nowMilliseconds())
        await node.heard(away, at: clock.nowMilliseconds() - 60_000)
        #expect(await node.silentMembers().isEmpty)
        // A horizon later, still nothing from the one: silent now.
        clock.advance(by: 1_001)
        await node.heard(recent, at: clock.nowMilliseconds())
        #expect(await node.silentMembers() == [away])
        await running.stop()
    }
}
