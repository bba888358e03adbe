import ShoalCore

/// What a node's uploader decides, with no I/O: when the relay's heads must be read (first, after a failure, after
/// the relay failed to answer, and now and then since another uploader or an operator may move them), what to upload
/// (everything the heads lack), and what to do when another uploader moved the heads under an upload (cut again from
/// the new heads at once the first time, then with backoff). ``RelayLink`` carries it out; time comes in as `now`
/// (monotonic milliseconds).
struct RelayUploadSession: Sendable {
    /// What the uploader does next.
    enum Step: Sendable, Equatable {
        /// Read the relay's heads, then hand them to ``read(_:now:)``.
        case readHeads
        /// Upload what `since` lacks (a cursor opened at it), then report with ``uploaded(heads:finished:random:)``.
        case upload(since: VersionVector)
    }

    /// What follows an upload.
    enum After: Sendable, Equatable {
        /// Everything the relay lacked went up: wait for the next change.
        case done
        /// The relay's heads moved under the upload: cut again from the new heads, after `waitMilliseconds`.
        case again(waitMilliseconds: UInt64)
    }

    /// How long heads read stay good while nothing fails.
    let headsRefreshMilliseconds: UInt64
    /// The relay's heads as last read (nil: read them before the next upload).
    private(set) var heads: VersionVector?
    /// The heads as last known, kept across failures: what the relay lacks is counted against them meanwhile.
    private(set) var lastHeads: VersionVector?
    private var headsReadMs: UInt64 = 0
    private var raced = 0
    private var backoff: Backoff

    init(backoff: Backoff, headsRefreshMilliseconds: UInt64 = 30_000) {
        self.backoff = backoff
        self.headsRefreshMilliseconds = headsRefreshMilliseconds
    }

    /// The next step; `stale`: the relay failed to answer since, and may have come back with less.
    mutating func next(now: UInt64, stale: Bool) -> Step {
        if stale { heads = nil }
        guard let heads, now &- headsReadMs <= headsRefreshMilliseconds else { return .readHeads }
        return .upload(since: heads)
    }

    /// The heads the relay answered with.
    mutating func read(_ heads: VersionVector, now: UInt64) {
        self.heads = heads
        lastHeads = heads
        headsReadMs = now
    }

    /// An upload ended: the relay's heads after it, and whether everything went up (`false`: some was refused because
    /// the heads moved).
    mutating func uploaded(heads: VersionVector, finished: Bool, random: inout some RandomNumberGenerator) -> After {
        self.heads = heads
        lastHeads = heads
        guard !finished else {
            raced = 0
            backoff.reset()
            return .done
        }
        raced += 1
        return .again(waitMilliseconds: raced > 1 ? backoff.next(using: &random) : 0)
    }

    /// A step failed: the heads are read again before the next upload.
    mutating func failed() {
        heads = nil
    }
}
