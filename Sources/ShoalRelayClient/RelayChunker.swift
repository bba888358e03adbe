import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol

/// Cuts the batches of a delta cursor (opened at the relay's heads) into sealed envelopes: per site, one range per
/// advance of the cursor's claim, each batch's part encoded as a ``RelaySealedBatch`` (compressed, when that pays) and
/// sealed in pieces of at most `pieceBytes`.
public struct RelayChunker {
    private let cluster: String
    private let seal: RelaySeal
    private let pieceBytes: Int
    /// What the batches so far claim.
    private var claim: VersionVector
    /// Ranges under way (a transaction larger than a batch, or transactions whose claim waits for a later batch):
    /// their start, upload id, next chunk, and the highest seq of the changes they hold so far.
    private var ranges: [SiteID: (from: UInt64, upload: UInt64, index: UInt32, highest: UInt64)] = [:]
    /// What the cursor was opened at: the stream assumes its receiver holds it.
    private let since: VersionVector
    /// The highest seq of each site among the changes sent so far in this stream.
    private var sent: [SiteID: UInt64] = [:]

    /// Whether each batch's plaintext is compressed (when that pays) before it is cut and sealed.
    private let compressing: Bool
    /// The bytes of the encoded batches cut so far, before compression.
    public private(set) var plaintextBytes = 0
    /// The bytes of the sealed bodies cut so far (what the relay stores of them, headers aside).
    public private(set) var sealedBytes = 0

    /// A chunker for a cursor opened at `heads`; each batch's plaintext is a ``RelaySealedBatch``, compressed when
    /// `compressing` and that pays, which members of this build and later open.
    public init(cluster: String, seal: RelaySeal, heads: VersionVector, pieceBytes: Int, compressing: Bool = true) {
        self.cluster = cluster
        self.seal = seal
        self.pieceBytes = max(1024, pieceBytes)
        self.compressing = compressing
        claim = heads
        since = heads
    }

    /// What the batches so far claim: after the cursor's last batch, the vector it covers.
    public var covered: VersionVector { claim }

    /// The envelopes of the cursor's next batch, in order.
    public mutating func envelopes(for batch: ChangeBatch) throws(ShoalError) -> [RelayEnvelope] {
        var bySite: [SiteID: [Change]] = [:]
        for change in batch.changes {
            bySite[change.stamp.site, default: []].append(change)
            sent[change.stamp.site] = max(sent[change.stamp.site] ?? 0, change.stamp.seq)
        }
        var sites = Set(bySite.keys)
        for (site, seq) in batch.claim.entries where seq > claim[site] { sites.insert(site) }
        var envelopes: [RelayEnvelope] = []
        for site in sites.sorted() {
            var range = ranges[site] ?? (claim[site], UInt64.random(in: 1...UInt64.max), 0, 0)
            range.highest = max(range.highest, bySite[site]?.map(\.stamp.seq).max() ?? 0)
            // A range ends where the claim has caught up with every change it holds: a claim held back (until what
            // overwrote part of a transaction is sent) leaves the range open, so that no range holds a change beyond
            // its end.
            let advanced = batch.claim[site] > claim[site] && batch.claim[site] >= range.highest
            // A range's end names, beside its own claim, what the stream assumed held (the heads it was cut from) and
            // sent of the other sites until then: what overwrote part of its transactions is among those, so a puller
            // counts the claim only once it applied those ranges too (``RelayPullSession``; builds before it read the
            // envelope's `to` alone).
            var rangeClaim = VersionVector()
            if advanced {
                rangeClaim = VersionVector(since.merging(VersionVector(sent)).entries.filter { $0.key != site })
                rangeClaim.advance(site, to: batch.claim[site])
            }
            let packed = RelaySealedBatch.encoded(
                ChangeBatch(changes: bySite[site] ?? [], claim: rangeClaim),
                compressing: compressing
            )
            plaintextBytes += packed.uncompressedCount
            // Compressed before it is sealed: sealed bytes do not compress. The plaintext's header says whether it is
            // (``RelaySealedBatch``), inside the seal.
            let plaintext = packed.payload
            var offset = 0
            while offset < plaintext.count {
                let end = min(plaintext.count, offset + pieceBytes)
                let last = end == plaintext.count
                var flags: RelayEnvelope.Flags = []
                if last { flags.insert(.batchEnd) }
                if last && advanced { flags.insert(.rangeEnd) }
                envelopes.append(
                    try seal.seal(
                        Array(plaintext[offset..<end]),
                        into: RelayEnvelope(
                            cluster: cluster,
                            epoch: seal.epoch,
                            site: site,
                            from: range.from,
                            to: last && advanced ? batch.claim[site] : 0,
                            upload: range.upload,
                            index: range.index,
                            flags: flags,
                            sealed: []
                        )
                    )
                )
                sealedBytes += envelopes[envelopes.count - 1].sealed.count
                range.index += 1
                offset = end
            }
            ranges[site] = advanced ? nil : range
        }
        claim.merge(batch.claim)
        return envelopes
    }
}
