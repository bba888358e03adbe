import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelayClient

/// The pull session, handed its pages by the link's own driver (``RelayPullDriver``), against a model relay that
/// drops, repeats, reorders, truncates, replays and forges chunks, forgets its storage and is rolled back, with an
/// uploader cutting ranges with the real chunker from a model cursor and a model node that applies and claims like the
/// store (claims clipped to what was received). After every batch applied: the node claims no transaction whose effect
/// (or what overwrote it) it lacks, and holds nothing that was not written. Once the relay behaves, the node converges
/// to the uploader's state within a bounded number of pulls, with no claim left waiting.
@Suite struct RelayPullSessionModelTests {
    @Test(arguments: 0..<300)
    func hostileRelayNeverMakesTheNodeClaimWhatItLacksAndAnHonestOneConverges(seed: UInt64) async throws {
        var world = ModelWorld(seed: seed)
        try await world.run()
    }

    /// A relay that answers every pull at once with the same replayed range makes the session wait, longer each time:
    /// never a loop of pulls.
    @Test func aRelayReplayingTheSameRangeMakesTheSessionBackOff() async throws {
        var world = ModelWorld(seed: 1)
        try world.write(count: 6)
        try world.upload()
        try await world.pullHonestly(until: 100)
        let replayed = try #require(world.relay.ranges.values.first?.first?.last)
        var waits: [UInt64] = []
        for _ in 0..<6 {
            _ = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
            try await world.deliver([.envelope(replayed)])
            waits.append(world.session.pageEnded() ?? 0)
            world.now += 1
        }
        #expect(waits.allSatisfy { $0 > 0 })
        #expect(waits.last! > waits.first!)
    }

    /// A site whose chunks fail is left aside 2 s, then longer while they keep failing, up to the bound; a range of it
    /// applied starts again at 2 s.
    @Test func aSiteWhoseChunksKeepFailingIsLeftAsideLongerEachTime() async throws {
        var world = ModelWorld(seed: 4, sites: 1)
        let site = world.sites[0]
        try world.write(site: site, key: 1)
        try world.upload()
        var forged = try #require(world.relay.ranges[site]?.first?.first)
        forged.sealed[forged.sealed.count / 2] ^= 1
        var aside: [UInt64] = []
        for _ in 0..<7 {
            _ = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
            try await world.deliver([.envelope(forged)])
            aside.append(world.session.blocked[site]! - world.now)
            world.now = world.session.blocked[site]! + 1
        }
        #expect(aside == [2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000])
        world.now += 1
        try await world.pullHonestly(until: 10)
        try world.write(site: site, key: 2)
        try world.upload()
        var next = try #require(world.relay.ranges[site]?.last?.first)
        next.sealed[next.sealed.count / 2] ^= 1
        _ = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        try await world.deliver([.envelope(next)])
        #expect(world.session.blocked[site]! - world.now == 2_000)
        // While the site is aside, a long-poll waits no longer than its time aside: the relay would not wake it for
        // that site's ranges, which the pull leaves out.
        world.now += 500
        let waiting = world.session.request(held: world.node.vector, now: world.now, wait: 25_000, maximumBytes: 1 << 20)
        #expect(waiting.waitMilliseconds == 1_500)
        world.now += 1_500
        let back = world.session.request(held: world.node.vector, now: world.now, wait: 25_000, maximumBytes: 1 << 20)
        #expect(back.waitMilliseconds == 25_000 && world.session.blocked.isEmpty)
    }

    /// A range past a removal fence claims nothing and leaves its site aside; once the fence rises past it, the site
    /// is asked again at once from what the node holds, and what the lower fence set aside comes again.
    @Test func aRisingFenceAsksTheSiteAgainFromWhatTheNodeHolds() async throws {
        var world = ModelWorld(seed: 3, sites: 1)
        let site = world.sites[0]
        for key in 0..<5 { try world.write(site: site, key: Int64(key)) }
        try world.upload()
        // The node's store sets aside what comes after seq 2 (its fence for now).
        world.node.fences = [site: 2]
        world.session.fences([site: 2])
        for _ in 0..<5 { try await world.pull(hostile: false) }
        #expect(world.node.vector == VersionVector())
        #expect(world.node.rows.count == 2, "what lies within the fence is applied")
        #expect(world.session.blocked[site] != nil)
        session(&world.session, asks: UInt64(Int64.max), for: site, holding: world.node.vector)
        world.session.fences([site: 2])
        session(&world.session, asks: UInt64(Int64.max), for: site, holding: world.node.vector)
        // A member that held more signed a later cut: the fence rises, and what was set aside comes again.
        world.node.fences = [site: 5]
        world.session.fences([site: 5])
        session(&world.session, asks: 0, for: site, holding: world.node.vector)
        for _ in 0..<5 { try await world.pull(hostile: false) }
        #expect(world.node.vector == VersionVector([site: 5]))
        try world.checkClaims()
    }

