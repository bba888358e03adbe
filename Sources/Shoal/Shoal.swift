// The public facade. Applications import `Shoal`, hold a `ShoalNode` (ShoalNode.swift), and get all of Shoal's public
// API beside it: the core types, the store,
// the wire protocol, the node (SyncNode and its configuration) and mDNS discovery.
@_exported import ShoalCore
@_exported import ShoalDiscovery
@_exported import ShoalStore
@_exported import ShoalTransport
@_exported import ShoalProtocol
@_exported import ShoalSecurity
@_exported import ShoalRelayClient
@_exported import ShoalRelayProtocol
