import ShoalCore

/// A `_shoal._tcp` service seen on the network.
public struct DiscoveredService: Sendable, Hashable {
    /// The instance name (unique per node: it contains the site id).
    public var instance: String
    /// The TXT record's Shoal keys (``ShoalServiceRecord/Key``), as announced.
    public var txt: [String: String]
    /// Where to connect: 127.0.0.1 for a node seen on the loopback interface, else its IPv4 address as mDNS
    /// answers for its host name (or the host name itself, when no address came within two seconds).
    public var host: String
    /// The host name it advertises (`name.local`).
    public var hostName: String
    /// The port it listens on.
    public var port: Int
    /// The interface it was seen on.
    public var interfaceIndex: UInt32

    /// What the announcement says about the node, when it is a Shoal node's.
    public var record: ShoalServiceRecord? { ShoalServiceRecord(instance: instance, port: port, txt: txt) }
    /// The node's site id, if the TXT record holds a valid one.
    public var siteID: SiteID? { txt[ShoalServiceRecord.Key.site].flatMap { SiteID(hex: $0) } }
    /// The node's cluster hint, if announced.
    public var clusterHint: String? { txt[ShoalServiceRecord.Key.hint] }
    /// The highest protocol version the node speaks, if announced.
    public var protocolVersion: String? { txt[ShoalServiceRecord.Key.protocolVersion] }
}

/// What discovery reports.
public enum DiscoveryEvent: Sendable, Hashable {
    /// A service was found (or found again, on another interface or after a restart).
    case found(DiscoveredService)
    /// The instance left on every interface it was seen on.
    case lost(instance: String)
    /// Discovery cannot work (daemon missing, name conflict, …): the reason, for a person.
    case unavailable(String)
}
