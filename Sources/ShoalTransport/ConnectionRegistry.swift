import ShoalCore
import ShoalProtocol

/// The node's open connections, and who may open one: a pure record (no I/O) the node consults.
///
/// Inbound connections that have not said hello yet have a pool of their own with a cap per remote address; when
/// it is full, a newcomer from an address holding fewer of them closes the oldest handshake of the address holding
/// the most. So clients holding silent sockets, from one address or from many, cannot keep anyone else out: a real
/// peer says hello within milliseconds of getting in. Established connections have their own cap;
/// of two connections between the same pair, both sides keep the one dialled by the smaller site id.
struct ConnectionRegistry {
    /// One open connection.
    struct Entry {
        /// Whether this node dialled it.
        let dialed: Bool
        /// An inbound connection that has not finished its handshake: counted in the pending pool.
        var pending: Bool
        /// The peer, once the handshake succeeded and the connection was kept.
        var peer: SiteID?
        /// The peer's IP address, as the socket sees it.
        let remoteIP: String?
        /// Where the node's signals for this connection go.
        let inbox: AsyncStream<ConnectionEvent>.Continuation
        /// Told to close to make room in the pending pool: no longer counted there, and never established.
        var evicted = false
        /// Who the channel setup verified the peer to be (nil: not verified yet, or a setup that verifies no one).
        var identity: PeerIdentity?
        /// An inspection (`shoal verify --peer`), not a sync link.
        var inspection = false

        /// Counted in the pending pool.
        var holdsPendingSlot: Bool { pending && !evicted }
    }

    /// What became of a new connection.
    enum Registration {
        /// Admitted, with this id; `evicting` is the inbox of the handshake closed to make room for it, to be told.
        case admitted(Int, evicting: AsyncStream<ConnectionEvent>.Continuation?)
        /// Refused: send this and close.
        case refused(Rejection)
    }

    /// Limits.
    struct Limits: Sendable {
        /// Established connections at most.
        var maximumConnections = 64
        /// Inbound connections still handshaking at most.
        var maximumPending = 32
        /// Of those, from one remote IP address at most.
        var maximumPendingPerAddress = 4
    }

    /// This node's site id (which side's dialled connection wins a duplicate).
    let localSite: SiteID
    let limits: Limits
    private(set) var entries: [Int: Entry] = [:]
    private var nextID = 0
    /// The most handshaking connections seen at once from each remote address (for tests and diagnostics).
    private(set) var pendingHighWater: [String: Int] = [:]

    init(localSite: SiteID, limits: Limits) {
        self.localSite = localSite
        self.limits = limits
    }

    /// Open connections (handshaking or established).
    var count: Int { entries.count }

    /// Every connection's inbox, for signals to all of them.
    var inboxes: [AsyncStream<ConnectionEvent>.Continuation] { entries.values.map(\.inbox) }

    /// Whether a kept connection with `site` is open.
    func isConnected(_ site: SiteID) -> Bool {
        entries.values.contains { $0.peer == site }
    }

    /// Admits a new connection and returns its id, or the refusal to send when the pending pool is full.
    mutating func register(
        dialed: Bool,
        remoteIP: String?,
        inbox: AsyncStream<ConnectionEvent>.Continuation
    ) -> Registration {
        var evicting: AsyncStream<ConnectionEvent>.Continuation?
        if !dialed {
            let pending = entries.filter(\.value.holdsPendingSlot)
            let fromThere = pending.values.filter { $0.remoteIP == remoteIP }.count
            if fromThere >= limits.maximumPendingPerAddress {
                let from = remoteIP ?? "this address"
                return .refused(
                    Rejection(.tooManyConnections, "too many connections from \(from) are still handshaking")
                )
            }
            if pending.count >= limits.maximumPending {
                // Room is made only at the expense of an address holding more than the newcomer's would.
                // Of addresses holding as many, the one with the oldest handshake.
                let byAddress = Dictionary(grouping: pending, by: \.value.remoteIP).values.map { handshakes in
                    (count: handshakes.count, oldest: handshakes.min { $0.key < $1.key }!)
                }
                guard let busiest = byAddress.max(by: { ($0.count, $1.oldest.key) < ($1.count, $0.oldest.key) }),
                    busiest.count > fromThere + 1
                else {
                    return .refused(Rejection(.tooManyConnections, "too many connections are still handshaking"))
                }
                entries[busiest.oldest.key]?.evicted = true
                evicting = busiest.oldest.value.inbox
            }
            if let remoteIP {
                if pendingHighWater.count >= 1_024 { pendingHighWater.removeAll() }  // diagnostics: stays bounded
                pendingHighWater[remoteIP] = max(pendingHighWater[remoteIP] ?? 0, fromThere + 1)
            }
        }
        nextID += 1
        entries[nextID] = Entry(dialed: dialed, pending: !dialed, peer: nil, remoteIP: remoteIP, inbox: inbox)
        return .admitted(nextID, evicting: evicting)
    }

    /// Records that connection `id` finished its handshake with `peer`: keep it, or close it as a duplicate of
    /// another connection with the same peer, or because the node is full. When this connection wins over an older
    /// one, `evicted` is the older one's inbox, to be told it lost.
    mutating func establish(
        _ id: Int,
        peer: SiteID
    ) -> (admission: Admission, evicted: AsyncStream<ConnectionEvent>.Continuation?) {
        guard var entry = entries[id] else { return (.duplicate, nil) }
        // Closed to make room while its hello was on the way: it does not get in after all.
        guard !entry.evicted else { return (.full, nil) }
        entry.pending = false
        entries[id] = entry
        var evicted: AsyncStream<ConnectionEvent>.Continuation?
        if let (otherID, other) = entries.first(where: { $0.key != id && $0.value.peer == peer }) {
            let keepDialled = localSite < peer
            guard entry.dialed == keepDialled else { return (.duplicate, nil) }
            evicted = other.inbox
            entries[otherID]?.peer = nil
        } else if entries.values.filter({ !$0.pending && $0.peer != nil }).count >= limits.maximumConnections {
            return (.full, nil)
        }
        entry.peer = peer
        entries[id] = entry
        return (.accepted, evicted)
    }

    /// Inspections open at once at most: each is short, and a plaintext node must not let anyone hold any number.
    static let maximumInspections = 4

    /// Records that connection `id` is an inspection (`shoal verify --peer`): out of the pending pool, and no sync
    /// link (it has no peer, so it is nobody's duplicate). Returns `false`, recording nothing, when
    /// ``maximumInspections`` are open already.
    mutating func inspecting(_ id: Int) -> Bool {
        guard entries.values.filter(\.inspection).count < Self.maximumInspections else { return false }
        entries[id]?.pending = false
        entries[id]?.inspection = true
        return true
    }

    /// Records who the channel setup verified connection `id`'s peer to be.
    mutating func identify(_ id: Int, as identity: PeerIdentity) {
        entries[id]?.identity = identity
    }

    /// Forgets connection `id`; returns what it was.
    mutating func remove(_ id: Int) -> Entry? {
        entries.removeValue(forKey: id)
    }
}
