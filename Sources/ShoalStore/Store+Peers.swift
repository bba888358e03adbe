import ShoalCore

/// A peer this node has connected to before, and where.
public struct KnownPeer: Sendable, Hashable {
    /// The peer's site id.
    public var siteID: SiteID
    /// The host it was reached at.
    public var host: String
    /// The port it listens on.
    public var port: Int
    /// When the node last connected to it (milliseconds since the Unix epoch).
    public var lastSeen: UInt64
}

extension Store {
    /// Remembers where a peer was reached, so the node can dial it again after a restart.
    public func rememberPeer(_ site: SiteID, host: String, port: Int) throws(ShoalError) {
        try connection.rows(
            "INSERT INTO shoal_peers(site, host, port, seen_ms) VALUES (?, ?, ?, ?) ON CONFLICT(site) DO UPDATE SET "
                + "host = excluded.host, port = excluded.port, seen_ms = excluded.seen_ms",
            [.blob(site.bytes), .text(host), .integer(Int64(port)), .integer(Int64(options.clock.nowMilliseconds()))]
        )
    }

    /// Forgets where a peer was reached (a node removed from the cluster is not dialled again after a restart).
    public func forgetPeer(_ site: SiteID) throws(ShoalError) {
        try connection.rows("DELETE FROM shoal_peers WHERE site = ?", [.blob(site.bytes)])
    }

    /// Peers remembered from earlier connections, most recently seen first.
    public func knownPeers() throws(ShoalError) -> [KnownPeer] {
        try connection.rows("SELECT site, host, port, seen_ms FROM shoal_peers ORDER BY seen_ms DESC").compactMap {
            row in
            guard case .blob(let bytes) = row[0], let site = SiteID(bytes: bytes), case .text(let host) = row[1],
                case .integer(let port) = row[2], case .integer(let seen) = row[3]
            else { return nil }
            return KnownPeer(siteID: site, host: host, port: Int(port), lastSeen: UInt64(seen))
        }
    }
}
