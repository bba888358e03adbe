/// A host and port to dial.
public struct PeerAddress: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// A host name or an IP address (IPv6 without brackets).
    public var host: String
    /// The TCP port.
    public var port: Int

    /// The address `host:port`.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `host:port` or `[ipv6]:port`.
    public init?(parsing text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            (0...65_535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self.init(host: host, port: port)
    }

    /// `host:port`, with an IPv6 host in brackets.
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// Orders as the descriptions do.
    public static func < (lhs: PeerAddress, rhs: PeerAddress) -> Bool { lhs.description < rhs.description }
}

/// How the node learned of a peer.
public enum PeerOrigin: String, Sendable, Hashable, Codable, CustomStringConvertible {
    /// Given in the configuration (`--peer`).
    case `static`
    /// Remembered from an earlier run (the database keeps the addresses of peers it connected to).
    case remembered
    /// Found by mDNS/DNS-SD.
    case mdns
    /// It dialled this node, which knew nothing of it before.
    case inbound

    /// The word status reports show: "static", "remembered", "mdns" or "inbound".
    public var description: String { rawValue }
}
