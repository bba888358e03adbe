import ShoalCore
import ShoalProtocol
import ShoalTestSupport
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

/// Compression before sealing: what a batch of text-heavy rows costs at the relay, and that members open change sets
/// sealed before compression existed as well as compressed ones, through the pull session the link runs.
@Suite struct RelayCompressionTests {
    private let seal = RelaySeal(clusterSecret: Array(repeating: 7, count: 32))
    private let site = SiteID(high: 5, low: 5)

    private func documents(_ count: Int) -> ChangeBatch {
        var generator = SplitMix(state: 9)
        let changes = (1...count).map { seq in
            Change(
                table: "kv",
                primaryKey: [.text("doc-\(seq)")],
                payload: .column("v", .text(JSONDocuments.document(seq, &generator))),
                causalLength: 1,
                stamp: Stamp(hlc: HLC(rawValue: UInt64(seq) << 16), site: site, seq: UInt64(seq))
            )
        }
        return ChangeBatch(changes: changes, claim: VersionVector([site: UInt64(count)]))
    }

    /// The changes a member takes from `envelopes` (one range), through the pull session as the link drives it.
    private func pulled(_ envelopes: [RelayEnvelope]) throws -> [Change] {
        var session = RelayPullSession(
            site: SiteID(high: 9, low: 9), cluster: "c", backoff: Backoff(initialMilliseconds: 10, maximumMilliseconds: 100)
        )
        _ = session.request(held: VersionVector(), now: 0, wait: 0, maximumBytes: 1 << 20)
        var changes: [Change] = []
        for envelope in envelopes {
            #expect(session.check(envelope, now: 0) == .open)
            let piece = session.opened(envelope, plaintext: Result { () throws(ShoalError) in try seal.open(envelope) }, now: 0)
            switch piece {
            case .apply(let batch, _): changes += batch.changes
            case .buffered: break
            case .skip: Issue.record("a change set was skipped: \(session.problems)")
            }
        }
        return changes
    }

    @Test func textRowsAreSealedCompressedInUnderFortyPercentAndOpenTheSame() throws {
        let batch = documents(400)
        var chunker = RelayChunker(cluster: "c", seal: seal, heads: VersionVector(), pieceBytes: 64 * 1024)
        let envelopes = try chunker.envelopes(for: batch)
        let uploaded = envelopes.reduce(0) { $0 + $1.encodedCount }
        #expect(chunker.plaintextBytes == batch.encodedBody().count)
        #expect(Double(uploaded) <= 0.4 * Double(chunker.plaintextBytes), "\(uploaded) of \(chunker.plaintextBytes)")
        #expect(chunker.sealedBytes <= uploaded)
        // The format is inside the seal: the relay's own version, then the compressed flag.
        #expect(try seal.open(envelopes[0]).prefix(2) == [RelaySealedBatch.version, 1])
        #expect(try pulled(envelopes) == batch.changes)
        // Turned off, the same batch is sealed as it is.
        var plain = RelayChunker(cluster: "c", seal: seal, heads: VersionVector(), pieceBytes: 64 * 1024, compressing: false)
        let plainEnvelopes = try plain.envelopes(for: batch)
        #expect(try seal.open(plainEnvelopes[0]).prefix(2) == [RelaySealedBatch.version, 0])
        #expect(plain.sealedBytes > chunker.sealedBytes * 2)
        #expect(try pulled(plainEnvelopes) == batch.changes)
    }

    /// A change set sealed by a member of an older build (a LAN change batch message, cut and sealed) opens.
    @Test func aChangeSetSealedBeforeCompressionStillOpens() throws {
        let batch = documents(40)
        let plaintext = WireMessage.changeBatch(ChangeBatchMessage(requestID: 0, isLast: true, batch: batch)).encoded()
        #expect(plaintext.count > 16 * 1024, "one piece: the change set is not cut")
        try opens(plaintext, batch)
    }

    /// A change set sealed by a member of a build that compressed but had no format of the relay's own (a LAN
    /// compressed frame holding a change batch message) opens.
    @Test func aChangeSetSealedAsACompressedFrameStillOpens() throws {
        let batch = documents(40)
        let packed = WireMessage.changeBatch(ChangeBatchMessage(requestID: 0, isLast: true, batch: batch))
            .packed(compressing: true)
        #expect(packed.payload.first == 13)
        try opens(packed.payload, batch)
    }

    /// `plaintext`, cut in pieces of 16 KiB and sealed as one range, opens to `batch`'s changes.
    private func opens(_ plaintext: [UInt8], _ batch: ChangeBatch) throws {
        let cut = stride(from: 0, to: plaintext.count, by: 16 * 1024).map { Array(plaintext[$0..<min(plaintext.count, $0 + 16 * 1024)]) }
        let envelopes = try cut.enumerated().map { index, piece in
            let last = index == cut.count - 1
            return try seal.seal(
                piece,
                into: RelayEnvelope(
                    cluster: "c", epoch: 0, site: site, from: 0, to: last ? 40 : 0, upload: 3, index: UInt32(index),
                    flags: last ? [.batchEnd, .rangeEnd] : [], sealed: []
                )
            )
        }
        #expect(try pulled(envelopes) == batch.changes)
    }

    /// Random bytes (an already-compressed BLOB) are sealed as they are.
    @Test func randomBlobsAreSealedAsTheyAre() throws {
        var generator = SplitMix(state: 4)
        let blob = (0..<200_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
        let change = Change(
            table: "kv", primaryKey: [.text("blob")], payload: .column("v", .blob(blob)), causalLength: 1,
            stamp: Stamp(hlc: HLC(rawValue: 1 << 16), site: site, seq: 1)
        )
        var chunker = RelayChunker(cluster: "c", seal: seal, heads: VersionVector(), pieceBytes: 1 << 20)
        let envelopes = try chunker.envelopes(for: ChangeBatch(changes: [change], claim: VersionVector([site: 1])))
        #expect(try seal.open(envelopes[0]).prefix(2) == [RelaySealedBatch.version, 0])
        #expect(try pulled(envelopes) == [change])
    }
}
