import ShoalCore

/// How a Shoal node announces itself over DNS-SD: its instance name and TXT record, written and read here only.
///
/// The instance name is `<name> <first 12 hex digits of the site id> <port>`: unique per node and port, so a node
/// restarted on another port is never mistaken for its old self, and readable in `avahi-browse`. The name is cut
/// to 40 characters (DNS-SD labels hold 63 bytes). The TXT record carries `site` (the whole site id), `hint` (a
/// keyed hint of the cluster, never the cluster id in clear: see ``PeerSourceContext/clusterHint``), `node` (the
/// node id, when the node has a key) and `proto` (the highest protocol version the node speaks). It is only a hint
/// of where a peer may be: nothing in it is trusted, the TLS check decides.
public struct ShoalServiceRecord: Sendable, Hashable {
    /// The TXT keys.
    public enum Key {
        /// The node's site id, 32 hex digits.
        public static let site = "site"
        /// A keyed hint of the node's cluster: members recognise each other's, others learn nothing from it.
        public static let hint = "hint"
        /// The node id (base32, no dashes), when the node has a key.
        public static let node = "node"
        /// The highest protocol version the node speaks.
        public static let protocolVersion = "proto"
        /// Every key, for readers that collect them.
        public static let all = [site, hint, node, protocolVersion]
    }

    /// The longest name kept in the instance name.
    public static let maximumNameLength = 40

    /// The node's name (at most ``maximumNameLength`` characters).
    public var name: String
    /// The node's site id.
    public var siteID: SiteID
    /// The node's cluster hint.
    public var clusterHint: String
    /// The node's id as announced (a claim: only TLS proves it), if any.
    public var nodeID: String?
    /// The port the node listens on.
    public var port: Int
    /// The highest protocol version the node speaks, as announced (kept as text: a newer node may say anything).
    public var protocolVersion: String

    /// The record of a node; `name` is cut to ``maximumNameLength`` characters.
    public init(
        name: String,
        siteID: SiteID,
        clusterHint: String,
        nodeID: String? = nil,
        port: Int,
        protocolVersion: String
    ) {
        self.name = String(name.prefix(Self.maximumNameLength))
        self.siteID = siteID
        self.clusterHint = clusterHint
        self.nodeID = nodeID
        self.port = port
        self.protocolVersion = protocolVersion
    }

    /// Reads a record from what DNS-SD reported: `nil` when the TXT record is not a Shoal node's (no valid site
    /// id, or no cluster hint). The name is what comes before the site prefix and port in the instance name; an
    /// instance name of another shape gives it whole.
    public init?(instance: String, port: Int, txt: [String: String]) {
        guard let site = txt[Key.site].flatMap({ SiteID(hex: $0) }), let hint = txt[Key.hint] else {
            return nil
        }
        let words = instance.split(separator: " ", omittingEmptySubsequences: false)
        let shaped =
            words.count >= 3 && words[words.count - 2] == site.hex.prefix(12) && words.last == Substring("\(port)")
        self.init(
            name: shaped ? words.dropLast(2).joined(separator: " ") : instance,
            siteID: site,
            clusterHint: hint,
            nodeID: txt[Key.node],
            port: port,
            protocolVersion: txt[Key.protocolVersion] ?? ""
        )
    }

    /// The DNS-SD instance name.
    public var instanceName: String { "\(name) \(siteID.hex.prefix(12)) \(port)" }

    /// The TXT record.
    public var txt: [String: String] {
        var txt = [Key.site: siteID.hex, Key.hint: clusterHint, Key.protocolVersion: protocolVersion]
        if let nodeID { txt[Key.node] = nodeID }
        return txt
    }
}
