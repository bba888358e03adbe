// The public facade. Applications import `Shoal` and get the store and the core types.
@_exported import ShoalCore
@_exported import ShoalDiscovery
@_exported import ShoalStore
@_exported import ShoalTransport
@_exported import ShoalProtocol
