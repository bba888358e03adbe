import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol

/// Everything a node decides about pulling from a relay, with no I/O: what to ask for, how each chunk of a page is
/// checked, where a range resumes, when a range's claim may count, which sites are left aside, and when the next pull
/// may go. The shell (``RelayLink``) carries out what it says: it sends ``request(held:now:wait:maximumBytes:)``,
/// opens each chunk the session lets through with its seal, applies what ``opened(_:plaintext:now:)`` hands back, and
/// reports the results; time comes in as `now` (Unix milliseconds), so tests drive it.
///
/// The rules, in one place:
/// - A site's ranges are used in order, each from its first chunk (or from where the page before ended inside it,
///   while that site's cursor stays put); anything else starts the site again.
/// - A chunk of another cluster, one that fails its seal or does not decode, a range with a gap, or a range the node
///   said it holds (a replayed or misfiled one) leaves *that site* aside, 2 s the first time, doubling up to
///   ``blockMilliseconds`` while its ranges keep failing (a range of it applied starts again at 2 s); the rest of the
///   page, and every other site, go on.
/// - A range's claim counts only once the node holds what the uploader had sent before it in the same stream (the
///   other sites' entries of the range's sealed claim): a transaction partly overwritten by another site's later one
///   is claimed only when that overwrite is held too, so a site held back never leaves another site's claim covering
///   writes the node lacks. Claims waiting on that are kept, and asked past, until they can count.
/// - A claim counts only once the store took it as far as what it received of the range proves (the version vector
///   after the apply): beyond that only the range's overwritten transactions, which it brought the effect of. A store
///   that took less than it received (a fence it had and the session did not, say) leaves the range to be asked
///   again from what the node holds, with backoff while it comes back the same.
/// - A page that moved nothing (replayed, misfiled or refused chunks only) makes the next pull wait, with backoff: a
///   misbehaving relay never starts a loop of pulls.
/// - A removed member's site is asked only until the node holds it up to its fence, and from the relay's snapshot
///   first. A range of it that runs past the fence (the removed member uploaded it, before or after its removal) is
///   applied within the fence but never claims: it left out what its transactions within the fence lost to its later
///   ones, which the fence refuses, so nothing proves the node holds what the members hold of it. The site is left
///   aside a while, and asked from the snapshot again (a member that holds it up to the fence uploads one).
public struct RelayPullSession: Sendable {
    /// A range whose end arrived: its claim, what proves it, and what must be held before it counts.
    public struct PendingClaim: Sendable, Hashable {
        /// The range's end.
        public var to: UInt64
        /// The highest seq of the site's changes received in the range (see ``SyncNode/applyReceived(_:received:)``).
        public var received: UInt64
        /// The other sites' seqs the uploader had sent before the range's end.
        public var requires: VersionVector
    }

    /// What the shell does with a chunk.
    public enum Verdict: Sendable, Equatable {
        /// Open it with the seal and hand the plaintext to ``opened(_:plaintext:now:)``.
        case open
        /// Leave it out: its site is left aside for this page (or a while).
        case skip
        /// Read the node's version vector, give it to ``held(_:)``, and check the chunk again: the range starts beyond
        /// what the session knew was held (the node may have got the rest from a LAN peer or uploaded it itself).
        case readHeld
    }

    /// What the shell does with an opened chunk.
    public enum Piece: Sendable, Equatable {
        /// Nothing yet: the batch continues in the next chunk.
        case buffered
        /// Apply this batch (one transaction), then report with ``applied(_:received:held:)``.
        case apply(ChangeBatch, received: [SiteID: UInt64])
        /// Left out; its site is left aside.
        case skip
    }

    private struct Resume: Sendable {
        var from: UInt64
        var index: UInt32
        var upload: UInt64
        /// The site's cursor when the range started: the resume point holds only while it stays there.
        var cursor: UInt64
    }

