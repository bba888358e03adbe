import Foundation
import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelayClient

/// The relay link's decisions outside the pull, driven with an injected clock and randomness: which instance next,
/// what a failure costs, what status says, and when a snapshot is due.
@Suite struct RelayLinkStateTests {
    private func state(instances: Int = 1, token: String = "configured") -> RelayLinkState {
        RelayLinkState(
            bases: (0..<instances).map { "http://127.0.0.1:\(8000 + $0)" },
            configuredToken: token,
            credentials: RelayLinkState.Credentials(
                keyring: RelayKeyring(),
                seal: RelaySeal(clusterSecret: Array(repeating: 1, count: 32)),
                token: token
            ),
            pieceBytes: 1 << 20,
            requestBytes: 8 << 20
        )
    }

    private func backoff() -> Backoff { Backoff(initialMilliseconds: 100, maximumMilliseconds: 1_000, jitter: 1...1) }

    @Test func anInstanceThatDoesNotAnswerMovesToTheNextAtOnceUntilEveryOneFailedInARow() {
        var link = state(instances: 3)
        var backoff = backoff()
        var random = SplitMix(state: 1)
        let down = RelayCallError.unreachable("refused", instance: 0, problem: .unreachable)
        let first = link.failed(down, backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000, now: 10, random: &random)
        #expect(first.nextInstance == "http://127.0.0.1:8001" && first.delay <= 50 && first.report == nil)
        #expect(link.instance == 1 && link.status.reachable == nil)
        // The other loop's failure against the instance already left does not move on again.
        _ = link.failed(down, backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000, now: 11, random: &random)
        #expect(link.instance == 1)
        _ = link.failed(
            .unreachable("refused", instance: 1, problem: .unreachable), backoff: &backoff,
            unauthorizedBackoffMilliseconds: 60_000, now: 12, random: &random
        )
        let last = link.failed(
            .server("503", instance: 2, problem: .storageDown), backoff: &backoff,
            unauthorizedBackoffMilliseconds: 60_000, now: 13, random: &random
        )
        // Every instance failed in a row: the backoff holds, and status says why.
        #expect(last.nextInstance == nil && last.delay >= 100)
        #expect(link.status.reachable == false && link.status.problem == .storageDown)
        #expect(last.report?.contains("storage is down") == true)
        // An answer resets the count and is said once.
        let cameBack = link.answered(0, ok: true, now: 20)
        let second = link.answered(0, ok: true, now: 21)
        #expect(cameBack && !second)
        #expect(link.status.reachable == true && link.status.problem == nil)
    }

    @Test func aRelayProcessNotSeenBeforeMakesTheHeadsBeReadAgainOnceAndInstancesTakingTurnsDoNot() {
        var link = state()
        link.served.merge(VersionVector([SiteID(high: 7, low: 7): 9]))
        // The first process met: the heads are read at the start anyway.
        let first = [link.answered(by: "a"), link.takeHeadsStale(), link.answered(by: "a")]
        #expect(first == [false, false, false])
        // A restart (perhaps from an older copy): read again, check the epochs again, and trust nothing it served.
        link.epochsCheckedMs = 5
        let restarted = link.answered(by: "b")
        let stale = link.takeHeadsStale()
        #expect(restarted && stale && link.epochsCheckedMs == nil && link.served == VersionVector())
        // Two instances behind a balancer, answering in turns: no loop of heads reads.
        let turns = [link.answered(by: "a"), link.answered(by: "b"), link.answered(by: "a"), link.takeHeadsStale()]
        #expect(turns == [false, false, false, false])
        // Only the last ones are remembered.
        for boot in 0..<RelayLinkState.rememberedBoots { _ = link.answered(by: "other \(boot)") }
        let forgotten = link.answered(by: "b")
        #expect(forgotten && link.boots.count == RelayLinkState.rememberedBoots)
    }

    @Test func aRepeatingFailureIsSaidOnceAndARefusedRotationTokenFallsBackToTheConfiguredOne() {
        var link = state(token: "configured")
        link.credentials.token = "rotated"
        var backoff = backoff()
        var random = SplitMix(state: 2)
        let refused = RelayCallError.unauthorized("revoked", token: "rotated")
        let refusal = link.failed(refused, backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000, now: 1, random: &random)
        #expect(link.credentials.token == "configured" && refusal.delay < 60_000)
        #expect(refusal.event == .unauthorized("the relay refused the token: revoked") && link.status.unauthorized)
        // The configured token refused too: the node waits long, and says nothing new.
        let again = link.failed(
            .unauthorized("revoked", token: "configured"), backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000,
            now: 2, random: &random
        )
        #expect(again.delay >= 60_000 && again.report == nil && again.event == nil)
    }