    /// A store that took a range's claim short of what it received leaves the range to be asked again (with backoff
    /// while it comes back the same), not counted: once the store takes it, the node holds the whole range.
    @Test func aClaimTheStoreTookShortIsAskedAgain() async throws {
        var world = ModelWorld(seed: 5, sites: 1)
        let site = world.sites[0]
        for key in 0..<3 { try world.write(site: site, key: Int64(key)) }
        try world.upload()
        try await world.shortClaimsAskedAgain(
            of: [site], held: VersionVector([site: 2]), settled: VersionVector([site: 3])
        )
    }

    /// The same for a claim that waited (b's transaction was partly overwritten by a's, whose chunk was forged): once
    /// a's range is applied, the batch that claims b's is taken short, and b's range is asked again.
    @Test func aWaitingClaimTheStoreTookShortIsAskedAgain() async throws {
        var world = ModelWorld(seed: 6, sites: 2)
        let (a, b) = (world.sites[0], world.sites[1])
        try world.write(site: b, key: 0)
        try world.write(site: b, key: 1)
        try world.write(site: a, key: 0)
        try world.upload()
        let request = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        let page = world.relay.page(asked: try RelayAPI.vector(request.vector), resume: [:], maximumChunks: 100)
        try await world.deliver(page.map { entry in
            guard case .envelope(var envelope) = entry, envelope.site == a else { return entry }
            envelope.sealed[envelope.sealed.count / 2] ^= 1
            return .envelope(envelope)
        })
        #expect(world.session.pending[b]?.to == 2)
        _ = world.session.pageEnded()
        world.now += 120_000
        try await world.shortClaimsAskedAgain(
            of: [b], held: VersionVector([a: 1, b: 1]), settled: VersionVector([a: 1, b: 2])
        )
    }

    /// A claim that requires a removed member's site waits until the node holds it up to its fence (nothing beyond
    /// ever comes; the uploader may hold more of it before it learns of the removal, and a claim waiting for that would
    /// never count): here the removed member's own range runs past the fence and claims nothing, so the member's claim
    /// waits, never counted without its effect (the removed member's later write, beyond the fence, overwrote it).
    /// Once the fence rises, the overwrite comes.
    @Test func aClaimWaitsOnAFencedSiteOnlyUpToItsFenceAndNeverCountsWithoutItsEffect() async throws {
        var world = ModelWorld(seed: 4, sites: 2)
        let (removed, member) = (world.sites[0], world.sites[1])
        try world.write(site: member, key: 0)
        for key: Int64 in [1, 2, 0] { try world.write(site: removed, key: key) }
        try world.upload()
        world.node.fences = [removed: 1]
        for _ in 0..<10 { try await world.pull(hostile: false) }
        #expect(world.node.vector == VersionVector(), "\(world.trace.suffix(20))")
        #expect(world.session.pending[member] != nil)
        try world.checkClaims()
        world.node.fences = [removed: 3]
        try await world.pullHonestly(until: 50)
        #expect(world.node.vector[removed] == 3)
        try world.checkClaims()
    }