    /// This node's site (the relay never sends its own ranges back to it, and never holds more of them than it made).
    public let site: SiteID
    /// The cluster this node belongs to.
    public let cluster: String
    /// The longest a site whose range could not be used is left aside.
    public let blockMilliseconds: UInt64
    /// Per site, how many times in a row its ranges could not be used.
    private var strikes: [SiteID: Int] = [:]
    /// The vector pulls ask with: what is held, plus ranges whose claims wait.
    public private(set) var cursor = VersionVector()
    /// Sites left aside, until when.
    public private(set) var blocked: [SiteID: UInt64] = [:]
    /// Ranges whose claims wait on other sites, merged per site.
    public private(set) var pending: [SiteID: PendingClaim] = [:]
    private var resume: [SiteID: Resume] = [:]
    private var buffers: [SiteID: [UInt8]] = [:]
    /// Per range under way, the highest seq applied from its earlier batches.
    private var received: [SiteID: UInt64] = [:]
    /// The vector the page being read was asked with.
    private var asked = VersionVector()
    /// Sites left out for the rest of the page.
    private var skipped: Set<SiteID> = []
    /// Range ends opened, whose claims wait, until their changes are applied.
    private var ending: [SiteID: PendingClaim] = [:]
    /// Claims handed out by ``readyClaims()``, until the store's answer (``claimsApplied(held:)``) says how far it took
    /// them.
    private var claiming: [SiteID: PendingClaim] = [:]
    /// What the node holds, as last read.
    private var knownHeld = VersionVector()
    /// The removal fences as last given.
    private var knownFences: [SiteID: UInt64] = [:]
    /// Per site, the end of the last range whose claim counted here: what its changes and the ranges it required
    /// brought is here, even where the store took the claim lower (its newest transactions were all overwritten).
    public private(set) var counted = VersionVector()
    /// Sites whose range under way runs past their fence: applied, never claimed.
    private var pastFence: Set<SiteID> = []
    /// Per site, the furthest chunk used in the range under way: a page moved only if it went beyond.
    private var reached: [SiteID: Resume] = [:]
    /// Whether the page went beyond anything used before, and how many chunks it held.
    private var pageMoved = false
    private var pageEntries = 0
    /// The sites the page's chunks named.
    private var pageSites: Set<SiteID> = []
    private var backoff: Backoff
    /// Problems to say (each once, by the shell): a site left aside and why.
    public private(set) var problems: [String] = []
    /// Whether the shell reads the relay's heads before the next pull (and hands them to ``headsRead(_:held:)``): after
    /// a failure, or a page that came back empty long before its wait was up, the relay may be back having lost or
    /// rolled back its storage, and a long-poll would hide its return for the whole wait.
    public private(set) var headsDue = false
    /// The wait the page being read was asked with, as configured.
    private var wait = 0
    /// How long the page being read took to come back.
    private var elapsed: UInt64 = 0
    /// Pulls that brought change sets follow one another at most this often (milliseconds; see
    /// ``RelayClientConfiguration/minimumRequestSpacingMilliseconds``).
    let spacingMilliseconds: UInt64
    /// Per site, the end of the ranges the relay served whole (opened, handed over to be applied) since
    /// ``takeServed()`` last took them: the relay holds them, so the uploader need not send them back.
    private var served = VersionVector()

    /// The longest encoded change batch a sealed change set may hold once inflated: a value of the maximum size (a batch
    /// cut by bytes still holds a whole change) and a frame's worth of other changes.
    public static let maximumBatchBytes = WireProtocol.maximumValueBytes + WireProtocol.defaultMaximumFrameLength

    /// A session for `site` of `cluster`; `backoff` paces pulls after pages that moved nothing.
    /// `spacingMilliseconds` paces pulls that brought change sets.
    public init(
        site: SiteID,
        cluster: String,
        backoff: Backoff,
        blockMilliseconds: UInt64 = 60_000,
        spacingMilliseconds: UInt64 = 0
    ) {
        self.site = site
        self.cluster = cluster
        self.backoff = backoff
        self.blockMilliseconds = blockMilliseconds
        self.spacingMilliseconds = spacingMilliseconds
    }

    // MARK: Pages

