import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// The storage rules of uploads and pulls, run against both storages (``RelayRules`` is one; each storage only runs
/// its statements): insert-or-ignore by dot, ranges chained per site and their heads, gaps, pages and resume points,
/// the uploader skip.
@Suite struct RelayStorageRulesTests {
    private let site = SiteID(high: 0, low: 1)
    private let other = SiteID(high: 0, low: 2)

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
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(all.envelopes.count == 4)
        #expect(!all.more)
        let first = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [:],
            snapshotSites: [],
            maximumBytes: 10,
            uploader: nil
        )
        #expect(first.envelopes.count == 1)
        #expect(first.more)
        let rest = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [site: (0, 1)],
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(rest.envelopes == Array(all.envelopes.dropFirst()))
        // A node that holds up to 6 (from a LAN peer) gets the range that holds 6 and what follows.
        let later = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 6]),
            resume: [:],
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(later.envelopes == [all.envelopes[3]])
        #expect(
            try await storage.page(
                cluster: "c",
                vector: VersionVector([site: 8]),
                resume: [:],
                snapshotSites: [],
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
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: "me"
        )
        #expect(forMe.envelopes.isEmpty)
        let forOthers = try await storage.page(
            cluster: "c",
            vector: VersionVector([site: 8]),
            resume: [:],
            snapshotSites: [],
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
                snapshotSites: [],
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
}
