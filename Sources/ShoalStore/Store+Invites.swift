import ShoalCore

/// An invite as the member that made it keeps it.
public struct StoredInvite: Sendable, Hashable {
    /// What became of it.
    public enum State: String, Sendable {
        /// Waiting for its device.
        case open
        /// A device is proving it knows the code now (one attempt at a time).
        case claimed
        /// A device joined with it.
        case used
        /// A wrong or unfinished attempt used up its one guess.
        case burnt
    }

    /// The first two characters of the code.
    public var id: String
    /// The secret part (the password of the join exchange).
    public var secret: [UInt8]
    /// When it was made, and until when it is valid (milliseconds since the Unix epoch).
    public var createdMilliseconds: UInt64
    /// Until when it is valid.
    public var expiresMilliseconds: UInt64
    /// What became of it.
    public var state: State

    /// An invite as stored.
    public init(id: String, secret: [UInt8], createdMilliseconds: UInt64, expiresMilliseconds: UInt64, state: State) {
        self.id = id
        self.secret = secret
        self.createdMilliseconds = createdMilliseconds
        self.expiresMilliseconds = expiresMilliseconds
        self.state = state
    }
}

/// Invites and failed join attempts: local to the member that made them, never replicated. A node that runs reads
/// them at each join, so invites made by `shoal invite` while it runs work at once.
extension Store {
    private func prepareInvites() throws(ShoalError) {
        try connection.exec(
            """
            CREATE TABLE IF NOT EXISTS shoal_invites(
                id TEXT PRIMARY KEY, secret BLOB NOT NULL, created_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
                state TEXT NOT NULL) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS shoal_join_failures(
                id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, address TEXT NOT NULL DEFAULT '', reason TEXT);
            """
        )
    }

    /// Stores a new invite; `false` when an invite with that id is still open or claimed (pick another id). Invites
    /// that expired a day ago or more are forgotten.
    public func createInvite(_ invite: StoredInvite) throws(ShoalError) -> Bool {
        try prepareInvites()
        try connection.rows(
            "DELETE FROM shoal_invites WHERE expires_ms < ?",
            [.integer(Int64(clamping: invite.createdMilliseconds) - 86_400_000)]
        )
        let existing = try connection.rows(
            "SELECT 1 FROM shoal_invites WHERE id = ? AND expires_ms >= ?",
            [.text(invite.id), .integer(Int64(clamping: invite.createdMilliseconds))]
        )
        guard existing.isEmpty else { return false }
        try connection.rows(
            "INSERT OR REPLACE INTO shoal_invites(id, secret, created_ms, expires_ms, state) VALUES (?, ?, ?, ?, ?)",
            [
                .text(invite.id), .blob(invite.secret), .integer(Int64(clamping: invite.createdMilliseconds)),
                .integer(Int64(clamping: invite.expiresMilliseconds)), .text(invite.state.rawValue),
            ]
        )
        return true
    }

    /// Claims invite `id` for one attempt: returns it as it was (its state says whether the claim took: only an open
    /// invite not expired at `now` is claimed), or nil when there is none.
    public func claimInvite(_ id: String, now: UInt64) throws(ShoalError) -> StoredInvite? {
        try prepareInvites()
        let rows = try connection.rows(
            "SELECT id, secret, created_ms, expires_ms, state FROM shoal_invites WHERE id = ?",
            [.text(id)]
        )
        guard let row = rows.first, case .text(let name) = row[0], case .blob(let secret) = row[1],
            case .integer(let created) = row[2], case .integer(let expires) = row[3], case .text(let state) = row[4]
        else { return nil }
        let invite = StoredInvite(
            id: name,
            secret: secret,
            createdMilliseconds: UInt64(clamping: created),
            expiresMilliseconds: UInt64(clamping: expires),
            state: StoredInvite.State(rawValue: state) ?? .burnt
        )
        if invite.state == .open && invite.expiresMilliseconds > now { try setInviteState(id, .claimed) }
        return invite
    }

    /// Records what became of invite `id`.
    public func setInviteState(_ id: String, _ state: StoredInvite.State) throws(ShoalError) {
        try prepareInvites()
        try connection.rows("UPDATE shoal_invites SET state = ? WHERE id = ?", [.text(state.rawValue), .text(id)])
    }

    /// Invites still open at `now`, soonest to expire first.
    public func openInvites(now: UInt64) throws(ShoalError) -> [StoredInvite] {
        try prepareInvites()
        return try connection.rows(
            "SELECT id, created_ms, expires_ms FROM shoal_invites WHERE state = 'open' AND expires_ms > ? ORDER BY expires_ms",
            [.integer(Int64(clamping: now))]
        ).compactMap { row in
            guard case .text(let id) = row[0], case .integer(let created) = row[1], case .integer(let expires) = row[2]
            else { return nil }
            return StoredInvite(
                id: id,
                secret: [],
                createdMilliseconds: UInt64(clamping: created),
                expiresMilliseconds: UInt64(clamping: expires),
                state: .open
            )
        }
    }

    /// Counts a failed join attempt from `address` (kept for a day).
    public func recordJoinFailure(at now: UInt64, address: String = "", reason: String) throws(ShoalError) {
        try prepareInvites()
        try connection.rows("DELETE FROM shoal_join_failures WHERE at_ms < ?", [.integer(Int64(clamping: now) - 86_400_000)])
        try connection.rows(
            "INSERT INTO shoal_join_failures(at_ms, address, reason) VALUES (?, ?, ?)",
            [.integer(Int64(clamping: now)), .text(address), .text(reason)]
        )
    }

    /// Failed join attempts since `since`, from `address` (nil: from anywhere).
    public func joinFailures(since: UInt64, address: String? = nil) throws(ShoalError) -> Int {
        try prepareInvites()
        let count =
            if let address {
                try connection.scalar(
                    "SELECT count(*) FROM shoal_join_failures WHERE at_ms >= ? AND address = ?",
                    [.integer(Int64(clamping: since)), .text(address)]
                )
            } else {
                try connection.scalar(
                    "SELECT count(*) FROM shoal_join_failures WHERE at_ms >= ?",
                    [.integer(Int64(clamping: since))]
                )
            }
        return Int(count.integerValue ?? 0)
    }

    /// Forgets every failed join attempt (`shoal invite --reset-failures`).
    public func clearJoinFailures() throws(ShoalError) {
        try prepareInvites()
        try connection.rows("DELETE FROM shoal_join_failures")
    }
}