    /// The next pull's request, given the node's version vector now: resume points whose site moved are dropped, sites
    /// whose time aside is up come back.
    public mutating func request(held: VersionVector, now: UInt64, wait: Int, maximumBytes: Int) -> RelayPullRequest {
        self.held(held)
        for (site, point) in resume where cursor[site] != point.cursor { forget(site) }
        blocked = blocked.filter { $0.value > now }
        var asked = cursor
        for site in blocked.keys { asked.advance(site, to: UInt64(Int64.max)) }
        var fromSnapshot: [String] = []
        for (site, fence) in knownFences.sorted(by: { $0.key < $1.key }) where site != self.site {
            if max(knownHeld[site], counted[site]) >= fence {
                // All there will ever be of a removed member is here: its ranges bring nothing more.
                asked.advance(site, to: UInt64(Int64.max))
            } else if blocked[site] == nil, fromSnapshot.count < RelayPullRequest.maximumSnapshotSites {
                fromSnapshot.append(RelayAPI.key(site))
            }
        }
        self.asked = asked
        self.wait = wait
        skipped = []
        pageMoved = false
        pageEntries = 0
        pageSites = []
        problems = []
        return RelayPullRequest(
            vector: RelayAPI.json(asked),
            resume: resume.isEmpty
                ? nil
                : resume.sorted { $0.key < $1.key }.map {
                    RelayPullRequest.Resume(site: RelayAPI.key($0.key), from: $0.value.from, index: $0.value.index)
                },
            // A site left aside comes back when its time is up: the pull waits no longer than that, or what the relay
            // holds of it would wait for the wait to end (up to a long-poll's length) with nothing else to wake it.
            waitMilliseconds: blocked.values.min().map { Swift.min(wait, Int(clamping: $0 - now)) } ?? wait,
            maximumBytes: maximumBytes,
            snapshotSites: fromSnapshot.isEmpty ? nil : fromSnapshot
        )
    }

    /// The page came back `elapsed` milliseconds after it was asked for, holding `chunks` chunks. Empty long before
    /// its wait was up, the relay answered its waiting pulls as it shut down (it may come back restored from an older
    /// copy, with no request failing) or woke for an upload with nothing for this node: its heads are read first.
    public mutating func answered(chunks: Int, after elapsed: UInt64) {
        self.elapsed = elapsed
        if chunks == 0, elapsed < UInt64(wait / 2) { headsDue = true }
    }

    /// Takes the ends of the ranges the relay served whole since the last call: the relay holds them (its uploader
    /// need not send them back), as of now.
    public mutating func takeServed() -> VersionVector {
        defer { served = VersionVector() }
        return served
    }

    /// The relay's heads, read because ``headsDue``, and what the node holds: true when the relay lacks some of it
    /// (the shell has the uploader read the heads again and send what they lack).
    public mutating func headsRead(_ heads: VersionVector, held: VersionVector) -> Bool {
        headsDue = false
        return held.advances(heads)
    }

    /// The removal fences the node keeps (site → the last seq of a removed node's site it accepts). Changes beyond a
    /// fence are set aside when applied, and a range past it claims nothing; when a fence rises (a member that held
    /// more signed a later cut), the site is asked again at once from what the node holds, so what the lower fence set
    /// aside comes again and is applied up to the new one.
    public mutating func fences(_ fences: [SiteID: UInt64]) {
        for (site, fence) in fences where knownFences[site].map({ fence > $0 }) ?? true {
            knownFences[site] = fence
            forget(site)
            pastFence.remove(site)
            blocked[site] = nil
            strikes[site] = nil
            reached[site] = nil
            ending[site] = nil
            pending[site] = nil
            claiming[site] = nil
            var entries = cursor.entries
            entries[site] = knownHeld[site]
            cursor = VersionVector(entries)
            entries = counted.entries
            entries[site] = knownHeld[site]
            counted = VersionVector(entries)
        }
    }

    /// What the node holds now: the cursor never goes below it.
    public mutating func held(_ vector: VersionVector) {
        cursor.merge(vector)
        knownHeld.merge(vector)
        for (site, claim) in pending where vector[site] >= claim.to { pending[site] = nil }
    }

    /// Checks the next chunk of the page.
    public mutating func check(_ envelope: RelayEnvelope, now: UInt64) -> Verdict {
        pageEntries += 1
        let site = envelope.site
        pageSites.insert(site)
        guard !skipped.contains(site) else { return .skip }
        guard envelope.cluster == cluster else {
            return block(
                site, now: now,
                "the relay sent a change set of site \(site.hex.prefix(8)) of another cluster "
                    + "(\(envelope.cluster.prefix(64))); that site is left aside a while, the others go on"
            )
        }
        if envelope.endsRange, envelope.to <= asked[site] {
            // Asked for what follows, the relay answered with a range this node said it holds: an authentic range
            // replayed or filed under a later seq. Used, it would be asked for again and again.
            return block(
                site, now: now,
                "the relay answered for site \(site.hex.prefix(8)) after \(asked[site]) with its range "
                    + "\(envelope.from + 1)...\(envelope.to), which this node holds: a replayed or misfiled range; "
                    + "that site is left aside a while"
            )
        }
        if let point = resume[site] {
            // Not where the page before ended (another range, or one from a new snapshot): start the site again.
            guard envelope.from == point.from, envelope.index == point.index, envelope.upload == point.upload else {
                return restart(site)
            }
        } else {
            guard envelope.index == 0 else { return restart(site) }
            // A range starts: what an earlier one's batches showed of a fence is no part of it.
            pastFence.remove(site)
            guard envelope.from <= cursor[site] else {
                return .readHeld
            }
        }
        return .open
    }

