import Foundation
import ShoalCore
import ShoalRelay
import ShoalRelayClient
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@Suite struct RelayEnvelopeTests {
    private func sample(flags: RelayEnvelope.Flags = [.batchEnd, .rangeEnd], to: UInt64 = 9) -> RelayEnvelope {
        RelayEnvelope(
            cluster: "c1", epoch: 2, site: SiteID(high: 1, low: 2), from: 4, to: to, upload: 77, index: 3,
            flags: flags, sealed: Array(repeating: 5, count: 40)
        )
    }

    @Test func anEnvelopeRoundTripsAndEveryTruncationIsRefused() throws {
        let envelope = sample()
        let bytes = envelope.encoded()
        #expect(bytes.count == envelope.encodedCount)
        #expect(try RelayEnvelope.decode(bytes[...]) == envelope)
        for length in 0..<bytes.count {
            #expect(throws: ShoalError.self) { try RelayEnvelope.decode(bytes[0..<length]) }
        }
        #expect(throws: ShoalError.self) { try RelayEnvelope.decode((bytes + [0])[...]) }
        let list = RelayEnvelopeList.encode([envelope, envelope])
        #expect(try RelayEnvelopeList.decode(list, maximumEnvelopeBytes: 1000) == [envelope, envelope])
        #expect(throws: ShoalError.self) { try RelayEnvelopeList.decode(list, maximumEnvelopeBytes: 10) }
        #expect(throws: ShoalError.self) { try RelayEnvelopeList.decode(Array(list.dropLast()), maximumEnvelopeBytes: 1000) }
    }

    @Test func fieldsThatDisagreeAreRefused() {
        #expect(throws: ShoalError.self) { try self.sample(flags: [.batchEnd, .rangeEnd], to: 4).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: [.rangeEnd]).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: [.batchEnd], to: 9).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: RelayEnvelope.Flags(rawValue: 8), to: 0).validate() }
        var empty = sample()
        empty.sealed = []
        #expect(throws: ShoalError.self) { try empty.validate() }
        var noCluster = sample()
        noCluster.cluster = ""
        #expect(throws: ShoalError.self) { try noCluster.validate() }
    }

    @Test func aSealedBodyOpensOnlyWithItsKeyAndItsOwnHeader() throws {
        let seal = RelaySeal(clusterSecret: Array(repeating: 3, count: 32))
        let sealed = try seal.seal(Array("the changes".utf8), into: sample())
        #expect(try seal.open(sealed) == Array("the changes".utf8))
        #expect(!sealed.encoded().contains(subsequence: Array("the changes".utf8)))
        let other = RelaySeal(clusterSecret: Array(repeating: 4, count: 32))
        #expect(throws: ShoalError.self) { try other.open(sealed) }
        for change in [
            { (e: inout RelayEnvelope) in e.from += 1 }, { $0.site = SiteID(high: 9, low: 9) }, { $0.cluster = "c2" },
            { $0.index += 1 }, { $0.to += 1 }, { $0.sealed[20] ^= 1 },
        ] {
            var moved = sealed
            change(&moved)
            #expect(throws: ShoalError.self) { try seal.open(moved) }
        }
        var unknownEpoch = sealed
        unknownEpoch.epoch = 9
        #expect(throws: ShoalError.self) { try seal.open(unknownEpoch) }
    }
}

extension Array where Element == UInt8 {
    fileprivate func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        return (0...(count - subsequence.count)).contains { Array(self[$0..<$0 + subsequence.count]) == subsequence }
    }
}

@Suite struct SQLiteRelayStorageTests {
    private func chunk(_ site: SiteID, from: UInt64, to: UInt64 = 0, upload: UInt64, index: UInt32, end: Bool)
        -> (envelope: RelayEnvelope, encoded: [UInt8])
    {
        let envelope = RelayEnvelope(
            cluster: "c", epoch: 0, site: site, from: from, to: end ? to : 0, upload: upload, index: index,
            flags: end ? [.batchEnd, .rangeEnd] : [.batchEnd], sealed: Array(repeating: UInt8(index), count: 100)
        )
        return (envelope, envelope.encoded())
    }

