import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity
import ShoalTransport

/// Everything a node's relay link decides outside the pull itself, with no I/O: which instance a request goes to, what
/// a failure means (how long to wait, what status says, whether the token falls back, whether sizes shrink), what
/// status counts of pages and uploads, what the relay lacks, whether a snapshot is due and when one is tried again,
/// and the keys and token in use. ``RelayLink`` keeps one of these under one lock and carries out what its methods
/// return; time comes in as `now` (Unix milliseconds).
struct RelayLinkState: Sendable {
    /// The keys and the token in use: they change when the key rotates.
    struct Credentials: Sendable {
        var keyring: RelayKeyring
        var seal: RelaySeal
        var token: String
    }

    /// What a failure asks of the shell.
    struct Failure: Sendable, Equatable {
        /// How long to wait before the next try.
        var delay: UInt64
        /// What to say (once: nil when it was said last time).
        var report: String?
        /// The event to publish with the report.
        var event: RelayEvent?
        /// Another instance to try at once (its URL, for the log).
        var nextInstance: String?
    }

    /// The relay's instances (base URLs).
    let bases: [String]
    /// The token the node was configured with.
    let configuredToken: String
    var status: RelayStatus
    var credentials: Credentials
    /// The instance in use, and how many instances in a row failed to answer since one last did.
    private(set) var instance = 0
    private var failures = 0
    /// The last failure said, so a repeating one is said once.
    private var lastReported: String?
    /// The largest plaintext sealed into one envelope, and about how many bytes each upload request carries.
    private(set) var pieceBytes: Int
    private(set) var requestBytes: Int
    /// The token the relay said a rotation retired: until another is in use, the grants are fetched before the next
    /// request (a request that left with the old token may come back refused after the new one was adopted).
    var grantsNeeded: String?
    /// What the relay's snapshot leaves uncovered (as last read, plus what this node uploaded since), and the
    /// snapshot's size.
    var uncoveredBytes: Int64 = 0
    var snapshotBytes: Int64 = 0
    /// What the relay's snapshot covers, as last read.
    var snapshotVector = VersionVector()
    /// When the relay's snapshot was last seen to change (any node's), or this node's completed (Unix milliseconds).
    private(set) var snapshotChangedMs: UInt64?
    /// Whether the relay's heads were read once: the first reading tells nothing of when its snapshot changed.
    private var snapshotKnown = false
    /// No snapshot is tried before then (Unix milliseconds): a minute after an attempt began, 10 s after another
    /// node's snapshot completed first.
    private(set) var snapshotRetryMs: UInt64?
    /// The roster members whose grants were last checked (members that join after a rotation get grants).
    var grantedMembers: Set<NodeID>?
    /// When this node last checked that the relay holds every key epoch it holds (monotonic milliseconds).
    var epochsCheckedMs: UInt64?
    /// The relay's heads as last read.
    private(set) var knownHeads: VersionVector?
    /// The relay failed to answer: it may come back having lost or rolled back its storage, so the uploader reads its
    /// heads again (and uploads what it lacks) rather than at its next change or periodic check.
    var headsStale = false
    /// Per site, the end of the ranges the relay served this node since its heads were last read (the pull driver adds
    /// them before it applies them, ``RelayPullEndpoint/relayServed(_:)``): the relay holds them, so the uploader does
    /// not send them back. A rollback of the relay after them is found as any other (``headsStale``), and the heads
    /// read again clear them.
    var served = VersionVector()
    /// The relay processes that answered (``RelayAPI/bootHeader``), the latest last; at most
    /// ``rememberedBoots``, so a balancer that spreads requests over several instances wakes nothing once each
    /// answered.
    private(set) var boots: [String] = []
    static let rememberedBoots = 64

    init(bases: [String], configuredToken: String, credentials: Credentials, pieceBytes: Int, requestBytes: Int) {
        self.bases = bases
        self.configuredToken = configuredToken
        self.credentials = credentials
        self.pieceBytes = pieceBytes
        self.requestBytes = requestBytes
        status = RelayStatus(url: bases[0])
        status.epoch = credentials.keyring.newest
    }