    /// A chunk of the page that does not decode (`site`: its site, when its header could be read).
    public mutating func undecodable(site: SiteID?, _ error: ShoalError, now: UInt64) {
        pageEntries += 1
        guard let site else {
            problems.append("the relay sent a change set that does not decode (\(error.message)); it was left out")
            return
        }
        guard !skipped.contains(site) else { return }
        _ = block(
            site, now: now,
            "a change set of site \(site.hex.prefix(8)) from the relay does not decode (\(error.message)); "
                + "that site is left aside a while, the others go on"
        )
    }

    /// After ``Verdict/readHeld`` and ``held(_:)``: opens the chunk if what is held now reaches its start; otherwise the
    /// relay's ranges of its site have a gap, and the site is left aside.
    public mutating func recheck(_ envelope: RelayEnvelope, now: UInt64) -> Verdict {
        guard envelope.from > cursor[envelope.site] else { return .open }
        return block(
            envelope.site, now: now,
            "the relay's ranges of site \(envelope.site.hex.prefix(8)) have a gap (the next starts after "
                + "\(envelope.from), this node holds up to \(cursor[envelope.site]))"
        )
    }

    /// A chunk the shell could not open (`plaintext` failed) or opened.
    public mutating func opened(_ envelope: RelayEnvelope, plaintext: Result<[UInt8], ShoalError>, now: UInt64) -> Piece {
        let site = envelope.site
        let bytes: [UInt8]
        switch plaintext {
        case .failure(let error):
            _ = block(site, now: now, "relay changes could not be used here: \(error.message)")
            return .skip
        case .success(let opened):
            bytes = opened
        }
        buffers[site, default: []] += bytes
        resume[site] = Resume(from: envelope.from, index: envelope.index + 1, upload: envelope.upload, cursor: cursor[site])
        if let furthest = reached[site], furthest.from == envelope.from, furthest.upload == envelope.upload,
            furthest.index >= envelope.index
        {
            // A chunk used before (the range started again): no new ground.
        } else {
            reached[site] = Resume(from: envelope.from, index: envelope.index, upload: envelope.upload, cursor: 0)
            pageMoved = true
        }
        guard envelope.flags.contains(.batchEnd) else { return .buffered }
        let whole = buffers.removeValue(forKey: site) ?? []
        let batch: ChangeBatch
        do {
            // In the relay's own format or as older members sealed it (a wire message); a compressed batch inflates
            // within the bound any batch keeps to.
            batch = try RelaySealedBatch.decode(whole, maximumInflatedLength: Self.maximumBatchBytes)
        } catch {
            _ = block(
                site, now: now, "a sealed change set of site \(site.hex.prefix(8)) holds no valid batch: \(error.message)"
            )
            return .skip
        }
        for change in batch.changes {
            let seq = change.stamp.seq
            guard change.stamp.site == site, seq > envelope.from, !envelope.endsRange || seq <= envelope.to else {
                _ = block(
                    site, now: now,
                    "a sealed change set of site \(site.hex.prefix(8)) after seq \(envelope.from) holds change "
                        + "\(change.stamp.site.hex.prefix(8)):\(seq), outside its range; nothing of it was applied"
                )
                return .skip
            }
        }
        var claim = VersionVector()
        if envelope.endsRange, pastFence.contains(site) || knownFences[site].map({ envelope.to > $0 }) ?? false {
            // Its changes within the fence are applied; it claims nothing, and the site is asked from the snapshot.
            // (A fence the store raised while the range came, which the session learns at the next pull, showed in
            // what an earlier batch of the range had left out.)
            pastFence.insert(site)
            served.advance(site, to: envelope.to)
            let fence = knownFences[site].map { " (\($0))" } ?? ""
            _ = block(
                site, now: now,
                "the relay's range \(envelope.from + 1)...\(envelope.to) of removed member \(site.hex.prefix(8)) runs "
                    + "past its fence\(fence): what it overwrote within the fence can only come from a member or "
                    + "the relay's snapshot; that site is asked from the snapshot, now and then"
            )
            return .apply(ChangeBatch(changes: batch.changes, claim: claim), received: [:])
        }
        if envelope.endsRange {
            // The other sites' entries of a range's sealed claim are what the stream it was cut from assumed held (the
            // relay's heads) or had sent before its end: its claim counts once those ranges' changes are applied here.
            let requires = VersionVector(batch.claim.entries.filter { $0.key != site })
            if pending[site] == nil, met(requires, with: [:]) {
                claim = VersionVector([site: envelope.to])
                ending[site] = nil
            } else {
                // What proves it is what the store accepted of the range (``applied(_:received:held:)``), never the
                // changes as sent: a removal fence may leave some out.
                ending[site] = PendingClaim(to: envelope.to, received: 0, requires: requires)
            }
        }
        // The relay served the range whole: it holds it, whatever the apply makes of it.
        if envelope.endsRange { served.advance(site, to: envelope.to) }
        return .apply(ChangeBatch(changes: batch.changes, claim: claim), received: received[site].map { [site: $0] } ?? [:])
    }

