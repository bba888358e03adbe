/// Whether a link needs its periodic round.
///
/// Every commit is announced (or starts a round, with a peer before protocol version 7); the periodic round is the
/// safety net under them (a change nobody announced, a digest to compare). A link is settled when the peer holds
/// nothing new for us (our last pull brought nothing, or what it last said it holds is covered here) and it holds our
/// version vector (it acknowledged our answer at it, or said so), and nothing committed here since: its periodic
/// rounds are skipped, at most ``maximumSkips`` in a row. The side that holds something new is never settled, so it
/// keeps its rounds.
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

    /// The peer acknowledged our answer or said what it holds: `level` says whether that covers our vector, and
    /// `nothingNew` whether ours covers it (then a pull would bring nothing).
    mutating func heard(level: Bool, nothingNew: Bool) {
        peerLevel = level
        if nothingNew { pulledNothing = true }
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