    /// The state a link to `bases` starts from: `keyring`'s newest epoch seals, and its token, if it holds one (a
    /// rotation's), is used rather than the configured one.
    init(bases: [String], configuration: RelayClientConfiguration, keyring: RelayKeyring) {
        self.init(
            bases: bases,
            configuredToken: configuration.token,
            credentials: Credentials(
                keyring: keyring,
                seal: RelaySeal(
                    secrets: keyring.secrets(clusterSecret: configuration.clusterSecret),
                    epoch: keyring.newest
                ),
                token: keyring.token ?? configuration.token
            ),
            pieceBytes: configuration.pieceBytes,
            requestBytes: configuration.requestBytes
        )
    }

    // MARK: Answers

    /// Instance `used` answered: true when the relay just became reachable (to be said once).
    mutating func answered(_ used: Int, ok: Bool, now: UInt64) -> Bool {
        failures = 0
        status.url = bases[used]
        if ok {
            status.unauthorized = false
            status.problem = nil
        }
        guard status.reachable != true else { return false }
        status.reachable = true
        status.sinceMs = now
        lastReported = nil
        return true
    }

    /// An answer named relay process `boot`: true when it is new and another one answered before it (a restart,
    /// perhaps from an older copy, or another instance), and then its heads are to be read again and its key epochs
    /// checked again, and what the others served no longer counts as held by the relay.
    mutating func answered(by boot: String) -> Bool {
        if let known = boots.firstIndex(of: boot) {
            if known != boots.count - 1 { boots.append(boots.remove(at: known)) }
            return false
        }
        defer {
            boots.append(boot)
            if boots.count > Self.rememberedBoots { boots.removeFirst() }
        }
        guard !boots.isEmpty else { return false }
        headsStale = true
        epochsCheckedMs = nil
        served = VersionVector()
        return true
    }

    /// A failure that costs no backoff (it concerns one site; the others go on): true when it is new, to be said.
    mutating func note(_ reason: String, now: UInt64) -> Bool {
        status.lastError = reason
        status.lastErrorMs = now
        defer { lastReported = reason }
        return lastReported != reason
    }

    /// A page of `chunks` chunks was pulled, `applied` changes of them applied.
    mutating func pulled(chunks: Int, applied: Int, now: UInt64) {
        status.lastPullMs = now
        status.received += UInt64(chunks)
        status.applied += UInt64(applied)
    }

    /// An upload cut change sets: `plaintextBytes` of encoded batches, sealed into `sealedBytes` (compressed first
    /// where that paid).
    mutating func cut(plaintextBytes: Int, sealedBytes: Int) {
        status.plaintextBytes += UInt64(plaintextBytes)
        status.sealedBytes += UInt64(sealedBytes)
    }

    /// An upload request went through: the relay stored `stored` chunks of `bytes` bytes, to its change log or (when
    /// `toSnapshot`) to a snapshot, which leaves nothing new uncovered.
    mutating func uploaded(stored: Int, bytes: Int, toSnapshot: Bool, now: UInt64) {
        if !toSnapshot { uncoveredBytes += Int64(bytes) }
        status.lastPushMs = now
        status.uploaded += UInt64(stored)
    }

    /// Takes ``headsStale``: true once after the relay failed to answer, for the uploader to read its heads again.
    mutating func takeHeadsStale() -> Bool {
        defer { headsStale = false }
        return headsStale
    }

    // MARK: Heads and snapshots

    /// The relay's heads were read: what they say of its sizes is kept, and what it served before them is in them.
    mutating func read(_ heads: RelayHeads, now: UInt64 = 0) {
        served = VersionVector()
        uncoveredBytes = heads.uncoveredBytes ?? 0
        snapshotBytes = heads.snapshot?.bytes ?? 0
        let vector = heads.snapshot.flatMap { try? RelayAPI.vector($0.vector) } ?? VersionVector()
        if snapshotKnown, vector != snapshotVector { snapshotChangedMs = now }
        snapshotKnown = true
        snapshotVector = vector
    }