    /// The result of applying a batch of `envelope`'s site: what its range received so far, the node's vector after
    /// the apply (what the store claimed), and the sites some of whose changes a removal fence left out (`fenced`: a
    /// range of its own site that did runs past a fence, and its end claims nothing).
    public mutating func applied(
        _ envelope: RelayEnvelope,
        received result: [SiteID: UInt64],
        held: VersionVector,
        fenced: Set<SiteID> = []
    ) {
        let site = envelope.site
        if fenced.contains(site), !envelope.endsRange { pastFence.insert(site) }
        if envelope.endsRange {
            received[site] = nil
            resume[site] = nil
            if pastFence.remove(site) != nil {
                // Counts nothing: the cursor stays where the node's claim is.
            } else if var waiting = ending.removeValue(forKey: site) {
                // Kept in `reached` until its claim counts: the range served again meanwhile is no new ground.
                strikes[site] = nil
                cursor.advance(site, to: envelope.to)
                waiting.received = result[site] ?? 0
                pending[site] = merged(pending[site], waiting)
            } else {
                let claim = PendingClaim(to: envelope.to, received: result[site] ?? 0, requires: VersionVector())
                if took(claim, of: site, held: held) {
                    strikes[site] = nil
                    reached[site] = nil
                    cursor.advance(site, to: envelope.to)
                    counted.advance(site, to: min(envelope.to, knownFences[site] ?? .max))
                } else {
                    // The cursor stays: the range is asked again. `reached` stays too: served again as it was, it is no
                    // new ground, and the pulls back off rather than loop.
                    clipped(site, claim, from: envelope.from, held: held)
                }
            }
        } else if let seq = result[site] {
            received[site] = seq
        }
        self.held(held)
    }

    /// Claims that wait no longer: one empty batch claiming them all, with what proves them; nil when none can count
    /// yet. Claims may require each other (two sites' ranges cut from one stream, each holding what overwrote part of
    /// the other): the largest set whose requirements are met by what counted already and by the set itself counts.
    /// The shell applies the batch and reports the node's vector after with ``claimsApplied(held:)``.
    public mutating func readyClaims() -> (batch: ChangeBatch, received: [SiteID: UInt64])? {
        var ready = pending
        var shrinking = !ready.isEmpty
        while shrinking {
            shrinking = false
            for (site, claim) in ready where !met(claim.requires, with: ready) {
                ready[site] = nil
                shrinking = true
            }
        }
        guard !ready.isEmpty else { return nil }
        for site in ready.keys { pending[site] = nil }
        claiming = ready
        var claim = VersionVector()
        var proof: [SiteID: UInt64] = [:]
        for (site, waiting) in ready {
            claim.advance(site, to: waiting.to)
            proof[site] = waiting.received
        }
        return (ChangeBatch(changes: [], claim: claim), proof)
    }

    /// The batch of ``readyClaims()`` was applied, leaving the node with `held`: each claim the store took as far as
    /// its range's changes prove counts; one it took less far is asked again from what the node holds.
    public mutating func claimsApplied(held: VersionVector) {
        for (site, claim) in claiming {
            if took(claim, of: site, held: held) {
                reached[site] = nil
                counted.advance(site, to: min(claim.to, knownFences[site] ?? .max))
            } else {
                var entries = cursor.entries
                entries[site] = max(knownHeld[site], held[site], counted[site])
                cursor = VersionVector(entries)
                clipped(site, claim, from: nil, held: held)
            }
        }
        claiming = [:]
        self.held(held)
    }