    @Test func rangesChainPerSiteAndAPullResumesInsideOne() async throws {
        let directory = try temporaryDirectory("relay-storage")
        defer { try? FileManager.default.removeItem(at: directory) }
        let storage = try SQLiteRelayStorage(directory: directory.path)
        let site = SiteID(high: 0, low: 1)
        // Upload 1: a range of three chunks after 0, to 5. Upload 2 raced for the same range and loses.
        var result = try await storage.store(cluster: "c", envelopes: [
            chunk(site, from: 0, upload: 2, index: 0, end: false),
            chunk(site, from: 0, upload: 1, index: 0, end: false),
            chunk(site, from: 0, upload: 1, index: 1, end: false),
        ], uploader: nil)
        #expect(result.stored == 3)
        #expect(try await storage.heads(cluster: "c")[site] == 0)
        result = try await storage.store(cluster: "c", envelopes: [chunk(site, from: 0, to: 5, upload: 1, index: 2, end: true)], uploader: nil)
        #expect(result.heads[site.hex] == 5)
        // The loser's chunk went; the winner's upload again is held.
        result = try await storage.store(cluster: "c", envelopes: [chunk(site, from: 0, to: 5, upload: 2, index: 1, end: true)], uploader: nil)
        #expect(result.alreadyHeld == 1)
        // A final chunk whose earlier ones never came is refused (a gap), and the head does not move.
        result = try await storage.store(cluster: "c", envelopes: [chunk(site, from: 5, to: 8, upload: 3, index: 2, end: true)], uploader: nil)
        #expect(result.gaps == 1)
        #expect(try await storage.heads(cluster: "c")[site] == 5)
        result = try await storage.store(cluster: "c", envelopes: [chunk(site, from: 5, to: 8, upload: 4, index: 0, end: true)], uploader: nil)
        #expect(result.heads[site.hex] == 8)
        // Another cluster sees none of it.
        #expect(try await storage.heads(cluster: "other").isEmpty)
        // A pull from nothing: every chunk, in order; a small budget stops after the first, and resumes.
        let all = try await storage.page(cluster: "c", vector: VersionVector(), resume: [:], maximumBytes: 1 << 20, uploader: nil)
        #expect(all.envelopes.count == 4)
        #expect(!all.more)
        let first = try await storage.page(cluster: "c", vector: VersionVector(), resume: [:], maximumBytes: 10, uploader: nil)
        #expect(first.envelopes.count == 1)
        #expect(first.more)
        let rest = try await storage.page(cluster: "c", vector: VersionVector(), resume: [site: (0, 1)], maximumBytes: 1 << 20, uploader: nil)
        #expect(rest.envelopes == Array(all.envelopes.dropFirst()))
        // A node that holds up to 6 (from a LAN peer) gets the range that holds 6 and what follows.
        let later = try await storage.page(cluster: "c", vector: VersionVector([site: 6]), resume: [:], maximumBytes: 1 << 20, uploader: nil)
        #expect(later.envelopes == [all.envelopes[3]])
        #expect(try await storage.page(cluster: "c", vector: VersionVector([site: 8]), resume: [:], maximumBytes: 1 << 20, uploader: nil).envelopes.isEmpty)
        // The process that uploaded ranges is not sent them back.
        let mine = try await storage.store(cluster: "c", envelopes: [chunk(site, from: 8, to: 9, upload: 5, index: 0, end: true)], uploader: "me")
        #expect(mine.stored == 1)
        let forMe = try await storage.page(cluster: "c", vector: VersionVector([site: 8]), resume: [:], maximumBytes: 1 << 20, uploader: "me")
        #expect(forMe.envelopes.isEmpty)
        let forOthers = try await storage.page(cluster: "c", vector: VersionVector([site: 8]), resume: [:], maximumBytes: 1 << 20, uploader: "other")
        #expect(forOthers.envelopes.count == 1)
        let statistics = try await storage.statistics()
        #expect(statistics.first?.ranges == 3)
    }

    @Test func tokensReachOneClusterAndRevokedOnesAreKeptAsRevoked() async throws {
        let directory = try temporaryDirectory("relay-tokens")
        defer { try? FileManager.default.removeItem(at: directory) }
        let storage = try SQLiteRelayStorage(directory: directory.path)
        let token = try await storage.createToken(cluster: "c", label: "shop")
        let record = try #require(try await storage.token(hash: RelayTokens.hash(token)))
        #expect(record.cluster == "c")
        #expect(record.revoked == nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 1)
        #expect(try await storage.token(hash: RelayTokens.hash(token))?.revoked != nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 0)
        // The database holds hashes only.
        let bytes = try Data(contentsOf: directory.appendingPathComponent("relay.sqlite"))
            + ((try? Data(contentsOf: directory.appendingPathComponent("relay.sqlite-wal"))) ?? Data())
        #expect(bytes.range(of: Data(token.utf8)) == nil)
    }
}