    /// The removed member's own range runs past its fence, which stays: it left out the member's write its later one
    /// overwrote (refused here). The node applies what lies within the fence but claims none of it, leaves the site
    /// aside, and asks it from the snapshot; once a member that holds it up to the fence uploads one, the node takes
    /// the write from it, and then never asks for that site again.
    @Test func aRemovedMembersRangePastItsFenceNeverClaimsAndTheSnapshotBringsWhatItOverwrote() async throws {
        var world = ModelWorld(seed: 7, sites: 2)
        let (removed, member) = (world.sites[0], world.sites[1])
        try world.write(site: member, key: 0)
        for key: Int64 in [1, 2, 1] { try world.write(site: removed, key: key) }
        try world.upload()
        #expect(world.relay.head(removed) == 3)
        world.node.fences = [removed: 2]
        for _ in 0..<6 { try await world.pull(hostile: false) }
        // The member's range claims only once the removed member's site is held up to the fence.
        #expect(world.node.vector == VersionVector(), "\(world.trace.suffix(20))")
        #expect(world.session.pending[member] != nil)
        #expect(world.node.rows[2] != nil && world.node.rows[1] == nil, "key 2 within the fence, key 1's write lacking")
        try world.checkClaims()
        let aside = try #require(world.session.blocked[removed])
        world.now = aside + 1
        var request = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        #expect(request.snapshotSites == [RelayAPI.key(removed)])
        #expect(request.vector[RelayAPI.key(removed)] ?? 0 == 0)
        // A member that holds the removed member's site up to the fence uploads a snapshot.
        try world.uploadSnapshot(fences: [removed: 2])
        for _ in 0..<6 { try await world.pull(hostile: false) }
        #expect(world.node.vector == VersionVector([member: 1, removed: 2]), "\(world.trace.suffix(20))")
        #expect(world.node.rows[1] == Stamp(hlc: HLC(rawValue: 2 << 16), site: removed, seq: 1))
        try world.checkClaims()
        request = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        #expect(request.snapshotSites == nil)
        #expect(request.vector[RelayAPI.key(removed)] == UInt64(Int64.max), "a site held up to its fence is not asked")
    }

    /// A fence the store raised while a range came (a removal among the page's changes), which the session learns only
    /// at its next pull: an earlier batch of the range showed it (the store left changes out), so the range's end,
    /// a batch of the claim alone, claims nothing. Proven by the first batch's changes, the claim would cover the
    /// removed member's write its refused later one overwrote.
    @Test func aFenceTheStoreRaisedWhileARangeCameLeavesThatRangeUnclaimed() async throws {
        var world = ModelWorld(seed: 8, sites: 1)
        let removed = world.sites[0]
        for key: Int64 in [1, 2, 3, 1] { try world.write(site: removed, key: key) }
        // The removed member's stream: its surviving changes in one batch, then the claim in a batch of its own.
        var chunker = RelayChunker(cluster: world.cluster, seal: world.seal, heads: VersionVector(), pieceBytes: 1024)
        let changes = world.survivors.values.sorted { $0.stamp.dot < $1.stamp.dot }.map { write in
            Change(
                table: "kv", primaryKey: [.integer(write.key)], payload: .column("v", .integer(write.key)),
                causalLength: 1, stamp: write.stamp
            )
        }
        let envelopes = try chunker.envelopes(for: ChangeBatch(changes: changes, claim: VersionVector()))
            + chunker.envelopes(for: ChangeBatch(changes: [], claim: VersionVector([removed: 4])))
        world.relay.store(envelopes)
        #expect(world.relay.head(removed) == 4)
        let request = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        world.node.fences = [removed: 3]
        try await world.deliver(
            world.relay.page(asked: try RelayAPI.vector(request.vector), resume: [:], maximumChunks: 100)
        )
        #expect(world.node.vector[removed] == 0, "\(world.trace.suffix(10))")
        #expect(world.session.blocked[removed] != nil)
        try world.checkClaims()
    }

    private func session(_ session: inout RelayPullSession, asks seq: UInt64, for site: SiteID, holding: VersionVector) {
        let request = session.request(held: holding, now: 0, wait: 0, maximumBytes: 1 << 20)
        #expect(request.vector[RelayAPI.key(site)] ?? 0 == seq)
    }

    /// A range whose transaction another site's later one overwrote claims only once that site's range is applied: a
    /// site held back (here, its chunks forged) leaves the other's claim waiting, not covering a write the node lacks.
    @Test func aClaimWaitsForTheSiteThatOverwroteItsTransaction() async throws {
        var world = ModelWorld(seed: 2, sites: 2)
        let (a, b) = (world.sites[0], world.sites[1])
        // b writes keys 0 and 1, then a overwrites key 0: b's range holds only key 1, and its claim needs a's range.
        try world.write(site: b, key: 0)
        try world.write(site: b, key: 1)
        try world.write(site: a, key: 0)
        try world.upload()
        _ = world.session.request(held: world.node.vector, now: world.now, wait: 0, maximumBytes: 1 << 20)
        // The relay forges a's chunk and sends b's as it is.
        let page = world.relay.page(asked: world.session.cursor, resume: [:], maximumChunks: 100)
        try await world.deliver(page.map { entry in
            guard case .envelope(var envelope) = entry, envelope.site == a else { return entry }
            envelope.sealed[envelope.sealed.count / 2] ^= 1
            return .envelope(envelope)
        })
        #expect(world.node.vector[b] == 0, "b's claim counted while the write that overwrote b's was missing")
        try world.checkClaims()
        world.now += 120_000
        try await world.pullHonestly(until: 50)
        #expect(world.node.vector[b] == 2 && world.node.vector[a] == 1)
        #expect(world.session.pending.isEmpty)
    }
}

