import ShoalCore

/// What a node's uploader decides, with no I/O: when the relay's heads must be read (first, after a failure, after
/// the relay failed to answer, after it refused a range for a gap, and now and then since another uploader or an
/// operator may move them), what to upload (everything the heads lack), what to do when the heads moved under an
/// upload (read them and cut again at once the first time, then with backoff), when a pass may start (no closer than
/// the spacing to the one before), and in which order a pass goes: heads, upload, whether a snapshot is due, the
/// heads read again (another node may have just uploaded one), whether it is still due, the snapshot. ``RelayLink``
/// carries out each step and reports its result, which returns the next; time comes in as `now` (monotonic
/// milliseconds).
struct RelayUploadSession: Sendable {
    /// What the uploader does next.
    enum Step: Sendable, Equatable {
        /// Read the relay's heads, then hand them to ``read(_:now:)``.
        case readHeads
        /// Upload what `since` lacks (a cursor opened at it), then report with ``uploaded(heads:finished:random:)``.
        case upload(since: VersionVector)
        /// Find out whether a snapshot is due with the relay at `heads`
        /// (``RelayLinkState/snapshotDue(held:heads:fences:minimumBytes:now:)``), then report with ``snapshotChecked(due:)``.
        case checkSnapshot(heads: VersionVector)
        /// Upload a snapshot, then report with ``snapshotUploaded()``.
        case uploadSnapshot
        /// The pass is over: everything the relay lacked went up; wait for the next change.
        case done
        /// The relay's heads moved under the upload: start the next pass after `waitMilliseconds`.
        case again(waitMilliseconds: UInt64)
    }

    /// Where a pass stands.
    private enum Phase: Sendable {
        case idle
        /// Heads asked for the upload.
        case headsForUpload
        case uploading
        /// Asked whether a snapshot is due after the upload.
        case snapshotDue
        /// Heads asked again before a snapshot.
        case headsForSnapshot
        /// Asked whether a snapshot is still due with the heads read again.
        case snapshotStillDue
        case snapshot
    }

    /// How long heads read stay good while nothing fails.
    let headsRefreshMilliseconds: UInt64
    /// Passes start at most this often (milliseconds; see
    /// ``RelayClientConfiguration/minimumRequestSpacingMilliseconds``).
    let spacingMilliseconds: UInt64
    /// When the last pass started.
    private var passStartedMs: UInt64?
    /// The relay's heads as last read (nil: read them before the next upload).
    private(set) var heads: VersionVector?
    /// The heads as last known, kept across failures: what the relay lacks is counted against them meanwhile.
    private(set) var lastHeads: VersionVector?
    private var headsReadMs: UInt64 = 0
    private var raced = 0
    private var backoff: Backoff
    private var phase = Phase.idle

    init(backoff: Backoff, headsRefreshMilliseconds: UInt64 = 30_000, spacingMilliseconds: UInt64 = 0) {
        self.backoff = backoff
        self.headsRefreshMilliseconds = headsRefreshMilliseconds
        self.spacingMilliseconds = spacingMilliseconds
    }

    /// How long to wait before the next pass may start: the spacing since the last one started, so the changes of a
    /// busy moment (each wakes the uploader) go up together. 0 after a quiet moment: a lone write goes up at once.
    func pause(now: UInt64) -> UInt64 {
        guard let passStartedMs, now &- passStartedMs < spacingMilliseconds else { return 0 }
        return spacingMilliseconds - (now &- passStartedMs)
    }

    /// The first step of a pass; `stale`: the relay failed to answer since, and may have come back with less.
    mutating func start(now: UInt64, stale: Bool) -> Step {
        passStartedMs = now
        if stale { heads = nil }
        guard let heads, now &- headsReadMs <= headsRefreshMilliseconds else {
            phase = .headsForUpload
            return .readHeads
        }
        phase = .uploading
        return .upload(since: heads)
    }

    /// The heads the relay answered with.
    mutating func read(_ heads: VersionVector, now: UInt64) -> Step {
        self.heads = heads
        lastHeads = heads
        headsReadMs = now
        guard phase == .headsForSnapshot else {
            phase = .uploading
            return .upload(since: heads)
        }
        phase = .snapshotStillDue
        return .checkSnapshot(heads: heads)
    }

    /// An upload ended: the relay's heads after it, and whether everything went up (`false`: some was refused because
    /// the heads moved). Whole, a snapshot may be due.
    mutating func uploaded(heads: VersionVector, finished: Bool, random: inout some RandomNumberGenerator) -> Step {
        self.heads = heads
        lastHeads = heads
        guard finished else {
            raced += 1
            phase = .idle
            // The relay refused a range for a gap: its heads are not what they seemed (another uploader moved them,
            // or it lost or rolled back ranges: what an upload answers only ever raises a head known here, so a head
            // it lost would be refused again and again). They are read again first.
            self.heads = nil
            return .again(waitMilliseconds: raced > 1 ? backoff.next(using: &random) : 0)
        }
        raced = 0
        backoff.reset()
        phase = .snapshotDue
        return .checkSnapshot(heads: heads)
    }

    /// Whether a snapshot is due: after the upload, the heads are read again first; with those, it is uploaded.
    mutating func snapshotChecked(due: Bool) -> Step {
        switch (phase, due) {
        case (.snapshotDue, true):
            phase = .headsForSnapshot
            return .readHeads
        case (.snapshotStillDue, true):
            phase = .snapshot
            return .uploadSnapshot
        default:
            phase = .idle
            return .done
        }
    }

    /// The snapshot went up.
    mutating func snapshotUploaded() -> Step {
        phase = .idle
        return .done
    }

    /// A step failed: the pass is over, and the heads are read again before the next upload.
    mutating func failed() {
        heads = nil
        phase = .idle
    }
}
