import ShoalTransport

extension NodeConfiguration {
    /// Whether the node announces itself and finds peers of its cluster by mDNS (an ``MDNSPeerSource`` among
    /// ``NodeConfiguration/peerSources``).
    public var mdns: Bool {
        get { peerSources.contains { $0 is MDNSPeerSource } }
        set {
            peerSources.removeAll { $0 is MDNSPeerSource }
            if newValue { peerSources.append(MDNSPeerSource()) }
        }
    }
}
