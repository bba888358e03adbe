import ShoalCore
import ShoalProtocol
import ShoalRelayClient
import Testing

/// The relay's own format for what members seal (``RelaySealedBatch``): versioned apart from the LAN wire protocol,
/// round trips plain and compressed, refuses what it does not know, and still reads change sets as older members
/// sealed them (a LAN change batch message or a compressed frame holding one).
@Suite struct RelaySealedBatchTests {
    private let site = SiteID(high: 3, low: 4)
    private let maximum = 1 << 20

    private func batch(_ count: Int, text: String = "a note") -> ChangeBatch {
        let changes = (1...count).map { (seq: Int) -> Change in
            let deleted = seq % 3 == 0
            let payload: Change.Payload = deleted ? .row : .column("v", .text("\(text) \(seq)"))
            return Change(
                table: seq % 2 == 0 ? "notes" : "kv", primaryKey: [.integer(Int64(seq)), .text("k")],
                payload: payload, causalLength: deleted ? 2 : 1,
                stamp: Stamp(hlc: HLC(rawValue: UInt64(seq) << 16), site: site, seq: UInt64(seq))
            )
        }
        return ChangeBatch(changes: changes, claim: VersionVector([site: UInt64(count), SiteID(high: 1, low: 1): 7]))
    }

    @Test func roundTripsPlainAndCompressed() throws {
        let small = batch(3)
        let plain = RelaySealedBatch.encoded(small, compressing: true)
        // Too small to pay: as it is, after the version and no flags.
        #expect(plain.payload.prefix(2) == [RelaySealedBatch.version, 0])
        #expect(plain.uncompressedCount == small.encodedBody().count)
        #expect(try RelaySealedBatch.decode(plain.payload, maximumInflatedLength: maximum) == small)
        let large = batch(300, text: String(repeating: "compressible text ", count: 8))
        let compressed = RelaySealedBatch.encoded(large, compressing: true)
        #expect(compressed.payload.prefix(2) == [RelaySealedBatch.version, 1])
        #expect(compressed.payload.count < compressed.uncompressedCount / 4)
        #expect(try RelaySealedBatch.decode(compressed.payload, maximumInflatedLength: maximum) == large)
        let off = RelaySealedBatch.encoded(large, compressing: false)
        #expect(off.payload.prefix(2) == [RelaySealedBatch.version, 0])
        #expect(try RelaySealedBatch.decode(off.payload, maximumInflatedLength: maximum) == large)
        // An empty batch (a claim alone, ending a range whose changes were all overwritten) too.
        let empty = ChangeBatch(changes: [], claim: VersionVector([site: 9]))
        let claimOnly = RelaySealedBatch.encoded(empty, compressing: true).payload
        #expect(try RelaySealedBatch.decode(claimOnly, maximumInflatedLength: maximum) == empty)
    }

    @Test func readsWhatOlderMembersSealed() throws {
        let large = batch(300, text: String(repeating: "compressible text ", count: 8))
        let message = WireMessage.changeBatch(ChangeBatchMessage(requestID: 0, isLast: true, batch: large))
        let plain = message.encoded()
        #expect(plain.first == 3)
        #expect(try RelaySealedBatch.decode(plain, maximumInflatedLength: maximum) == large)
        let frame = message.packed(compressing: true).payload
        #expect(frame.first == 13)
        #expect(try RelaySealedBatch.decode(frame, maximumInflatedLength: maximum) == large)
        // Within the same bound as the format's own.
        #expect(throws: ShoalError.self) { try RelaySealedBatch.decode(frame, maximumInflatedLength: 1_000) }
        // Any other wire message is no change set.
        #expect(throws: ShoalError.self) {
            try RelaySealedBatch.decode(WireMessage.ping(1).encoded(), maximumInflatedLength: maximum)
        }
    }

    @Test func refusesWhatItDoesNotKnowAndWhatIsBroken() throws {
        let large = batch(300, text: String(repeating: "compressible text ", count: 8))
        let compressed = RelaySealedBatch.encoded(large, compressing: true).payload
        let plain = RelaySealedBatch.encoded(batch(3), compressing: false).payload
        func code(_ bytes: [UInt8], maximum: Int = 1 << 20) -> ShoalError.Code? {
            do throws(ShoalError) {
                _ = try RelaySealedBatch.decode(bytes, maximumInflatedLength: maximum)
                return nil
            } catch {
                return error.code
            }
        }
        #expect(code([]) == .malformedMessage)
        #expect(code([RelaySealedBatch.version]) == .malformedMessage)
        // A newer version: refused as such, not misread.
        #expect(code([RelaySealedBatch.version + 1] + plain.dropFirst()) == .unknownMessageType)
        // Unknown flags.
        #expect(code([RelaySealedBatch.version, 2] + plain.dropFirst(2)) == .malformedMessage)
        // Cut short, or with bytes after the batch.
        #expect(code(Array(plain.dropLast())) == .malformedMessage)
        #expect(code(plain + [0]) == .malformedMessage)
        #expect(code(Array(compressed.dropLast(5))) == .malformedMessage)
        #expect(code(Array(compressed.prefix(3))) == .malformedMessage)
        // A compressed body announcing more than the bound: refused before inflating.
        #expect(code(compressed, maximum: 1_000) == .frameTooLarge)
        // The compressed flag on a body that is no zlib stream.
        #expect(code([RelaySealedBatch.version, 1, 5, 1, 2, 3, 4, 5]) == .malformedMessage)
    }
}
