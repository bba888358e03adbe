import Foundation
import Shoal

/// What a running `shoal serve` publishes beside its database, once a second, for `shoal status`.
struct LiveStatus: Codable {
    struct Peer: Codable {
        var site: String
        var name: String
        var address: String
        var connected: Bool
        var lastSuccessfulSyncMs: UInt64?
        var consecutiveFailures: Int
        var roundsFinished: Int
        var roundsFailed: Int
        var roundP50Ms: UInt64?
        var roundP99Ms: UInt64?
        var versionVector: [String: UInt64]
        /// The state digest the peer last reported.
        var digest: String? = nil
        /// How the peer was found: static, mdns, remembered or inbound.
        var foundBy: String = "inbound"
        /// Every address the peer is known at.
        var addresses: [String] = []
        /// Why the last attempt to reach it failed, until one succeeds.
        var lastError: String? = nil
        /// Whether a connection with it was ever made (peers found by mDNS are listed before that).
        var everConnected = true
    }

    var node: String
    var writtenAtMs: UInt64
    /// Local transactions no peer has acknowledged holding yet.
    var pendingLocalChanges: UInt64
    /// This node's digest as last computed (nil while stale).
    var digest: String?
    var peers: [Peer]

    static func path(forDatabase database: String) -> String { database + ".shoal-status.json" }

    init(node: SiteID, pendingLocalChanges: UInt64, digest: StateDigest?, peers: [PeerStatus]) {
        self.node = node.hex
        self.pendingLocalChanges = pendingLocalChanges
        self.digest = digest?.hex
        self.writtenAtMs = SystemWallClock().nowMilliseconds()
        self.peers = peers.map { peer in
            let sorted = peer.recentRoundMilliseconds.sorted()
            func percentile(_ fraction: Double) -> UInt64? {
                sorted.isEmpty ? nil : sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
            }
            return Peer(
                site: peer.siteID.hex,
                name: peer.name,
                address: peer.address,
                connected: peer.isConnected,
                lastSuccessfulSyncMs: peer.lastSuccessfulSync,
                consecutiveFailures: peer.consecutiveFailures,
                roundsFinished: peer.roundsFinished,
                roundsFailed: peer.roundsFailed,
                roundP50Ms: percentile(0.5),
                roundP99Ms: percentile(0.99),
                versionVector: Dictionary(
                    uniqueKeysWithValues: peer.versionVector.entries.map { ($0.key.hex, $0.value) }
                ),
                digest: peer.digest,
                foundBy: peer.foundBy,
                addresses: peer.addresses,
                lastError: peer.lastError,
                everConnected: peer.everConnected
            )
        }
    }

    func write(to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try encoder.encode(self).write(to: URL(fileURLWithPath: path), options: .atomic)
    }

    /// The status of a node running on `database`, if one published it in the last few seconds.
    static func read(forDatabase database: String) -> LiveStatus? {
        guard let data = FileManager.default.contents(atPath: path(forDatabase: database)),
            let status = try? JSONDecoder().decode(LiveStatus.self, from: data),
            SystemWallClock().nowMilliseconds() - status.writtenAtMs < 5_000
        else { return nil }
        return status
    }
}