/// One transaction of the model: one site writes one key.
struct ModelWrite: Hashable {
    var stamp: Stamp
    var key: Int64
}

/// A relay's storage: per site, a chain of ranges, each its chunks in order; and a snapshot's, with what it covers.
struct ModelRelay {
    var ranges: [SiteID: [[RelayEnvelope]]] = [:]
    var snapshot: [SiteID: [[RelayEnvelope]]] = [:]
    var snapshotVector = VersionVector()

    func head(_ site: SiteID) -> UInt64 { ranges[site]?.last?.last?.to ?? 0 }

    var heads: VersionVector { VersionVector(ranges.mapValues { $0.last?.last?.to ?? 0 }) }

    /// Takes whole ranges that start at the site's head (like the relay: insert by dot, ranges in a chain).
    mutating func store(_ envelopes: [RelayEnvelope]) {
        var open: [SiteID: [RelayEnvelope]] = [:]
        for envelope in envelopes {
            open[envelope.site, default: []].append(envelope)
            guard envelope.endsRange else { continue }
            let range = open.removeValue(forKey: envelope.site)!
            if range[0].from == head(envelope.site) { ranges[envelope.site, default: []].append(range) }
        }
    }

    /// The chunks answering `asked` (and `resume`), per site in order, at most `maximumChunks`: for a site of
    /// `snapshotSites` the snapshot holds more of, its snapshot ranges first, then the log's after them.
    func page(
        asked: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        snapshotSites: Set<SiteID> = [],
        maximumChunks: Int
    ) -> [RelayEnvelopeList.Entry] {
        var page: [RelayEnvelopeList.Entry] = []
        for site in ranges.keys.sorted() where head(site) > asked[site] {
            var after = asked[site]
            var sources: [[[RelayEnvelope]]] = []
            if snapshotSites.contains(site), snapshotVector[site] > after {
                sources.append(snapshot[site] ?? [])
                after = snapshotVector[site]
            }
            sources.append(ranges[site]!.filter { $0.last!.to > after })
            for range in sources.joined() where range.last!.to > asked[site] {
                var start = 0
                if let point = resume[site], point.from == range[0].from { start = Int(point.index) }
                for chunk in range.dropFirst(start) {
                    guard page.count < maximumChunks else { return page }
                    page.append(.envelope(chunk))
                }
            }
        }
        return page
    }
}

/// The node that pulls: applies like the store (last writer wins by stamp; a claim clipped to what was received).
struct ModelNode {
    var rows: [Int64: Stamp] = [:]
    var vector = VersionVector()
    /// Removal fences: changes of a site beyond its fence are set aside, and its claims go no further.
    var fences: [SiteID: UInt64] = [:] {
        didSet { for (site, fence) in fences { firstFences[site] = firstFences[site] ?? fence } }
    }
    /// Each site's first fence: claims made under it may lack what it set aside, until that comes again.
    private(set) var firstFences: [SiteID: UInt64] = [:]
    /// Sites whose claims the store takes short: one below what the changes received prove (never below what it
    /// holds), as a store with a fence the session does not know of would.
    var shortClaims: Set<SiteID> = []

