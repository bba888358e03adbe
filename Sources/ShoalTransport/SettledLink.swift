/// Whether a link needs its periodic round.
///
/// Every commit is announced (or starts a round, with a peer before protocol version 7); the periodic round is the
/// safety net under them (a change nobody announced, a digest to compare). A link is settled when our last pull
/// brought nothing and the peer acknowledged our last answer holding the same data (equal digests, when both are
/// current; else a vector covering ours), and nothing committed here since: its periodic rounds are skipped, at most
/// ``maximumSkips`` in a row. The side that holds something new is never settled, so it keeps its rounds; after a
/// commit each side pulls once more; and digests that differ keep a link's rounds going, so a divergence is found
/// within a few periodic rounds.
struct SettledLink {
    /// Periodic rounds skipped in a row at most: digests are compared at the round after (a minute apart at the
    /// default 2 s interval; any commit starts a round at once).
    static let maximumSkips = 29

    private var pulledNothing = false
    private var peerLevel = false
    private var skipped = 0

    /// Something committed here: the link is not settled until a round both ways says so.
    mutating func committed() {
        pulledNothing = false
        peerLevel = false
    }

    /// Our pull finished, having applied `applied` changes.
    mutating func pullFinished(applied: Int) {
        pulledNothing = applied == 0
    }

    /// The peer acknowledged our answer; `level` says whether it holds the same data.
    mutating func acknowledged(level: Bool) {
        peerLevel = level
    }

    /// A periodic round is due: whether to run it (`false`: skipped).
    mutating func periodicRoundIsDue() -> Bool {
        if pulledNothing && peerLevel && skipped < Self.maximumSkips {
            skipped += 1
            return false
        }
        skipped = 0
        return true
    }
}
