import ShoalCore
import ShoalProtocol

/// The node's open connections, and who may open one: a pure record (no I/O) the node consults.
///
/// Inbound connections that have not said hello yet have a pool of their own with a cap per remote address, so
/// one client holding silent sockets cannot keep anyone else out; established connections have their own cap;
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
    }

    /// What became of a new connection.
    enum Registration: Equatable {
        /// Admitted, with this id.
        case admitted(Int)
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
        if !dialed {
            let pending = entries.values.filter(\.pending)
            if pending.count >= limits.maximumPending {
                return .refused(Rejection(.tooManyConnections, "too many connections are still handshaking"))
            }
            let fromThere = pending.filter { $0.remoteIP == remoteIP }.count
            if fromThere >= limits.maximumPendingPerAddress {
                let from = remoteIP ?? "this address"
                return .refused(
                    Rejection(.tooManyConnections, "too many connections from \(from) are still handshaking")
                )
            }
            if let remoteIP {
                if pendingHighWater.count >= 1_024 { pendingHighWater.removeAll() }  // diagnostics: stays bounded
                pendingHighWater[remoteIP] = max(pendingHighWater[remoteIP] ?? 0, fromThere + 1)
            }
        }
        nextID += 1
        entries[nextID] = Entry(dialed: dialed, pending: !dialed, peer: nil, remoteIP: remoteIP, inbox: inbox)
        return .admitted(nextID)
    }

    /// Records that connection `id` finished its handshake with `peer`: keep it, or close it as a duplicate of
    /// another connection with the same peer, or because the node is full. When this connection wins over an older
    /// one, `evicted` is the older one's inbox, to be told it lost.
    mutating func establish(
        _ id: Int,
        peer: SiteID
    ) -> (admission: Admission, evicted: AsyncStream<ConnectionEvent>.Continuation?) {
        guard var entry = entries[id] else { return (.duplicate, nil) }
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

    /// Forgets connection `id`; returns what it was.
    mutating func remove(_ id: Int) -> Entry? {
        entries.removeValue(forKey: id)
    }
}