    mutating func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) -> (vector: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>) {
        var highest = received
        var fenced: Set<SiteID> = []
        for change in batch.changes {
            guard case .integer(let key) = change.primaryKey[0] else { continue }
            if let fence = fences[change.stamp.site], change.stamp.seq > fence {
                fenced.insert(change.stamp.site)
                continue
            }
            if rows[key].map({ $0 < change.stamp }) ?? true { rows[key] = change.stamp }
            highest[change.stamp.site] = max(highest[change.stamp.site] ?? 0, change.stamp.seq)
        }
        // Like the store: a site some of whose changes a fence left out takes no claim from them.
        for (site, claimed) in batch.claim.entries where !fenced.contains(site) {
            var proven = min(claimed, max(vector[site], highest[site] ?? 0))
            if shortClaims.contains(site), proven > vector[site] { proven -= 1 }
            vector.advance(site, to: proven)
        }
        return (vector, highest, fenced)
    }

    /// The first of `writes` the node claims without holding its effect, or what overwrote it (and what it holds of
    /// its key); nil when there is none. A write of another site is left out where a later write of its key is beyond
    /// a removal fence (an uploader may have kept only that overwrite, and its range claims the other site's write:
    /// see the note on ``RelayPullSession``); one of the fenced site itself never is (its ranges past the fence never
    /// claim).
    func unheldClaim(_ writes: [ModelWrite]) -> (write: ModelWrite, held: Stamp?)? {
        for (index, write) in writes.enumerated() where vector.covers(write.stamp.dot) {
            let setAside = writes[(index + 1)...].contains { later in
                later.key == write.key && later.stamp.site != write.stamp.site
                    && firstFences[later.stamp.site].map { later.stamp.seq > $0 } ?? false
            }
            if setAside { continue }
            let held = rows[write.key]
            if !(held.map { $0 >= write.stamp } ?? false) { return (write, held) }
        }
        return nil
    }
}

/// The model node as the pull driver sees it (``RelayPullEndpoint``): it applies to the node, checks that every change
/// was written, and after every batch that the node claims nothing it lacks.
struct ModelPuller: RelayPullEndpoint {
    var node: ModelNode
    let now: UInt64
    let seal: RelaySeal
    let writes: [ModelWrite]
    var trace: [String] = []

    func nowMilliseconds() -> UInt64 { now }

    func held() -> VersionVector { node.vector }

    func seal(opening epoch: UInt32) -> RelaySeal { seal }

    /// The relay can hold no range beyond what was written.
    func relayServed(_ served: VersionVector) {
        for (site, seq) in served.entries {
            #expect(writes.contains { $0.stamp.site == site && $0.stamp.seq >= seq }, "served \(served)")
        }
    }

    mutating func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) throws(RelayCallError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>) {
        for change in batch.changes {
            #expect(writes.contains(ModelWrite(stamp: change.stamp, key: change.primaryKey[0].integerValue!)))
        }
        let result = node.apply(batch, received: received)
        let changes = batch.changes.map { "\($0.stamp.site.hex.prefix(4)):\($0.stamp.seq)" }
        trace.append("    apply \(changes) claim \(batch.claim) received \(received) -> \(result.vector)")
        if node.unheldClaim(writes) != nil {
            throw .local(ShoalError(code: .malformedMessage, message: "the node claims what it lacks"))
        }
        return (batch.changes.count, result.vector, result.received, result.fenced)
    }
}

/// One run: writers, an uploader that holds every write, the model relay, and the session with its node.
struct ModelWorld {
    var random: SplitMix
    let seed: UInt64
    let sites: [SiteID]
    let cluster = "model"
    let seal = RelaySeal(clusterSecret: Array(repeating: 7, count: 32))
    let foreignSeal = RelaySeal(clusterSecret: Array(repeating: 9, count: 32))
    var writes: [ModelWrite] = []
    var seqs: [SiteID: UInt64] = [:]
    var clock: UInt64 = 0
    var relay = ModelRelay()
    var node = ModelNode()
    var session: RelayPullSession
    var now: UInt64 = 1_000_000
    /// Every authentic chunk ever stored, for replays.
    var seen: [RelayEnvelope] = []
    var copies: [ModelRelay] = []
    /// What happened, printed when the run fails.
    var trace: [String] = []

    init(seed: UInt64, sites count: Int = 3) {
        self.seed = seed
        random = SplitMix(state: seed)
        var sites: [SiteID] = []
        for _ in 0..<count { sites.append(SiteID.random(using: &random)) }
        self.sites = sites.sorted()
        session = RelayPullSession(
            site: SiteID.random(using: &random),
            cluster: "model",
            backoff: Backoff(initialMilliseconds: 100, maximumMilliseconds: 10_000),
            blockMilliseconds: 60_000
        )
    }

    // MARK: Writers and the uploader

    mutating func write(count: Int) throws {
        for _ in 0..<count {
            try write(site: sites.randomElement(using: &random)!, key: Int64.random(in: 0..<5, using: &random))
        }
    }

