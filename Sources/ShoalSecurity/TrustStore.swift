import ShoalCore
import Synchronization

/// A device that reached this node with a key the roster does not hold: it got no data, and waits for a person to
/// accept it (`shoal trust add`).
public struct PendingDevice: Sendable, Hashable {
    /// Its node id.
    public var nodeID: NodeID
    /// The name in its certificate (its claim).
    public var name: String
    /// The site id in its certificate (its claim).
    public var siteID: SiteID?
    /// Its public key, for the roster record if it is accepted.
    public var publicKeyDER: [UInt8]
    /// Where it connected from (its IP address), or the address dialled.
    public var address: String
    /// When it was first and last seen (milliseconds since the Unix epoch).
    public var firstSeenMilliseconds: UInt64
    /// When it was last seen.
    public var lastSeenMilliseconds: UInt64
    /// How many times it tried.
    public var attempts: Int
}

/// The node's live view of who may connect: the roster as last read, and the devices waiting to be accepted.
///
/// The TLS verification callback asks it about every peer certificate; the roster watcher replaces the roster when
/// the table changes. Shared across event loops, so behind a lock.
public final class TrustStore: Sendable {
    /// What the check of a certificate decided.
    public enum Verdict: Sendable, Hashable {
        /// A member: it may sync.
        case member
        /// A device that comes to join with an invite code: it gets the join exchange only.
        case joining
        /// Refused (unknown, removed, or a join the node cannot take), with why, for the log.
        case refused(String)
    }

    private struct State {
        var roster: Roster
        var pending: [NodeID: PendingDevice] = [:]
        /// Adds taken from peers' certificates (their admissions) that the roster read from the database does not
        /// hold yet: kept in every roster until it does, so a member taken that way stays one.
        var proven: [RosterRecord] = []
    }

    /// At most this many pending devices are remembered (the least recently seen go first).
    public static let maximumPending = 256

    /// This node.
    public let localNode: NodeID
    /// Its cluster.
    public let clusterID: [UInt8]
    private let state: Mutex<State>

    /// A trust store starting from `roster`.
    public init(localNode: NodeID, clusterID: [UInt8], roster: Roster) {
        self.localNode = localNode
        self.clusterID = clusterID
        self.state = Mutex(State(roster: roster))
    }

    /// The roster as last read.
    public var roster: Roster { state.withLock { $0.roster } }

    /// Replaces the roster; returns the nodes that were members and no longer are, and the nodes removed since
    /// (their connections must close).
    @discardableResult
    public func replaceRoster(_ roster: Roster) -> Set<NodeID> {
        state.withLock { state in
            var roster = roster
            let held = Set(roster.records)
            state.proven.removeAll { held.contains($0) }
            if !state.proven.isEmpty {
                roster = Roster(records: roster.records + state.proven, clusterID: roster.clusterID)
            }
            let gone = Set(state.roster.members.keys).subtracting(roster.members.keys)
                .union(Set(roster.removed.keys).subtracting(state.roster.removed.keys))
            state.roster = roster
            for member in roster.members.keys { state.pending[member] = nil }
            return gone
        }
    }

    /// Devices waiting to be accepted, most recently seen first.
    public var pendingDevices: [PendingDevice] {
        state.withLock { $0.pending.values.sorted { $0.lastSeenMilliseconds > $1.lastSeenMilliseconds } }
    }

    /// Decides about a peer's certificate. `acceptsJoins` is false on the dialling side (a node never joins a device
    /// that it dialled). An unknown key that does not come to join is remembered as pending.
    public func check(
        _ certificate: PeerCertificate,
        address: String,
        acceptsJoins: Bool,
        now: UInt64
    ) -> Verdict {
        state.withLock { state in
            if let removal = state.roster.removed[certificate.nodeID] {
                return .refused("node \(certificate.nodeID.short) was removed from the roster by \(removal.signer.short)")
            }
            if certificate.nodeID == localNode && certificate.purpose == .member {
                return state.roster.isMember(localNode) ? .member : .refused("this node is not on its own roster")
            }
            if certificate.purpose == .join {
                return acceptsJoins ? .joining : .refused("a joining device's certificate on a dialled connection")
            }
            if state.roster.isMember(certificate.nodeID) { return .member }
            // A member admitted after the roster here was last read shows its admission: adds signed by members
            // this node knows, which it then holds as if they had come by sync (they will, from that member).
            if let extended = state.roster.admitting(
                certificate.nodeID,
                key: certificate.publicKeyDER,
                proof: certificate.admission
            ) {
                let held = Set(state.roster.records)
                state.proven += extended.records.filter { !held.contains($0) }
                state.roster = extended
                state.pending[certificate.nodeID] = nil
                return .member
            }
            var device =
                state.pending[certificate.nodeID]
                ?? PendingDevice(
                    nodeID: certificate.nodeID,
                    name: certificate.name,
                    siteID: certificate.siteID,
                    publicKeyDER: certificate.publicKeyDER,
                    address: address,
                    firstSeenMilliseconds: now,
                    lastSeenMilliseconds: now,
                    attempts: 0
                )
            device.name = certificate.name
            device.siteID = certificate.siteID
            device.address = address
            device.lastSeenMilliseconds = now
            device.attempts += 1
            state.pending[certificate.nodeID] = device
            if state.pending.count > Self.maximumPending,
                let stalest = state.pending.values.min(by: { $0.lastSeenMilliseconds < $1.lastSeenMilliseconds })
            {
                state.pending[stalest.nodeID] = nil
            }
            return .refused("node \(certificate.nodeID.short) (\(certificate.name)) is not on the roster: pending")
        }
    }

    /// Whether a member's hello carries the site id the roster binds to its key.
    public func member(_ node: NodeID) -> Roster.Member? {
        state.withLock { $0.roster.member(node) }
    }
}
