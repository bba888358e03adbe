import ShoalCore
import ShoalTransport

extension MDNSDiscovery {
    /// The Shoal nodes mDNS finds within `seconds` (on `interface`, or on every interface), other than `site`: for a
    /// device that joins and knows no member's address yet. Empty when mDNS cannot work here.
    ///
    /// It announces a placeholder of its own meanwhile (DNS-SD browses only alongside a registration here), whose
    /// TXT record has no cluster hint, so no node takes it for a peer.
    public static func browseShoalNodes(
        seconds: Int,
        excluding site: SiteID,
        interface: String? = nil
    ) async -> [PeerAddress] {
        let discovery = MDNSDiscovery(
            instanceName: "shoal joining \(site.hex.prefix(12))",
            port: 9,
            txt: ["joining": "1"],
            interface: interface
        )
        do {
            try discovery.start()
        } catch {
            return []
        }
        let timer = Task {
            try? await Task.sleep(for: .seconds(seconds))
            discovery.stop()
        }
        defer { timer.cancel() }
        var found: [PeerAddress] = []
        for await event in discovery.events {
            guard case .found(let service) = event, let record = service.record, record.siteID != site else { continue }
            let address = PeerAddress(host: service.host, port: service.port)
            if !found.contains(address) { found.append(address) }
        }
        return found
    }
}