    mutating func write(site: SiteID, key: Int64) throws {
        clock += 1
        seqs[site, default: 0] += 1
        writes.append(ModelWrite(stamp: Stamp(hlc: HLC(rawValue: clock << 16), site: site, seq: seqs[site]!), key: key))
    }

    /// The write that holds each key now.
    var survivors: [Int64: ModelWrite] {
        var rows: [Int64: ModelWrite] = [:]
        for write in writes { rows[write.key] = write }
        return rows
    }

    /// Cuts what the relay's heads lack with the real chunker, from a model of the node's cursor: surviving changes
    /// by (site, seq), one batch per site, each claim held back until what overwrote a transaction was sent.
    mutating func upload(pieceBytes: Int = 1024) throws {
        let envelopes = try cut(writes, since: relay.heads, pieceBytes: pieceBytes)
        relay.store(envelopes)
        seen += envelopes
    }

    /// A member's snapshot, put in the relay: the state of the writes within `fences`, cut from nothing.
    mutating func uploadSnapshot(fences: [SiteID: UInt64]) throws {
        let held = writes.filter { write in fences[write.stamp.site].map { write.stamp.seq <= $0 } ?? true }
        var covered = VersionVector()
        for write in held { covered.advance(write.stamp.site, to: write.stamp.seq) }
        let envelopes = try cut(held, since: VersionVector(), pieceBytes: 1024)
        relay.snapshot = [:]
        var open: [SiteID: [RelayEnvelope]] = [:]
        for envelope in envelopes {
            open[envelope.site, default: []].append(envelope)
            guard envelope.endsRange, let range = open.removeValue(forKey: envelope.site) else { continue }
            relay.snapshot[envelope.site, default: []].append(range)
        }
        relay.snapshotVector = covered
    }

    /// `writes` the relay's `since` lacks, cut into ranges with the real chunker.
    func cut(_ writes: [ModelWrite], since heads: VersionVector, pieceBytes: Int) throws -> [RelayEnvelope] {
        var survivors: [Int64: ModelWrite] = [:]
        for write in writes { survivors[write.key] = write }
        let winners = Set(survivors.values.map(\.stamp))
        let outgoing = survivors.values.filter { !heads.covers($0.stamp.dot) }.sorted { $0.stamp.dot < $1.stamp.dot }
        var chunker = RelayChunker(cluster: cluster, seal: seal, heads: heads, pieceBytes: pieceBytes)
        var sent: Set<Stamp> = []
        var envelopes: [RelayEnvelope] = []
        var claim = heads
        for site in sites {
            let mine = outgoing.filter { $0.stamp.site == site }
            for write in mine { sent.insert(write.stamp) }
            // Per site, the highest seq whose transactions (from the heads on) were all sent, or overwritten by what
            // was sent or the heads cover.
            for other in sites {
                var seq = claim[other]
                for write in writes where write.stamp.site == other && write.stamp.seq > claim[other] {
                    guard write.stamp.seq == seq + 1 else { break }
                    let winner = survivors[write.key]!.stamp
                    let done = winners.contains(write.stamp) ? sent.contains(write.stamp)
                        : (sent.contains(winner) || heads.covers(winner.dot))
                    guard done else { break }
                    seq = write.stamp.seq
                }
                claim.advance(other, to: seq)
            }
            let changes = mine.map { write in
                Change(
                    table: "kv", primaryKey: [.integer(write.key)], payload: .column("v", .integer(write.key)),
                    causalLength: 1, stamp: write.stamp
                )
            }
            envelopes += try chunker.envelopes(for: ChangeBatch(changes: changes, claim: claim))
        }
        return envelopes
    }

    // MARK: Pulls

    /// Hands `page` to the link's pull driver (``RelayPullDriver``), the model node answering its calls.
    mutating func deliver(_ page: [RelayEnvelopeList.Entry]) async throws {
        for case .envelope(let envelope) in page {
            trace.append(
                "  \(envelope.site.hex.prefix(4)) \(envelope.from)..\(envelope.to) #\(envelope.index) "
                    + "u\(envelope.upload % 1000) f\(envelope.flags.rawValue) \(envelope.cluster)"
            )
        }
        var puller = ModelPuller(node: node, now: now, seal: seal, writes: writes)
        var failure: RelayCallError?
        do {
            _ = try await RelayPullDriver.deliver(page, &session, &puller)
        } catch {
            failure = error
        }
        node = puller.node
        trace += puller.trace
        try checkClaims()
        if let failure { throw failure }
    }