    @Test func aRequestTooLargeHalvesTheSizesUnderTheRelaysLimitAndRateLimitsWaitAsTold() {
        var link = state()
        var backoff = backoff()
        var random = SplitMix(state: 3)
        _ = link.failed(
            .tooLarge(limit: 100_000, "too large"), backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000, now: 1,
            random: &random
        )
        #expect(link.pieceBytes == 50_000 && link.requestBytes == 50_000)
        let limited = link.failed(
            .rateLimited(retryAfterSeconds: 7, "slow down"), backoff: &backoff, unauthorizedBackoffMilliseconds: 60_000,
            now: 2, random: &random
        )
        #expect(limited.delay >= 7_000 && limited.delay <= 7_500)
    }

    @Test func aSnapshotIsDueOnlyWhenTheNodeHoldsExactlyWhatTheRelayHoldsAndTheLogOutgrewTheSnapshot() {
        var link = state()
        let site = SiteID.random()
        let heads = VersionVector([site: 5])
        link.uncoveredBytes = 10_000
        link.snapshotBytes = 4_000
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 100_000))
        #expect(!link.snapshotDue(held: VersionVector([site: 4]), heads: heads, minimumBytes: 8_000, now: 100_000))
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 20_000, now: 100_000))
        link.snapshotStarted(now: 90_000)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 100_000))
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 150_001))
        // What the relay lacks counts from when it began; a head beyond this node's own site is counted as suspect.
        link.lacking(held: VersionVector([site: 8]), heads: heads, site: site, now: 7)
        #expect(link.status.lacking == 3 && link.status.lackingSinceMs == 7)
        link.lacking(held: VersionVector([site: 8]), heads: VersionVector([site: 9]), site: site, now: 9)
        #expect(link.status.lacking == 1 && link.status.lackingSinceMs == 7)
    }

    /// A member suspended for collection reads its fresh state from a snapshot covering what was collected without
    /// it: one is due whatever the sizes, at once when the relay's snapshot has not changed since this node first read
    /// its heads, then only once it last changed a minute ago, whoever uploaded it (while the member stays away, every
    /// write moves the cuts: every node uploaded one a minute once). Never while this node lacks some of what the relay
    /// holds.
    @Test func aSnapshotOwedToASuspendedMemberIsDueAtOnceThenSpacedFromTheRelaysLastChange() {
        var link = state()
        let site = SiteID.random()
        let heads = VersionVector([site: 5])
        func snapshot(_ seq: UInt64) -> RelayHeads {
            RelayHeads(heads: [:], snapshot: RelaySnapshotInfo(
                id: "\(seq)", vector: [RelayAPI.key(site): seq], bytes: 1 << 20, createdMs: 1
            ), uncoveredBytes: 0)
        }
        link.read(snapshot(3), now: 50_000)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 100_000), "the sizes alone")
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, owed: true, now: 100_000))
        #expect(
            !link.snapshotDue(held: VersionVector([site: 4]), heads: heads, minimumBytes: 8_000, owed: true, now: 100_000)
        )
        // Another node's snapshot lands: the next owed one waits a minute from then.
        link.read(snapshot(4), now: 200_000)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, owed: true, now: 259_999))
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, owed: true, now: 260_000))
        // So does this node's own.
        link.snapshotStarted(now: 260_000)
        link.snapshotEnded(.completed, now: 270_000)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, owed: true, now: 329_999))
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, owed: true, now: 330_000))
    }

    /// A removed member's site counts up to its fence. The relay holding more of it (the member's own range past the
    /// fence) makes a snapshot due whenever the relay's covers less of that site than this node holds, whatever the
    /// sizes; and for the sizes (that range stays uncovered for good) at most every 10 minutes.
    @Test func aRemovedMembersRangePastItsFenceMakesASnapshotDueUntilOneHoldsItsSiteUpToTheFence() {
        var link = state()
        let (site, removed) = (SiteID.random(), SiteID.random())
        let heads = VersionVector([site: 5, removed: 33])
        let held = VersionVector([site: 5, removed: 14])
        link.uncoveredBytes = 0
        #expect(!link.snapshotDue(held: held, heads: heads, minimumBytes: 8_000, now: 100_000))
        #expect(link.snapshotDue(held: held, heads: heads, fences: [removed: 14], minimumBytes: 8_000, now: 100_000))
        #expect(
            !link.snapshotDue(
                held: VersionVector([site: 4, removed: 14]), heads: heads, fences: [removed: 14], minimumBytes: 8_000,
                now: 100_000
            ),
            "a node that lacks some of what the relay holds"
        )
        link.read(RelayHeads(heads: [:], snapshot: RelaySnapshotInfo(
            id: "1", vector: [RelayAPI.key(site): 5, RelayAPI.key(removed): 14], bytes: 100, createdMs: 1
        ), uncoveredBytes: 1 << 20))
        #expect(
            link.snapshotDue(held: held, heads: heads, fences: [removed: 14], minimumBytes: 8_000, now: 100_000),
            "the snapshot holds the site up to the fence: the sizes decide"
        )
        // The range past the fence stays uncovered for good: after this node's snapshot, the sizes wait 10 minutes.
        link.snapshotStarted(now: 100_000)
        link.snapshotEnded(.completed, now: 100_000)
        link.uncoveredBytes = 1 << 20
        #expect(!link.snapshotDue(held: held, heads: heads, fences: [removed: 14], minimumBytes: 8_000, now: 699_999))
        #expect(link.snapshotDue(held: held, heads: heads, fences: [removed: 14], minimumBytes: 8_000, now: 700_000))
        // Without the range past the fence, the sizes decide again.
        #expect(
            link.snapshotDue(
                held: held, heads: VersionVector([site: 5, removed: 14]), fences: [removed: 14], minimumBytes: 8_000,
                now: 100_000
            )
        )
    }

    @Test func theUploaderReadsHeadsFirstAfterFailuresAndNowAndThenAndCutsAgainWithBackoffWhenRaced() {
        var session = RelayUploadSession(backoff: backoff(), headsRefreshMilliseconds: 30_000)
        var random = SplitMix(state: 4)
        let site = SiteID.random()
        let heads = { (seq: UInt64) in VersionVector([site: seq]) }
        #expect(session.start(now: 0, stale: false) == .readHeads)
        #expect(session.read(heads(3), now: 0) == .upload(since: heads(3)))
        #expect(session.uploaded(heads: heads(3), finished: true, random: &random) == .checkSnapshot(heads: heads(3)))
        #expect(session.snapshotChecked(due: false) == .done)
        // Heads read lately are used as they are.
        #expect(session.start(now: 10_000, stale: false) == .upload(since: heads(3)))
        session.failed()
        // The relay failed to answer meanwhile: it may be back with less.
        #expect(session.start(now: 10_000, stale: true) == .readHeads)
        #expect(session.read(heads(1), now: 10_000) == .upload(since: heads(1)))
        session.failed()
        // A step failed: the heads are read again.
        #expect(session.start(now: 10_000, stale: false) == .readHeads)
        #expect(session.read(heads(1), now: 10_000) == .upload(since: heads(1)))
        #expect(session.uploaded(heads: heads(1), finished: true, random: &random) == .checkSnapshot(heads: heads(1)))
        #expect(session.snapshotChecked(due: false) == .done)
        // Heads read more than 30 s ago are read again.
        #expect(session.start(now: 40_001, stale: false) == .readHeads)
        #expect(session.read(heads(1), now: 40_001) == .upload(since: heads(1)))
        // The relay refused a range for a gap (another uploader moved the heads, or the relay lost ranges: what it
        // answered may still be too high here): the heads are read again, at once, then with a growing wait; a whole
        // upload resets it.
        #expect(session.uploaded(heads: heads(2), finished: false, random: &random) == .again(waitMilliseconds: 0))
        #expect(session.start(now: 40_001, stale: false) == .readHeads)
        #expect(session.read(heads(2), now: 40_001) == .upload(since: heads(2)))
        #expect(session.uploaded(heads: heads(4), finished: false, random: &random) == .again(waitMilliseconds: 100))
        #expect(session.start(now: 40_001, stale: false) == .readHeads)
        // A relay restored from an older copy: its heads are lower than the answer left them here.
        #expect(session.read(heads(1), now: 40_001) == .upload(since: heads(1)))
        #expect(session.uploaded(heads: heads(5), finished: false, random: &random) == .again(waitMilliseconds: 200))
        #expect(session.start(now: 40_001, stale: false) == .readHeads)
        #expect(session.read(heads(5), now: 40_001) == .upload(since: heads(5)))
        #expect(session.uploaded(heads: heads(6), finished: true, random: &random) == .checkSnapshot(heads: heads(6)))
        #expect(session.snapshotChecked(due: false) == .done)
        #expect(session.start(now: 40_002, stale: false) == .upload(since: heads(6)))
        #expect(session.uploaded(heads: heads(7), finished: false, random: &random) == .again(waitMilliseconds: 0))
        session.failed()
        #expect(session.start(now: 40_003, stale: false) == .readHeads && session.lastHeads == heads(7))
    }

    /// Every change wakes the uploader; while changes keep coming, a pass starts no sooner than the spacing after the
    /// last one started, so a busy moment's changes go up in one request. After a quiet moment, at once.
    @Test func theUploaderStartsPassesNoCloserThanTheSpacing() {
        var session = RelayUploadSession(backoff: backoff(), headsRefreshMilliseconds: 30_000, spacingMilliseconds: 20)
        #expect(session.pause(now: 1_000) == 0)
        #expect(session.start(now: 1_000, stale: false) == .readHeads)
        #expect(session.pause(now: 1_004) == 16)
        #expect(session.pause(now: 1_019) == 1)
        #expect(session.pause(now: 1_020) == 0)
        #expect(session.pause(now: 5_000) == 0)
        var unpaced = RelayUploadSession(backoff: backoff())
        _ = unpaced.start(now: 1_000, stale: false)
        #expect(unpaced.pause(now: 1_000) == 0)
    }

    /// A pass in order: heads, upload, whether a snapshot is due; if so the heads again (another node may have just
    /// uploaded one), whether it is still due with those, and only then the snapshot.
    @Test func aSnapshotGoesUpOnlyAfterAWholeUploadAndAFreshReadOfTheHeadsThatStillCallForIt() {
        var session = RelayUploadSession(backoff: backoff(), headsRefreshMilliseconds: 30_000)
        var random = SplitMix(state: 4)
        let site = SiteID.random()
        let heads = { (seq: UInt64) in VersionVector([site: seq]) }
        #expect(session.start(now: 0, stale: false) == .readHeads)
        #expect(session.read(heads(2), now: 0) == .upload(since: heads(2)))
        #expect(session.uploaded(heads: heads(5), finished: true, random: &random) == .checkSnapshot(heads: heads(5)))
        #expect(session.snapshotChecked(due: true) == .readHeads)
        // The heads read again are checked, not uploaded to.
        #expect(session.read(heads(5), now: 1) == .checkSnapshot(heads: heads(5)))
        #expect(session.snapshotChecked(due: true) == .uploadSnapshot)
        #expect(session.snapshotUploaded() == .done)
        // Due after the upload, but no longer with the heads read again: no snapshot.
        #expect(session.start(now: 2, stale: false) == .upload(since: heads(5)))
        #expect(session.uploaded(heads: heads(6), finished: true, random: &random) == .checkSnapshot(heads: heads(6)))
        #expect(session.snapshotChecked(due: true) == .readHeads)
        #expect(session.read(heads(6), now: 3) == .checkSnapshot(heads: heads(6)))
        #expect(session.snapshotChecked(due: false) == .done)
        // An upload the relay's heads moved under: no snapshot in that pass.
        #expect(session.start(now: 4, stale: false) == .upload(since: heads(6)))
        #expect(session.uploaded(heads: heads(8), finished: false, random: &random) == .again(waitMilliseconds: 0))
        // A failure while the heads were read again for a snapshot: the next pass reads them for an upload.
        #expect(session.start(now: 5, stale: false) == .readHeads)
        #expect(session.read(heads(8), now: 5) == .upload(since: heads(8)))
        #expect(session.uploaded(heads: heads(8), finished: true, random: &random) == .checkSnapshot(heads: heads(8)))
        #expect(session.snapshotChecked(due: true) == .readHeads)
        session.failed()
        #expect(session.start(now: 6, stale: false) == .readHeads)
        #expect(session.read(heads(8), now: 6) == .upload(since: heads(8)))
    }

    @Test func aSnapshotIsTriedAgainAMinuteAfterAFailureTenSecondsAfterAnotherNodesAndAtOnceWhenEmpty() {
        var link = state()
        let site = SiteID.random()
        let heads = VersionVector([site: 5])
        link.read(RelayHeads(heads: [:], snapshot: RelaySnapshotInfo(id: "1", vector: [:], bytes: 4_000, createdMs: 0)))
        #expect(link.snapshotBytes == 4_000 && link.uncoveredBytes == 0)
        link.uploaded(stored: 2, bytes: 10_000, toSnapshot: false, now: 5)
        link.uploaded(stored: 3, bytes: 50_000, toSnapshot: true, now: 6)
        // What went into a snapshot leaves nothing new uncovered; status counts both.
        #expect(link.uncoveredBytes == 10_000 && link.status.uploaded == 5 && link.status.lastPushMs == 6)
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 100_000))
        // An attempt that fails holds the next for a minute.
        link.snapshotStarted(now: 100_000)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 159_999))
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 160_000))
        // Another node's snapshot completed first: nothing failed, the next comes in 10 s.
        link.snapshotStarted(now: 200_000)
        link.snapshotEnded(.replaced, now: 200_500)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 210_499))
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 210_500))
        // Nothing to put in one: the next may come at once.
        link.snapshotStarted(now: 300_000)
        link.snapshotEnded(.empty, now: 300_001)
        #expect(link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 300_002))
        // A whole snapshot covers everything uploaded so far.
        link.snapshotStarted(now: 400_000)
        link.snapshotEnded(.completed, now: 400_100)
        #expect(link.uncoveredBytes == 0 && link.status.lastSnapshotMs == 400_100)
        #expect(!link.snapshotDue(held: heads, heads: heads, minimumBytes: 8_000, now: 400_200))
    }

    @Test func pagesCountInStatusAndAStaleRelayIsTakenOnce() {
        var link = state()
        var backoff = backoff()
        var random = SplitMix(state: 5)
        link.pulled(chunks: 4, applied: 3, now: 10)
        link.pulled(chunks: 0, applied: 0, now: 20)
        #expect(link.status.received == 4 && link.status.applied == 3 && link.status.lastPullMs == 20)
        let before = link.takeHeadsStale()
        #expect(!before)
        _ = link.failed(
            .unreachable("refused", instance: 0, problem: .unreachable), backoff: &backoff,
            unauthorizedBackoffMilliseconds: 60_000, now: 30, random: &random
        )
        let first = link.takeHeadsStale()
        let second = link.takeHeadsStale()
        #expect(first && !second)
    }

    @Test func aHeadBeyondWhatThisNodeMadeOfItsOwnSiteIsSaid() {
        let own = SiteID.random()
        let other = SiteID.random()
        let held = VersionVector([own: 4, other: 1])
        #expect(RelayLinkState.forgedRange(heads: VersionVector([own: 4, other: 9]), held: held, site: own) == nil)
        let said = RelayLinkState.forgedRange(heads: VersionVector([own: 7]), held: held, site: own)
        #expect(said?.contains("transactions 5...7 of this node's own site") == true)
    }

    @Test func aLinkStartsWithItsKeyringsNewestEpochAndTokenOrTheConfiguredOne() throws {
        var configuration = RelayClientConfiguration(
            url: "https://relay.example", token: "configured", clusterID: "c",
            clusterSecret: Array(repeating: 1, count: 32), logger: Logger(label: "test")
        )
        configuration.pieceBytes = 4_096
        let bases = ["https://relay.example"]
        let fresh = RelayLinkState(bases: bases, configuration: configuration, keyring: RelayKeyring())
        #expect(fresh.credentials.token == "configured" && fresh.pieceBytes == 4_096 && fresh.status.epoch == 0)
        var keyring = RelayKeyring()
        let secret = Data(repeating: 2, count: 32).base64EncodedString()
        keyring.epochs = [RelayKeyring.Epoch(epoch: 3, secret: secret, removed: [])]
        keyring.token = "rotated"
        let rotated = RelayLinkState(bases: bases, configuration: configuration, keyring: keyring)
        #expect(rotated.credentials.token == "rotated" && rotated.configuredToken == "configured")
        #expect(rotated.credentials.seal.epoch == 3 && rotated.status.epoch == 3)
    }
}