    /// What to say when the relay's `heads` claim more of this node's own `site` than it `held`: nobody holds more of
    /// it than the node itself, so such a head is a forged or corrupt range, which hides this node's next
    /// transactions from the relay until its operator removes it.
    static func forgedRange(heads: VersionVector, held: VersionVector, site: SiteID) -> String? {
        guard heads[site] > held[site] else { return nil }
        return "the relay claims transactions \(held[site] + 1)...\(heads[site]) of this node's own site, which it "
            + "never made: a forged or corrupt range; this node's later writes cannot reach the relay until its "
            + "operator removes that range"
    }

    /// What the relay lacks of what this node holds, given the relay's `heads`.
    mutating func lacking(held: VersionVector, heads: VersionVector, site: SiteID, now: UInt64) {
        knownHeads = heads
        var lacking: UInt64 = 0
        for (site, seq) in held.entries where seq > heads[site] { lacking += seq - heads[site] }
        // A head beyond what this node made of its own site cannot be trusted (a forged or corrupt range).
        if heads[site] > held[site] { lacking += 1 }
        status.lacking = lacking
        if lacking == 0 {
            status.lackingSinceMs = nil
        } else if status.lackingSinceMs == nil {
            status.lackingSinceMs = now
        }
    }

    /// Whether this node should upload a snapshot now: it holds exactly what the relay holds (a node still catching up
    /// would cover less than the snapshot it replaces), the change sets the relay's snapshot leaves uncovered outgrew
    /// both that snapshot and `minimumBytes`, and no attempt of its failed in the last minute.
    ///
    /// Of a removed member's site, what the relay holds counts up to its `fences` entry (what lies beyond reaches no
    /// member). When the relay holds more of it than the fence, the member's own ranges run past it: what they
    /// overwrote within the fence reaches the members that lack it only from a snapshot (``RelayPullSession``), so one
    /// is due whenever the relay's covers less of that site than this node holds, whatever the sizes. Such a range
    /// stays uncovered for good, and its bytes with it: the sizes then make a snapshot due at most once every
    /// ``pastFenceSnapshotSpacingMilliseconds`` after this node's last.
    ///
    /// `owed`: a member suspended for collection needs a snapshot covering what was collected without it
    /// (``SyncNode/relaySnapshotOwed(covering:)``): one is due whatever the sizes, once the relay's snapshot last
    /// changed ``owedSnapshotSpacingMilliseconds`` ago or more.
    func snapshotDue(
        held: VersionVector,
        heads: VersionVector,
        fences: [SiteID: UInt64] = [:],
        minimumBytes: Int64,
        owed: Bool = false,
        now: UInt64
    ) -> Bool {
        let pastFences = fences.filter { heads[$0.key] > $0.value }
        var reachable = heads.entries
        for (site, fence) in pastFences { reachable[site] = fence }
        guard held.compare(VersionVector(reachable)) == .equal else { return false }
        if let retry = snapshotRetryMs, now < retry { return false }
        if owed, snapshotChangedMs.map({ now >= $0 + Self.owedSnapshotSpacingMilliseconds }) ?? true { return true }
        if pastFences.keys.contains(where: { snapshotVector[$0] < held[$0] }) { return true }
        if !pastFences.isEmpty, let last = status.lastSnapshotMs, now < last + Self.pastFenceSnapshotSpacingMilliseconds {
            return false
        }
        return uncoveredBytes >= max(minimumBytes, snapshotBytes)
    }