    /// Every transaction the node claims has its effect here, or what overwrote it (``ModelNode/unheldClaim(_:)``).
    func checkClaims() throws {
        guard let (write, held) = node.unheldClaim(writes) else { return }
        Issue.record(
            "seed \(seed): the node claims \(write.stamp) (key \(write.key)) but holds \(String(describing: held))"
        )
        print(trace.suffix(60).joined(separator: "\n"))
        throw ModelFailure()
    }

    struct ModelFailure: Error {}

    /// One pull: the session's request, the relay's answer (altered by `hostile`), the page handed over.
    mutating func pull(hostile: Bool) async throws {
        session.fences(node.fences)
        let request = session.request(held: node.vector, now: now, wait: 0, maximumBytes: 1 << 20)
        let asked = try RelayAPI.vector(request.vector)
        var resume: [SiteID: (from: UInt64, index: UInt32)] = [:]
        for point in request.resume ?? [] {
            let site = try #require(try RelayAPI.vector([point.site: 1]).entries.keys.first)
            resume[site] = (point.from, point.index)
        }
        let named = Set(try (request.snapshotSites ?? []).flatMap { try RelayAPI.vector([$0: 1]).entries.keys })
        var page = relay.page(
            asked: asked, resume: resume, snapshotSites: named, maximumChunks: Int.random(in: 1...12, using: &random)
        )
        if hostile { tamper(&page) }
        trace.append(
            "pull\(hostile ? " hostile" : "") at \(now): asked \(asked) resume \(resume.map { "\($0.key.hex.prefix(4)) \($0.value)" }) "
                + "node \(node.vector) pending \(session.pending.map { "\($0.key.hex.prefix(4)) \($0.value)" }) "
                + "relay \(relay.ranges.mapValues { $0.map { "\($0[0].from)..\($0.last!.to)" } }.map { "\($0.key.hex.prefix(4)) \($0.value)" })"
        )
        try await deliver(page)
        now += session.pageEnded() ?? 0
        now += UInt64.random(in: 0...2_000, using: &random)
    }

    mutating func tamper(_ page: inout [RelayEnvelopeList.Entry]) {
        for _ in 0..<Int.random(in: 0...2, using: &random) {
            switch Int.random(in: 0..<9, using: &random) {
            case 0 where !page.isEmpty:
                page.remove(at: Int.random(in: 0..<page.count, using: &random))
            case 1 where !page.isEmpty:
                let index = Int.random(in: 0..<page.count, using: &random)
                page.insert(page[index], at: index)
            case 2 where page.count > 1:
                page.swapAt(Int.random(in: 0..<page.count, using: &random), Int.random(in: 0..<page.count, using: &random))
            case 3 where !page.isEmpty:
                page.removeLast(Int.random(in: 1...page.count, using: &random))
            case 4 where !seen.isEmpty:
                // An authentic chunk replayed anywhere.
                page.insert(.envelope(seen.randomElement(using: &random)!), at: Int.random(in: 0...page.count, using: &random))
            case 5:
                // A flipped byte in a chunk, or in its header.
                let index = page.indices.randomElement(using: &random)
                if let index, case .envelope(var envelope) = page[index] {
                    if Bool.random(using: &random) {
                        envelope.sealed[Int.random(in: 0..<envelope.sealed.count, using: &random)] ^= 1
                    } else {
                        envelope.to &+= 1
                    }
                    page[index] = .envelope(envelope)
                }
            case 6 where !seen.isEmpty:
                // Another cluster's chunk, or one sealed with a key the cluster never had, under a site of this one.
                var envelope = seen.randomElement(using: &random)!
                if Bool.random(using: &random) { envelope.cluster = "other" }
                envelope = (try? foreignSeal.seal([1, 2, 3], into: envelope)) ?? envelope
                page.insert(.envelope(envelope), at: Int.random(in: 0...page.count, using: &random))
            case 7:
                page.insert(
                    .undecodable(
                        site: Bool.random(using: &random) ? sites.randomElement(using: &random) : nil,
                        ShoalError(code: .malformedMessage, message: "bad")
                    ),
                    at: Int.random(in: 0...page.count, using: &random)
                )
            case 8 where !page.isEmpty:
                // A chunk served for another site's place.
                let index = Int.random(in: 0..<page.count, using: &random)
                if case .envelope(var envelope) = page[index] {
                    envelope.site = sites.randomElement(using: &random)!
                    page[index] = .envelope(envelope)
                }
            default:
                break
            }
        }
    }

