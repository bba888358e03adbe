import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// The storage rules of snapshots and the retention, run against both storages: completion, replacement, drops that
/// never leave a hole in a site, the snapshot as fallback, the sweep of uploads never completed.
@Suite struct RelayStorageRetentionTests {
    private let site = SiteID(high: 0, low: 1)
    private let other = SiteID(high: 0, low: 2)
    private let keepAll = RelayRetention(maximumAgeMilliseconds: 1 << 40, maximumBytes: 1 << 40)

    /// A site a pull names in `snapshotSites` comes from the snapshot first, where it holds more of it than the node,
    /// then from the change log after it; the other sites, and a named site the snapshot holds no more of, from the
    /// log alone.
    @Test(arguments: StorageKind.allCases) func aSiteAskedFromTheSnapshotComesFromItFirstThenFromTheLog(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-snapshot-sites")
        defer { Task { await cleanUp() } }
        // The log: site 0...4, then 4...33 (a removed member's range past its fence); other 0...2.
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 0, to: 4, upload: 1)
                + TestChunks.range(site, from: 4, to: 33, upload: 2)
                + TestChunks.range(other, from: 0, to: 2, upload: 3),
            uploader: nil
        )
        // A member's snapshot: site up to its fence (14), other up to 2.
        _ = try await storage.store(
            cluster: "c",
            snapshot: 9,
            envelopes: TestChunks.range(site, from: 0, to: 14, upload: 4, count: 2)
                + TestChunks.range(other, from: 0, to: 2, upload: 5),
            uploader: nil
        )
        #expect(
            try await storage.completeSnapshot(
                cluster: "c", snapshot: 9, vector: VersionVector([site: 14, other: 2]), retention: keepAll
            ) == .completed(dropped: 0)
        )
        func page(_ vector: VersionVector, _ named: Set<SiteID>) async throws -> [String] {
            try await storage.page(
                cluster: "c", vector: vector, resume: [:], snapshotSites: named, maximumBytes: 1 << 20, uploader: nil
            ).envelopes.map { bytes in
                let envelope = try RelayEnvelope.decode(bytes[...])
                return "\(envelope.site == site ? "s" : "o") \(envelope.from)-\(envelope.index)"
            }
        }
        let held = VersionVector([site: 4, other: 0])
        #expect(try await page(held, []) == ["s 4-0", "o 0-0"])
        #expect(try await page(held, [site]) == ["s 0-0", "s 0-1", "s 4-0", "o 0-0"])
        // Holding what the snapshot has of the site, the log alone serves it.
        #expect(try await page(VersionVector([site: 14, other: 2]), [site]) == ["s 4-0"])
    }

    @Test(arguments: StorageKind.allCases) func aSnapshotCountsOnlyWhenItsRangesRunToItsVector(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-snapshot")
        defer { Task { await cleanUp() } }
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 0, to: 4, upload: 1),
            uploader: nil
        )
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(other, from: 0, to: 2, upload: 2),
            uploader: nil
        )
        #expect(try await storage.snapshotState(cluster: "c").uncoveredBytes > 0)
        // Snapshot 5 holds site up to 4 only: claiming other too is refused, and a snapshot that claims nothing.
        _ = try await storage.store(
            cluster: "c",
            snapshot: 5,
            envelopes: TestChunks.range(site, from: 0, to: 4, upload: 3, count: 2),
            uploader: nil
        )
        let wide = try await storage.completeSnapshot(
            cluster: "c",
            snapshot: 5,
            vector: VersionVector([site: 4, other: 2]),
            retention: keepAll
        )
        guard case .incomplete = wide else { throw TestSetupError("an incomplete snapshot was taken: \(wide)") }
        guard
            case .incomplete = try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 5,
                vector: VersionVector(),
                retention: keepAll
            )
        else { throw TestSetupError("an empty snapshot was taken") }
        #expect(try await storage.snapshotState(cluster: "c").snapshot == nil)
        // Its ranges do not move the change log's heads.
        #expect(try await storage.heads(cluster: "c") == VersionVector([site: 4, other: 2]))
        _ = try await storage.store(
            cluster: "c",
            snapshot: 5,
            envelopes: TestChunks.range(other, from: 0, to: 2, upload: 4),
            uploader: nil
        )
        #expect(
            try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 5,
                vector: VersionVector([site: 4, other: 2]),
                retention: keepAll
            ) == .completed(dropped: 0)
        )
        let state = try await storage.snapshotState(cluster: "c")
        #expect(state.snapshot?.id == 5)
        #expect(state.snapshot?.vector == VersionVector([site: 4, other: 2]))
        #expect(state.uncoveredBytes == 0)
        // A newer snapshot replaces it, and what it held goes.
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 4, to: 6, upload: 5),
            uploader: nil
        )
        #expect(try await storage.snapshotState(cluster: "c").uncoveredBytes > 0)
        _ = try await storage.store(
            cluster: "c",
            snapshot: 6,
            envelopes: TestChunks.range(site, from: 0, to: 6, upload: 6)
                + TestChunks.range(other, from: 0, to: 2, upload: 7),
            uploader: nil
        )
        #expect(
            try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 6,
                vector: VersionVector([site: 6, other: 2]),
                retention: keepAll
            ) == .completed(dropped: 0)
        )
        #expect(try await storage.snapshotState(cluster: "c").snapshot?.id == 6)
        let statistics = try await storage.statistics()
        #expect(statistics.first?.ranges == 3 + 2, "the log's three ranges and the newest snapshot's two")
    }

    @Test(arguments: StorageKind.allCases) func retentionDropsOnlyCoveredRangesAndNeverLeavesAHoleInASite(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-retention")
        defer { Task { await cleanUp() } }
        // Per site a chain of four ranges; the snapshot covers three of each.
        for (index, (from, to)) in [(0, 2), (2, 4), (4, 6), (6, 8)].enumerated() {
            for (offset, site) in [site, other].enumerated() {
                let count: UInt32 = index == 2 && site == other ? 3 : 1
                let range = TestChunks.range(
                    site,
                    from: UInt64(from),
                    to: UInt64(to),
                    upload: UInt64(10 * index + offset + 1),
                    count: count
                )
                _ = try await storage.store(cluster: "c", envelopes: range, uploader: nil)
            }
        }
        let covered = VersionVector([site: 6, other: 6])
        _ = try await storage.store(
            cluster: "c",
            snapshot: 3,
            envelopes: TestChunks.range(site, from: 0, to: 6, upload: 100)
                + TestChunks.range(other, from: 0, to: 6, upload: 101),
            uploader: nil
        )
        // A budget that holds the newest covered range of site but not other's bigger one: other's older ranges go
        // with it, whatever their size.
        let budget = RelayRetention(maximumAgeMilliseconds: 1 << 40, maximumBytes: 250)
        #expect(
            try await storage.completeSnapshot(cluster: "c", snapshot: 3, vector: covered, retention: budget)
                == .completed(dropped: 5)
        )
        // What is kept of each site runs on from the snapshot without a hole, and never loses an uncovered range.
        let log = try await TestChunks.pullAll(storage, from: covered, maximumBytes: 1 << 20)
        #expect(log.envelopes.filter { $0.site == site }.map(\.from) == [6])
        #expect(log.envelopes.filter { $0.site == other }.map(\.from) == [6])
        let fromFour = try await TestChunks.pullAll(
            storage,
            from: VersionVector([site: 4, other: 4]),
            maximumBytes: 1 << 20
        )
        #expect(fromFour.envelopes.filter { $0.site == site }.map(\.upload) == [21, 31])
        // Other's log now starts after 6: a node at 4 gets other's snapshot range, then the log after it.
        #expect(fromFour.envelopes.filter { $0.site == other }.map(\.upload) == [101, 32])
        // The retention over every cluster drops the rest once nothing is kept; uncovered ranges stay.
        let none = RelayRetention(maximumAgeMilliseconds: 0, maximumBytes: 0)
        #expect(try await storage.retain(none) == 1)
        #expect(try await storage.retain(none) == 0)
        #expect(try await storage.heads(cluster: "c") == VersionVector([site: 8, other: 8]))
    }

    @Test(arguments: StorageKind.allCases) func aNodeOlderThanTheLogGetsTheSnapshotThenWhatFollows(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-fallback")
        defer { Task { await cleanUp() } }
        for (from, to, upload) in [(0, 2, 1), (2, 4, 2), (4, 6, 3)] as [(UInt64, UInt64, UInt64)] {
            _ = try await storage.store(
                cluster: "c",
                envelopes: TestChunks.range(site, from: from, to: to, upload: upload),
                uploader: nil
            )
        }
        _ = try await storage.store(
            cluster: "c",
            snapshot: 9,
            envelopes: TestChunks.range(site, from: 0, to: 4, upload: 7, count: 3),
            uploader: nil
        )
        let none = RelayRetention(maximumAgeMilliseconds: 0, maximumBytes: 0)
        #expect(
            try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 9,
                vector: VersionVector([site: 4]),
                retention: none
            )
                == .completed(dropped: 2)
        )
        // A node that never was online: the snapshot (all its chunks, in pages that resume inside it), then the log.
        let fresh = try await TestChunks.pullAll(storage, maximumBytes: 150)
        #expect(fresh.envelopes.map(\.upload) == [7, 7, 7, 3])
        #expect(fresh.envelopes.map(\.index) == [0, 1, 2, 0])
        // One that holds up to 1 (inside what went): the same. One that holds 4 goes on from the log.
        #expect(
            try await TestChunks.pullAll(storage, from: VersionVector([site: 1]), maximumBytes: 1 << 20).envelopes.map(
                \.upload
            )
                == [7, 7, 7, 3]
        )
        #expect(
            try await TestChunks.pullAll(storage, from: VersionVector([site: 4]), maximumBytes: 1 << 20).envelopes.map(
                \.upload
            )
                == [3]
        )
    }

    @Test(arguments: StorageKind.allCases) func aPullThatMeetsAHoleInTheLogGetsTheSnapshotFirst(
        _ kind: StorageKind
    ) async throws {
        let (storage, place, cleanUp) = try await kind.open("relay-hole")
        defer { Task { await cleanUp() } }
        for (from, to, upload) in [(0, 2, 1), (2, 4, 2), (4, 6, 3)] as [(UInt64, UInt64, UInt64)] {
            _ = try await storage.store(
                cluster: "c",
                envelopes: TestChunks.range(site, from: from, to: to, upload: upload),
                uploader: nil
            )
        }
        _ = try await storage.store(
            cluster: "c",
            snapshot: 9,
            envelopes: TestChunks.range(site, from: 0, to: 6, upload: 7),
            uploader: nil
        )
        #expect(
            try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 9,
                vector: VersionVector([site: 6]),
                retention: keepAll
            )
                == .completed(dropped: 0)
        )
        // A hole in the log, as an earlier retention by bytes could leave: the middle range gone.
        let ranges = kind == .postgres ? "shoal_relay.ranges" : "ranges"
        try await kind.run("DELETE FROM \(ranges) WHERE snapshot = 0 AND from_seq = 2", at: place)
        // A node holding up to 2 cannot go on from the log: it gets the snapshot, and nothing of the log it covers.
        let page = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 2]),
            resume: [:],
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        let uploads = try page.envelopes.map { try RelayEnvelope.decode($0[...]).upload }
        #expect(uploads == [7])
        // One holding up to 4 (from a LAN peer) goes on from the log as before.
        let later = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 4]),
            resume: [:],
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(try later.envelopes.map { try RelayEnvelope.decode($0[...]).upload } == [3])
    }

    @Test(arguments: StorageKind.allCases) func chunksOfUploadsThatNeverCompletedAreSwept(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-sweep")
        defer { Task { await cleanUp() } }
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 0, to: 2, upload: 1, count: 2),
            uploader: nil
        )
        _ = try await storage.store(
            cluster: "c",
            envelopes: Array(TestChunks.range(site, from: 2, to: 4, upload: 2, count: 3).prefix(2)),
            uploader: nil
        )
        _ = try await storage.store(
            cluster: "c",
            snapshot: 4,
            envelopes: TestChunks.range(site, from: 0, to: 2, upload: 3),
            uploader: nil
        )
        #expect(try await storage.sweep(before: 0) == 0)
        // The two chunks of the range never ended, and the snapshot never completed.
        #expect(try await storage.sweep(before: RelayRules<SQLiteRelayDatabase>.now() + 1_000) == 3)
        #expect(try await TestChunks.pullAll(storage, maximumBytes: 1 << 20).envelopes.map(\.upload) == [1, 1])
        #expect(try await storage.statistics().map(\.ranges) == [1])
    }
}