    /// With a removed member's range past its fence in the relay, the least time between two snapshots this node
    /// uploads for the sizes alone.
    static let pastFenceSnapshotSpacingMilliseconds: UInt64 = 600_000
    /// The least time between the relay's snapshot changing (whoever uploaded it) and a snapshot this node uploads for
    /// a member suspended for collection: while the member stays away, the cluster's writes move the cuts it was
    /// collected without, and each move makes one due (once from every node a minute; now about one a minute in all,
    /// and the member back waits about that long).
    static let owedSnapshotSpacingMilliseconds: UInt64 = 60_000

    /// How a snapshot upload ended.
    enum SnapshotEnd: Sendable, Equatable {
        /// The relay holds it whole: it covers everything uploaded so far.
        case completed
        /// The node had nothing to put in it.
        case empty
        /// Another node's snapshot completed meanwhile and replaced it: nothing failed, so the next attempt comes in
        /// about 10 s rather than a minute.
        case replaced
    }

    /// A snapshot upload begins: were it to fail, the next waits a minute.
    mutating func snapshotStarted(now: UInt64) {
        snapshotRetryMs = now + 60_000
    }

    /// A snapshot upload ended with `end` (any other failure leaves the minute's wait).
    mutating func snapshotEnded(_ end: SnapshotEnd, now: UInt64) {
        switch end {
        case .completed:
            status.lastSnapshotMs = now
            snapshotChangedMs = now
            uncoveredBytes = 0
            snapshotRetryMs = nil
        case .empty:
            snapshotRetryMs = nil
        case .replaced:
            snapshotRetryMs = now + 10_000
        }
    }

    // MARK: Key epochs

    /// Keeps the epochs of `grants`, seals with the newest from now on, and uses its token; returns the keyring to save
    /// and the newest epoch.
    mutating func adopt(
        _ grants: [(epoch: UInt32, contents: EpochGrant.Contents)],
        clusterSecret: [UInt8]
    ) -> (RelayKeyring, UInt32) {
        let before = credentials.keyring.newest
        for grant in grants {
            let epoch = RelayKeyring.Epoch(
                epoch: grant.epoch,
                secret: Data(grant.contents.secret).base64EncodedString(),
                removed: grant.contents.removed.map(\.description)
            )
            // An epoch held with another secret: the relay lost its state and a member who never learnt this one
            // started the same epoch afresh. The relay's (a member signed it) is the one everyone can reach now; what
            // was sealed with the other lived only on the relay that lost it.
            credentials.keyring.epochs.removeAll { $0.epoch == grant.epoch && $0.secret != epoch.secret }
            if !credentials.keyring.epochs.contains(where: { $0.epoch == grant.epoch }) {
                credentials.keyring.epochs.append(epoch)
            }
        }
        credentials.keyring.epochs.sort { $0.epoch < $1.epoch }
        if let latest = grants.max(by: { $0.epoch < $1.epoch }), latest.epoch >= before, !latest.contents.token.isEmpty {
            credentials.keyring.token = latest.contents.token
            credentials.token = latest.contents.token
        }
        credentials.seal = RelaySeal(
            secrets: credentials.keyring.secrets(clusterSecret: clusterSecret),
            epoch: credentials.keyring.newest
        )
        status.epoch = credentials.keyring.newest
        grantedMembers = nil
        return (credentials.keyring, credentials.keyring.newest)
    }

    // MARK: Failures