    /// The node's store takes claims of `sites` short while the relay serves what was uploaded: the node holds `held`,
    /// the next pull asks from there, and the same page again moves nothing (the pull after waits). Once the store
    /// takes claims, the node converges to `settled` and nothing is asked past it.
    mutating func shortClaimsAskedAgain(
        of sites: Set<SiteID>,
        held: VersionVector,
        settled: VersionVector
    ) async throws {
        node.shortClaims = sites
        var request = session.request(held: node.vector, now: now, wait: 0, maximumBytes: 1 << 20)
        try await deliver(relay.page(asked: try RelayAPI.vector(request.vector), resume: [:], maximumChunks: 100))
        #expect(node.vector == held)
        #expect(session.problems.contains { $0.contains("asked for again") })
        _ = session.pageEnded()
        now += 1
        request = session.request(held: node.vector, now: now, wait: 0, maximumBytes: 1 << 20)
        #expect(try RelayAPI.vector(request.vector) == held, "the ranges taken short are not asked again")
        try await deliver(relay.page(asked: try RelayAPI.vector(request.vector), resume: [:], maximumChunks: 100))
        #expect(session.pageEnded() != nil, "the same page taken short again did not make the next pull wait")
        node.shortClaims = []
        now += 60_000
        try await pullHonestly(until: 10)
        #expect(node.vector == settled)
        let asked = session.request(held: node.vector, now: now, wait: 0, maximumBytes: 1 << 20)
        #expect(try RelayAPI.vector(asked.vector) == settled)
    }

    /// Pulls from a relay that behaves, until the node holds the uploader's state (or `until` pulls).
    mutating func pullHonestly(until limit: Int) async throws {
        for _ in 0..<limit {
            if converged { return }
            try await pull(hostile: false)
            // Sites left aside come back once their time is up.
            if let until = session.blocked.values.max(), until > now { now = until }
        }
        #expect(converged, "seed \(seed): no convergence; node \(node.vector), relay \(relay.heads)")
        if !converged {
            print(trace.suffix(80).joined(separator: "\n"))
            throw ModelFailure()
        }
    }

    var converged: Bool {
        let survivors = self.survivors
        guard node.rows == survivors.mapValues(\.stamp) else { return false }
        guard session.pending.isEmpty else { return false }
        return survivors.values.allSatisfy { node.vector.covers($0.stamp.dot) }
    }

    /// The run: writes and uploads, pulls from a hostile relay that also forgets or rolls back its storage, then an
    /// honest phase.
    mutating func run() async throws {
        for _ in 0..<Int.random(in: 10...40, using: &random) {
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<3:
                try write(count: Int.random(in: 1...4, using: &random))
            case 3..<5:
                try upload(pieceBytes: Int.random(in: 100...2_000, using: &random))
            case 5 where Bool.random(using: &random):
                // A removal fence: the node's store sets aside what a site wrote beyond it.
                let site = sites.randomElement(using: &random)!
                node.fences[site] = max(node.fences[site] ?? 0, node.vector[site] + UInt64.random(in: 0...3, using: &random))
                trace.append("fence \(site.hex.prefix(4)) at \(node.fences[site]!)")
            case 5:
                // Storage lost, or rolled back to an older copy; uploads start again from what remains.
                copies.append(relay)
                relay = Bool.random(using: &random) ? ModelRelay() : copies.randomElement(using: &random)!
            default:
                // The node's store takes claims short a while now and then: the session asks those ranges again.
                if Int.random(in: 0..<4, using: &random) == 0 {
                    node.shortClaims = node.shortClaims.isEmpty ? [sites.randomElement(using: &random)!] : []
                    trace.append("short claims \(node.shortClaims.map { $0.hex.prefix(4) })")
                }
                try await pull(hostile: Bool.random(using: &random))
            }
        }
        node.shortClaims = []
        try upload()
        // The fences rise past everything (members that held more signed later cuts): what they set aside comes again.
        for site in node.fences.keys { node.fences[site] = .max }
        try await pullHonestly(until: 400)
        try checkClaims()
    }
}

extension SQLValue {
    fileprivate var integerValue: Int64? {
        if case .integer(let value) = self { return value }
        return nil
    }
}
