import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// Every storage rule, run against both storages (``RelayRules`` is one, each storage only runs its statements).
@Suite struct RelayStorageRulesTests {
    private let site = SiteID(high: 0, low: 1)
    private let other = SiteID(high: 0, low: 2)
    private let keepAll = RelayRetention(maximumAgeMilliseconds: 1 << 40, maximumBytes: 1 << 40)

    @Test(arguments: StorageKind.allCases) func uploadsAreInsertOrIgnoreByDot(_ kind: StorageKind) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-dot")
        defer { Task { await cleanUp() } }
        let range = TestChunks.range(site, from: 0, to: 3, upload: 1, count: 2)
        #expect(try await storage.store(cluster: "c", envelopes: range, uploader: nil).stored == 2)
        // The same chunks again, and the same range under another upload id: nothing stored twice.
        var again = try await storage.store(cluster: "c", envelopes: range, uploader: nil)
        #expect((again.stored, again.alreadyHeld, again.gaps) == (0, 2, 0))
        again = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 0, to: 3, upload: 9),
            uploader: nil
        )
        #expect((again.stored, again.alreadyHeld, again.gaps) == (0, 1, 0))
        #expect(again.heads == [site.hex: 3])
        let statistics = try await storage.statistics()
        #expect(statistics.map(\.ranges) == [1])
        #expect(statistics.map(\.chunks) == [2])
        let all = try await TestChunks.pullAll(storage, maximumBytes: 1 << 20)
        #expect(all.envelopes.map(\.upload) == [1, 1])
    }

    @Test(arguments: StorageKind.allCases) func aChunkNumberedPastItsRangesEndIsNeverServed(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-past-end")
        defer { Task { await cleanUp() } }
        // Chunk 2 of upload 1 arrives before chunk 1, which ends the range: the range is chunks 0 and 1.
        let stored = try await storage.store(
            cluster: "c",
            envelopes: [
                TestChunks.chunk(site, from: 0, upload: 1, index: 0, end: false),
                TestChunks.chunk(site, from: 0, upload: 1, index: 2, end: false),
                TestChunks.chunk(site, from: 0, to: 2, upload: 1, index: 1, end: true),
            ],
            uploader: nil
        )
        #expect(stored.heads == [site.hex: 2])
        #expect(try await TestChunks.pullAll(storage, maximumBytes: 1 << 20).envelopes.map(\.index) == [0, 1])
        #expect(try await TestChunks.pullAll(storage, maximumBytes: 1).envelopes.map(\.index) == [0, 1])
    }

    @Test(arguments: StorageKind.allCases) func rangesChainPerSiteAndAPullResumesInsideOne(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-storage")
        defer { Task { await cleanUp() } }
        let chunk = { (from: UInt64, to: UInt64, upload: UInt64, index: UInt32, end: Bool) in
            TestChunks.chunk(self.site, from: from, to: to, upload: upload, index: index, end: end)
        }
        // Upload 1: a range of three chunks after 0, to 5. Upload 2 raced for the same range and loses.
        var result = try await storage.store(
            cluster: "c",
            envelopes: [chunk(0, 0, 2, 0, false), chunk(0, 0, 1, 0, false), chunk(0, 0, 1, 1, false)],
            uploader: nil
        )
        #expect(result.stored == 3)
        #expect(try await storage.heads(cluster: "c")[site] == 0)
        result = try await storage.store(cluster: "c", envelopes: [chunk(0, 5, 1, 2, true)], uploader: nil)
        #expect(result.heads[site.hex] == 5)
        // The loser's chunk went; the winner's upload again is held.
        result = try await storage.store(cluster: "c", envelopes: [chunk(0, 5, 2, 1, true)], uploader: nil)
        #expect(result.alreadyHeld == 1)
        // A final chunk whose earlier ones never came is refused (a gap), and the head does not move.
        result = try await storage.store(cluster: "c", envelopes: [chunk(5, 8, 3, 2, true)], uploader: nil)
        #expect(result.gaps == 1)
        #expect(try await storage.heads(cluster: "c")[site] == 5)
        result = try await storage.store(cluster: "c", envelopes: [chunk(5, 8, 4, 0, true)], uploader: nil)
        #expect(result.heads[site.hex] == 8)
        // Another cluster sees none of it.
        #expect(try await storage.heads(cluster: "other").isEmpty)
        // A pull from nothing: every chunk, in order; a small budget stops after the first, and resumes.
        let all = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [:],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(all.envelopes.count == 4)
        #expect(!all.more)
        let first = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [:],
            maximumBytes: 10,
            uploader: nil
        )
        #expect(first.envelopes.count == 1)
        #expect(first.more)
        let rest = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [site: (0, 1)],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(rest.envelopes == Array(all.envelopes.dropFirst()))
        // A node that holds up to 6 (from a LAN peer) gets the range that holds 6 and what follows.
        let later = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 6]),
            resume: [:],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(later.envelopes == [all.envelopes[3]])
        #expect(
            try await storage.page(
                cluster: "c",
                vector: VersionVector([site: 8]),
                resume: [:],
                maximumBytes: 1 << 20,
                uploader: nil
            ).envelopes.isEmpty
        )
        // The process that uploaded ranges is not sent them back.
        let mine = try await storage.store(cluster: "c", envelopes: [chunk(8, 9, 5, 0, true)], uploader: "me")
        #expect(mine.stored == 1)
        let forMe = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 8]),
            resume: [:],
            maximumBytes: 1 << 20,
            uploader: "me"
        )
        #expect(forMe.envelopes.isEmpty)
        let forOthers = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 8]),
            resume: [:],
            maximumBytes: 1 << 20,
            uploader: "other"
        )
        #expect(forOthers.envelopes.count == 1)
        let statistics = try await storage.statistics()
        #expect(statistics.first?.ranges == 3)
    }

    @Test(arguments: StorageKind.allCases) func aRangeThatWouldLeaveAGapIsRefusedWithTheHeads(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-gap")
        defer { Task { await cleanUp() } }
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 0, to: 2, upload: 1),
            uploader: nil
        )
        let refused = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 4, to: 6, upload: 2, count: 3),
            uploader: nil
        )
        #expect((refused.stored, refused.gaps) == (0, 3))
        #expect(refused.heads == [site.hex: 2])
        // In one upload, ranges that chain are taken in order: the second starts where the first ends.
        let chained = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 2, to: 4, upload: 3)
                + TestChunks.range(site, from: 4, to: 6, upload: 4)
                + TestChunks.range(other, from: 0, to: 1, upload: 5),
            uploader: nil
        )
        #expect((chained.stored, chained.gaps) == (3, 0))
        #expect(try await storage.heads(cluster: "c") == VersionVector([site: 6, other: 1]))
    }

    @Test(arguments: StorageKind.allCases) func pagesAreBoundedAndAPullResumedPageAfterPageGetsEachChunkOnce(
        _ kind: StorageKind
    ) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-pages")
        defer { Task { await cleanUp() } }
        var uploaded: [(site: SiteID, from: UInt64, index: UInt32)] = []
        for (index, (from, to)) in [(0, 3), (3, 4), (4, 9)].enumerated() {
            for site in [site, other] {
                let range = TestChunks.range(
                    site,
                    from: UInt64(from),
                    to: UInt64(to),
                    upload: UInt64(index + 1),
                    count: 4
                )
                _ = try await storage.store(cluster: "c", envelopes: range, uploader: nil)
                if site == self.site {
                    uploaded += range.map { ($0.envelope.site, $0.envelope.from, $0.envelope.index) }
                }
            }
        }
        // Each chunk is about 180 bytes: pages of 400 bytes carry at most three.
        let pulled = try await TestChunks.pullAll(storage, maximumBytes: 400)
        #expect(pulled.envelopes.count == 24)
        #expect(pulled.pages >= 8)
        let ofSite = pulled.envelopes.filter { $0.site == site }.map { ($0.site, $0.from, $0.index) }
        #expect(ofSite.elementsEqual(uploaded) { $0 == $1 })
        for size in [1, 200, 1 << 20] {
            let page = try await storage.page(
                cluster: "c",
                vector: VersionVector(),
                resume: [:],
                maximumBytes: size,
                uploader: nil
            )
            let bytes = page.envelopes.dropLast().reduce(0) { $0 + $1.count }
            #expect(bytes < max(size, 1), "a page goes over its budget by its last chunk at most")
            #expect(page.more == (size < 1 << 20))
        }
        // The uploader of a range is never sent it, whatever the page size; others get it all.
        _ = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 9, to: 10, upload: 7, count: 3),
            uploader: "u1"
        )
        let vector = VersionVector([site: 9, other: 9])
        #expect(
            try await TestChunks.pullAll(storage, from: vector, maximumBytes: 200, uploader: "u1").envelopes.isEmpty
        )
        #expect(
            try await TestChunks.pullAll(storage, from: vector, maximumBytes: 200, uploader: "u2").envelopes.count == 3
        )
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

    @Test func anUploadWhoseTaskIsCancelledStillEndsItsTransaction() async throws {
        let (storage, _, cleanUp) = try await StorageKind.sqlite.open("relay-cancelled")
        defer { Task { await cleanUp() } }
        let range = TestChunks.range(site, from: 0, to: 2, upload: 1, count: 3)
        // The embedded storage runs each statement on its own thread: a task cancelled meanwhile (a request whose
        // client went away) neither skips statements of its transaction nor leaves the transaction open.
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await storage.store(cluster: "c", envelopes: range, uploader: nil)
        }
        #expect(try await cancelled.value.stored == 3)
        let next = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 2, to: 3, upload: 2),
            uploader: nil
        )
        #expect(next.heads == [site.hex: 3])
    }

    @Test(arguments: StorageKind.allCases) func epochsKeysAndGrants(_ kind: StorageKind) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-epochs")
        defer { Task { await cleanUp() } }
        let first = try await storage.createToken(cluster: "c", label: "first")
        let elsewhere = try await storage.createToken(cluster: "d", label: "other cluster")
        // Epoch 0's upload key: the first registration holds, another key is refused, the same one is fine.
        #expect(try await storage.uploadKey(cluster: "c", epoch: 0) == (nil, 0))
        #expect(try await storage.registerUploadKey(cluster: "c", epoch: 0, key: [1, 2, 3]))
        #expect(try await !storage.registerUploadKey(cluster: "c", epoch: 0, key: [9]))
        #expect(try await storage.registerUploadKey(cluster: "c", epoch: 0, key: [1, 2, 3]))
        // Grants for an epoch that does not exist are not stored.
        #expect(
            try await storage.addGrants(cluster: "c", grants: [RelayGrant(epoch: 1, recipient: "n1", body: "g")]) == 0
        )
        // A rotation to epoch 1: its grants and key, every earlier token of the cluster retired, the new token in.
        let grant = RelayGrant(epoch: 1, recipient: "n1", body: "for n1")
        let outcome = try await storage.rotate(
            cluster: "c",
            epoch: 1,
            tokenHash: "hash-1",
            grants: [grant, RelayGrant(epoch: 2, recipient: "x", body: "")],
            uploadKey: [4, 5]
        )
        #expect(outcome == .rotated)
        let retired = try #require(try await storage.token(hash: RelayTokens.hash(first)))
        #expect(retired.revoked != nil)
        #expect(retired.rotatedAtEpoch == 1)
        #expect(try await storage.token(hash: RelayTokens.hash(elsewhere))?.revoked == nil)
        let made = try #require(try await storage.token(hash: "hash-1"))
        #expect((made.cluster, made.revoked, made.label) == ("c", nil, "key epoch 1"))
        // The epoch is taken once; a rotation that skips one is refused the same way.
        #expect(
            try await storage.rotate(cluster: "c", epoch: 1, tokenHash: "hash-x", grants: [], uploadKey: nil)
                == .taken(current: 1)
        )
        #expect(
            try await storage.rotate(cluster: "c", epoch: 3, tokenHash: "hash-x", grants: [], uploadKey: nil)
                == .taken(current: 1)
        )
        #expect(try await storage.token(hash: "hash-x") == nil)
        // Epoch 0 is retired: its key is still known, and the newest epoch says uploads under it are refused.
        #expect(try await storage.uploadKey(cluster: "c", epoch: 0) == ([1, 2, 3], 1))
        #expect(try await storage.uploadKey(cluster: "c", epoch: 1) == ([4, 5], 1))
        #expect(try await storage.uploadKey(cluster: "d", epoch: 0) == (nil, 0))
        // Grants left later for members who join: new ones stored once, those already held ignored.
        let later = [RelayGrant(epoch: 1, recipient: "n2", body: "for n2"), grant]
        #expect(try await storage.addGrants(cluster: "c", grants: later) == 1)
        #expect(try await storage.addGrants(cluster: "c", grants: later) == 0)
        let grants = try await storage.grants(cluster: "c", after: 0)
        #expect(grants.epoch == 1)
        #expect(grants.grants.map(\.recipient) == ["n1", "n2"])
        #expect(try await storage.grants(cluster: "c", after: 1).grants.isEmpty)
        #expect(try await storage.grants(cluster: "d", after: 0) == RelayGrants(grants: [], epoch: 0))
    }

    @Test(arguments: StorageKind.allCases) func tokensReachOneClusterAndRevokedOnesAreKeptAsRevoked(
        _ kind: StorageKind
    ) async throws {
        let (storage, place, cleanUp) = try await kind.open("relay-tokens")
        defer { Task { await cleanUp() } }
        let token = try await storage.createToken(cluster: "c", label: "shop")
        let record = try #require(try await storage.token(hash: RelayTokens.hash(token)))
        #expect(record.cluster == "c")
        #expect(record.revoked == nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 1)
        #expect(try await storage.token(hash: RelayTokens.hash(token))?.revoked != nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 0)
        _ = try await storage.createToken(cluster: "c", label: "two")
        _ = try await storage.createToken(cluster: "c", label: "three")
        #expect(try await storage.revokeTokens(matching: "c", wholeCluster: true) == 2)
        #expect(Set(try await storage.tokens().map(\.label)) == ["shop", "two", "three"])
        // The database holds hashes only.
        let bytes: Data
        switch kind {
        case .sqlite:
            let directory = URL(fileURLWithPath: place)
            bytes =
                try Data(contentsOf: directory.appendingPathComponent("relay.sqlite"))
                + ((try? Data(contentsOf: directory.appendingPathComponent("relay.sqlite-wal"))) ?? Data())
        case .postgres:
            let dump = try await offPool {
                try runProcess(URL(fileURLWithPath: "/usr/bin/pg_dump"), ["--data-only", place])
            }
            #expect(dump.status == 0)
            #expect(dump.stdout.contains(RelayTokens.hash(token)))
            bytes = Data(dump.stdout.utf8)
        }
        #expect(bytes.range(of: Data(token.utf8)) == nil)
    }
}