    /// Records a failure of a request to instance `used` (where it applies) and says what to do next.
    mutating func failed(
        _ error: RelayCallError,
        backoff: inout Backoff,
        unauthorizedBackoffMilliseconds: UInt64,
        now: UInt64,
        random: inout some RandomNumberGenerator
    ) -> Failure {
        var delay = backoff.next(using: &random)
        let reason: String
        switch error {
        case .cancelled:
            return Failure(delay: 0)
        case .unreachable(let why, let used, let problem), .server(let why, let used, let problem):
            switch problem {
            case .unreachable: reason = "the relay at \(bases[used]) did not answer: \(why)"
            case .storageDown: reason = "the relay at \(bases[used]) answered that its storage is down: \(why)"
            case .serverError: reason = "the relay at \(bases[used]) answered with a server error: \(why)"
            case .untrustedCertificate, .wrongHost, .tlsFailed: reason = "the relay at \(bases[used]): \(why)"
            }
            // A relay that comes back may have lost or rolled back its storage: its key epochs are checked again
            // before the next upload, and the uploader reads its heads again (it retries, with its backoff, until
            // the relay answers): an idle node sends what the relay lost without waiting for a write of its own.
            epochsCheckedMs = nil
            headsStale = true
            // The next instance is tried at once, until every one has failed in a row; then the backoff holds. The
            // upload and the pull loops share the instance: a failure moves on only from the instance it met (the
            // other loop may have moved on already), and counts once per instance.
            if bases.count > 1 {
                if instance == used {
                    failures += 1
                    instance = (used + 1) % bases.count
                }
                if failures < bases.count {
                    return Failure(delay: UInt64.random(in: 0...50, using: &random), nextInstance: bases[instance])
                }
            }
            if status.reachable != false { status.sinceMs = now }
            status.reachable = false
            status.problem = problem
            status.url = bases[instance]
        case .unauthorized(let why, let refused):
            reason = "the relay refused the token: \(why)"
            // The relay may have lost its tokens with the rest of its storage: check its key epochs again first.
            epochsCheckedMs = nil
            var fellBack = true
            if let refused, refused != credentials.token {
                // Refused a token no longer in use (the other loop moved on meanwhile): try again soon.
            } else if credentials.token != configuredToken {
                // A token from a rotation refused: try the configured one (an operator may have made a new one).
                credentials.token = configuredToken
            } else {
                fellBack = false
            }
            if !fellBack { delay = max(delay, unauthorizedBackoffMilliseconds) }
        case .rotated(let why, let token):
            reason = "the relay retired the token at a key rotation (\(why)); fetching this node's grant"
            grantsNeeded = token
        case .epochRetired(let why, let token):
            reason = "the relay refused an upload sealed with a retired key epoch (\(why)); fetching this node's grant"
            grantsNeeded = token
        case .ungranted(let why):
            // Retried with the ordinary backoff: a member adds grants for members it sees joining.
            reason = "the relay refused the token: \(why)"
        case .conflict(_, let why):
            reason = "relay: \(why)"
        case .rateLimited(let seconds, let why):
            reason = "the relay limits requests: \(why)"
            delay = max(delay, UInt64(max(1, seconds)) * 1000 + UInt64.random(in: 0...500, using: &random))
        case .tooLarge(let limit, let why):
            reason = "the relay refused a request as too large: \(why)"
            // Under the limit the relay named (it may be the request's or a change set's), with room for headers.
            let cap = limit.map { max(2 * 1024, $0 / 2) } ?? Int.max
            pieceBytes = max(1024, min(pieceBytes / 2, cap))
            requestBytes = max(2 * 1024, min(requestBytes / 2, cap))
        case .refused(let why), .malformed(let why), .noUploadKey(let why):
            reason = "relay: \(why)"
        case .local(let why):
            reason = "relay changes could not be used here: \(why.message)"
        }
        status.lastError = reason
        status.lastErrorMs = now
        let refusedToken: Bool
        switch error {
        case .unauthorized, .ungranted: refusedToken = true
        default: refusedToken = false
        }
        switch error {
        case .unauthorized, .ungranted: status.unauthorized = true
        case .rotated, .epochRetired: break
        default: status.unauthorized = false
        }
        defer { lastReported = reason }
        guard lastReported != reason else { return Failure(delay: delay) }
        return Failure(
            delay: delay,
            report: "\(reason); retrying in \(delay / 1000) s and later with backoff",
            event: refusedToken ? .unauthorized(reason) : .failed(reason)
        )
    }
}

extension RelayLinkState.Failure {
    init(delay: UInt64, nextInstance: String? = nil) {
        self.init(delay: delay, report: nil, event: nil, nextInstance: nextInstance)
    }
}
