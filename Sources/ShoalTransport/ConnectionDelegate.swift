import ShoalCore
import ShoalProtocol

/// What becomes of a connection whose handshake succeeded.
enum Admission: Sendable, Equatable {
    /// Keep it.
    case accepted
    /// Another connection with the same peer is kept.
    case duplicate
    /// The node holds its maximum of established connections.
    case full
    /// The peer may not sync (its key is not on the roster, or its hello does not match what the roster binds).
    case refused(Rejection)
}

/// What reaches a connection's loop, one at a time.
enum ConnectionEvent: Sendable {
    /// The peer sent a message.
    case message(WireMessage)
    /// The inbound stream ended: the peer closed (`nil`), or what arrived could not be decoded.
    case ended(ShoalError?)
    /// Time passed (the session reads the clock).
    case tick
    /// Something changed locally: pull, so the peer pulls too.
    case localChange
    /// A periodic round is due: pull, unless this link is settled (see ``ConnectionDriver``).
    case periodic
    /// Another connection to the same peer won.
    case duplicate
    /// The node is shutting down.
    case shutdown
    /// Closed before its hello to make room for a newcomer in the pool of handshaking connections.
    case evicted
    /// The peer was removed from the roster: closed at once.
    case revoked
    /// A pull of this node's ended on another connection: a pull this link put off may be due now.
    case pullsEnded
}

/// Who a ``ConnectionDriver`` reports to: the node (its peer records, events and log), or a test.
protocol ConnectionDelegate: Sendable {
    /// The handshake with `peer` succeeded on connection `id` (reached at `address`): keep the connection or not.
    func connectionEstablished(_ id: Int, peer: Hello, address: String) async -> Admission
    /// `peer` opened connection `id` to inspect only (``WireMessage/inspect(_:)``; `shoal verify --peer`), and its
    /// hello was accepted: answer it or not. An inspection is no sync link: it is never a duplicate of one.
    func inspectionStarted(_ id: Int, peer: Hello, address: String) async -> Admission
    /// A pull from `peer` finished: `applied` changes took effect in `milliseconds`.
    func connectionRoundFinished(peer: SiteID, applied: Int, milliseconds: UInt64) async
    /// A pull spanning several batches is under way: `changes` applied and `bytes` received so far.
    func connectionProgress(peer: SiteID, changes: Int, bytes: Int, remaining: UInt64, milliseconds: UInt64) async
    /// `peer` acknowledged holding our changes.
    func connectionAcknowledged(peer: SiteID, _ ack: Ack) async
    /// A round with `peer` failed here.
    func connectionRoundFailed(peer: SiteID, reason: String) async
    /// The newest clock in a batch `peer` sent was this far ahead of local time (negative: behind).
    func connectionClockView(peer: SiteID, aheadMilliseconds: Int64) async
    /// Rewrites a clock refusal of `batch` from `peer` so that it says how far apart the clocks are.
    func describeClockRefusal(_ error: ShoalError, batch: ChangeBatch, peer: SiteID?) async -> ShoalError
    /// The metrics of `peer`, which the driver records its rounds, applies and catch-ups in.
    func metrics(for peer: SiteID) async -> PeerMetrics
    /// `peer` holds at least `vector` (its request or announcement said so).
    func connectionPeerHolds(peer: SiteID, _ vector: VersionVector) async
    /// `peer` passed on what members it knows of last held.
    func connectionMemberReports(peer: SiteID, _ reports: [MemberGossip]) async
    /// What to pass on to `peer` of what members last held: nil when nothing changed since `generation` (what the
    /// link last passed on) and `refresh` is false. With the generation it is of.
    func memberGossip(for peer: SiteID, since generation: Int?, refresh: Bool) async -> (Int, [MemberGossip])?
    /// Whether this node pulls from `peer`: not from a member suspended for collection that has not shown a fresh
    /// state covering the suspension (see `Store+Suspension.swift`).
    func mayPull(from peer: SiteID) async -> Bool
    /// `peer` answered a pull of this node in full, holding at least `vector` then (its last batch's claim).
    func connectionAnswered(peer: SiteID, holding vector: VersionVector) async
    /// `peer` took a fresh state covering `vector` (``WireMessage/freshState(_:)``).
    func connectionPeerTookFreshState(peer: SiteID, _ vector: VersionVector) async
    /// What the last fresh state this node took covers, to tell its peers; nil if it took none.
    func freshStateCoverage() async -> VersionVector?
    /// A pull starts on connection `id`, which brings at least `expecting` (what its peer showed it holds).
    func pullStarting(_ id: Int, expecting: VersionVector) async
    /// The pull on connection `id` ended: it finished, failed, or the connection closed.
    func pullEnded(_ id: Int) async
    /// Whether a pull under way on another connection than `id` brings at least `vector`: the link then puts its own
    /// pull off until that one ends (a write every peer passes on is pulled once, not from each of them).
    func pullUnderWay(covering vector: VersionVector, except id: Int) async -> Bool
}

extension ConnectionDelegate {
    /// Answers every inspection.
    func inspectionStarted(_ id: Int, peer: Hello, address: String) async -> Admission { .accepted }
    /// Keeps no record of pulls: every link pulls what its peer announces.
    func pullStarting(_ id: Int, expecting: VersionVector) async {}
    func pullEnded(_ id: Int) async {}
    func pullUnderWay(covering vector: VersionVector, except id: Int) async -> Bool { false }

    /// Handles of their own, labelled with the peer's site id.
    func metrics(for peer: SiteID) async -> PeerMetrics { PeerMetrics(label: peer.hex) }

    /// Not recorded.
    func connectionPeerHolds(peer: SiteID, _ vector: VersionVector) async {}

    /// Not recorded.
    func connectionMemberReports(peer: SiteID, _ reports: [MemberGossip]) async {}

    /// Nothing passed on.
    func memberGossip(for peer: SiteID, since generation: Int?, refresh: Bool) async -> (Int, [MemberGossip])? { nil }

    /// Pulls from every peer.
    func mayPull(from peer: SiteID) async -> Bool { true }

    /// Not recorded.
    func connectionAnswered(peer: SiteID, holding vector: VersionVector) async {}

    /// Not recorded.
    func connectionPeerTookFreshState(peer: SiteID, _ vector: VersionVector) async {}

    /// None.
    func freshStateCoverage() async -> VersionVector? { nil }
}