    /// Whether the next pull goes at once (nil) or after a wait, in milliseconds: a page that moved nothing (replayed,
    /// misfiled or refused chunks only) would be answered the same way at once; one that brought change sets is
    /// followed no sooner than ``spacingMilliseconds`` after it was asked.
    public mutating func pageEnded() -> UInt64? {
        defer { skipped = [] }
        // The relay serves sites in order: a resume point it passed by (or an empty page) names a range it no longer
        // holds as it was (it lost or rolled back its storage, and holds another upload of it): kept, the site would
        // never be served again. Its range starts again from its first chunk.
        let last = pageSites.max()
        for site in resume.keys where !pageSites.contains(site) && (last.map { $0 > site } ?? true) { forget(site) }
        if pageEntries > 0 && !pageMoved {
            return backoff.next()
        }
        backoff.reset()
        // A page that brought change sets: the next pull follows it no sooner than the spacing after this one was
        // asked, so what a busy writer uploads meanwhile comes in one page.
        guard pageEntries > 0, elapsed < spacingMilliseconds else { return nil }
        return spacingMilliseconds - elapsed
    }

    /// A pull failed: ranges under way start again from their first chunk, and the relay's heads are read first (the
    /// failure may have been the relay going down; the last read after failures reaches the instance that serves the
    /// pulls that follow).
    public mutating func failed() {
        headsDue = true
        served = VersionVector()
        // Claims whose apply failed wait again.
        for (site, claim) in claiming { pending[site] = merged(pending[site], claim) }
        claiming = [:]
        ending = [:]
        pastFence = []
        resume = [:]
        buffers = [:]
        received = [:]
    }

    // MARK: Sites

    private mutating func block(_ site: SiteID, now: UInt64, _ why: String) -> Verdict {
        skipped.insert(site)
        forget(site)
        strikes[site, default: 0] += 1
        let shift = UInt64(min(strikes[site]! - 1, 16))
        blocked[site] = now + min(blockMilliseconds, 2_000 << shift)
        problems.append(why)
        return .skip
    }

    /// Leaves the site out for the rest of the page; it starts again from its first chunk at the next pull.
    private mutating func restart(_ site: SiteID) -> Verdict {
        skipped.insert(site)
        forget(site)
        return .skip
    }

    /// Whether the store took `claim` of `site` as far as what the range's changes prove (``Store``'s proven claim:
    /// up to the highest seq received of the site, within its fence), leaving the node with `held`.
    private func took(_ claim: PendingClaim, of site: SiteID, held: VersionVector) -> Bool {
        held[site] >= min(claim.to, claim.received, knownFences[site] ?? .max)
    }

    /// The store took less of `site`'s claim than the range's changes prove: said once, and the range asked again.
    private mutating func clipped(_ site: SiteID, _ claim: PendingClaim, from: UInt64?, held: VersionVector) {
        let range = from.map { "\($0 + 1)...\(claim.to)" } ?? "up to \(claim.to)"
        problems.append(
            "the store took the claim of site \(site.hex.prefix(8))'s relay range \(range) only to \(held[site]), "
                + "short of the \(claim.received) it received: the range is asked for again"
        )
    }

    private mutating func forget(_ site: SiteID) {
        resume[site] = nil
        buffers[site] = nil
        received[site] = nil
    }

    /// Whether what `requires` names is here: held, brought by ranges whose claims counted, or by the claims `with`.
    /// This node's own site is always here (what it made, it holds; a relay's forged head of it must not hold claims).
    /// Of a fenced site, only what lies within the fence is waited for: nothing beyond ever comes, and a claim waiting
    /// on it would never count (the uploader may hold more of a removed member than this node's fence lets in, until
    /// it signs its own cut: the fence then rises, and the site is asked again up to it).
    private func met(_ requires: VersionVector, with claims: [SiteID: PendingClaim]) -> Bool {
        requires.entries.allSatisfy { site, seq in
            let fence = knownFences[site] ?? .max
            return site == self.site
                || max(knownHeld[site], counted[site], min(claims[site]?.to ?? 0, fence)) >= min(seq, fence)
        }
    }

    private func merged(_ old: PendingClaim?, _ new: PendingClaim) -> PendingClaim {
        guard var old else { return new }
        old.to = max(old.to, new.to)
        old.received = max(old.received, new.received)
        old.requires.merge(new.requires)
        return old
    }
}
