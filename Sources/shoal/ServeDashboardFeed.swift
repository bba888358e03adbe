import Foundation
import ServiceLifecycle
import Shoal
import ShoalDashboard

/// Feeds `shoal serve --dashboard`: this node's card and one per peer it knows (as the peer last reported itself),
/// the links (to each peer, and to the relay when it uses one), the change sets it commits or applies (timed from
/// their origin's commit to their apply here), and its conflicts. The node's own commits wake it; the peers' state
/// (held by the node's connections) is read twice a second while a browser watches, every 10 s otherwise. No
/// controls: a node's dashboard only shows.
struct ServeDashboardFeed: Service {
    let node: ShoalNode
    let hub: DashboardHub
    let givenName: String?
    let database: String

    private final class Measured: @unchecked Sendable {
        // Only the feed's own tasks touch it, one at a time, behind the lock.
        let lock = NSLock()
        var latency = LatencySamples()
        var changeSets: [DashboardState.ChangeSet] = []
        var applied = 0
        /// Node names by site id, as the peers told them.
        var names: [String: String] = [:]
    }

    func run() async throws {
        let stored = try? await node.store.read { store throws(ShoalError) in
            try store.status(settlingDigest: false).nodeName
        }
        let name = givenName ?? stored.flatMap { $0 } ?? String(node.node.siteID.hex.prefix(8))
        let measured = Measured()
        let since = SystemWallClock().nowMilliseconds()
        let start = (try? await node.store.versionVector()) ?? VersionVector()
        try? await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask {
                    do {
                        for try await set in node.changes(after: ChangeFeedCursor(start)) {
                            let now = SystemWallClock().nowMilliseconds()
                            measured.lock.withLock {
                                if !set.isLocal && set.hlc.milliseconds >= since {
                                    measured.latency.add(Double(Int64(now) - Int64(set.hlc.milliseconds)))
                                    measured.applied += 1
                                }
                                measured.changeSets.insert(
                                    DashboardState.ChangeSet(
                                        origin: set.isLocal
                                            ? name
                                            : measured.names[set.dot.site.hex] ?? String(set.dot.site.hex.prefix(8)),
                                        dot: "\(set.dot.site.hex.prefix(8)):\(set.dot.seq)",
                                        tables: Array(Set(set.rows.map(\.table))).sorted(),
                                        rows: set.rows.count,
                                        atMs: set.hlc.milliseconds
                                    ),
                                    at: 0
                                )
                                if measured.changeSets.count > 12 { measured.changeSets.removeLast() }
                            }
                        }
                    } catch {}
                }
                group.addTask {
                    var lastApplied = 0
                    var lastRounds: [String: Int] = [:]
                    var last = ContinuousClock.now - .seconds(60)
                    while !Task.isCancelled {
                        // Twice a second while a browser watches; every 10 s while none does (the tables' rows are
                        // counted each time, which a large table makes dear).
                        if hub.isWatched || ContinuousClock.now - last >= .seconds(10) {
                            let state = await state(name, measured, lastApplied: &lastApplied, lastRounds: &lastRounds)
                            hub.publish(state)
                            last = .now
                        }
                        try? await Task.sleep(for: .milliseconds(500))  // the period of the peers' status reads
                    }
                }
            }
        }
        hub.finish()
    }

    private func state(
        _ name: String,
        _ measured: Measured,
        lastApplied: inout Int,
        lastRounds: inout [String: Int]
    ) async -> DashboardState {
        var state = DashboardState(title: "Shoal node \(name)", mode: "node", controls: false)
        let sync = node.node
        let peers = await sync.peerStatuses().filter { $0.everConnected || $0.isConnected }
        let status = try? await node.store.read { store throws(ShoalError) in
            (try store.status(settlingDigest: false), try store.conflicts(limit: 12))
        }
        var names: [String: String] = [sync.siteID.hex: name]
        for peer in peers where !peer.name.isEmpty { names[peer.siteID.hex] = peer.name }
        let known = names
        measured.lock.withLock { measured.names = known }
        func label(_ site: String) -> String { names[site] ?? String(site.prefix(8)) }
        func heads(_ vector: VersionVector) -> [String: UInt64] {
            Dictionary(vector.entries.map { (label($0.key.hex), $0.value) }, uniquingKeysWith: { max($0, $1) })
        }
        func lacking(_ holder: VersionVector, _ other: VersionVector) -> UInt64 {
            other.entries.reduce(UInt64(0)) { total, entry in
                let held = holder[entry.key]
                return total + (entry.value > held ? entry.value - held : 0)
            }
        }
        var me = DashboardState.Node(index: 0, name: name, site: sync.siteID.hex, running: true)
        let mine = status?.0.versionVector ?? VersionVector()
        if let (store, _) = status {
            me.digest = store.digestIsCurrent ? store.digest.hex : (try? await sync.refreshDigest(waiting: false))?.hex
            me.rows = store.tables.reduce(0) { $0 + $1.rows }
            me.tombstones = store.tables.reduce(0) { $0 + $1.tombstones }
            me.schemaChanges = store.schemaChanges
            me.schemaPending = store.schemaPending.count
            me.conflicts = store.conflicts
            me.heads = heads(store.versionVector)
        }
        me.fileBytes = ["", "-wal"].reduce(Int64(0)) { total, suffix in
            total
                + ((try? FileManager.default.attributesOfItem(atPath: database + suffix)[.size] as? Int64) ?? nil ?? 0)
        }
        me.pending = await sync.pendingLocalChanges()
        me.livePeers = peers.filter(\.isConnected).count
        let applied = measured.lock.withLock { measured.applied }
        let changed = applied > lastApplied
        lastApplied = applied
        for (offset, peer) in peers.enumerated() {
            let site = peer.siteID.hex
            var card = DashboardState.Node(index: offset + 1, name: label(site), site: site, running: peer.isConnected)
            card.digest = peer.digest
            card.heads = heads(peer.versionVector)
            let needs = lacking(peer.versionVector, mine)
            if needs > 0 { card.needs.append(.init(from: name, changes: needs)) }
            let mineNeeds = lacking(mine, peer.versionVector)
            if mineNeeds > 0 { me.needs.append(.init(from: card.name, changes: mineNeeds)) }
            state.nodes.append(card)
            let rounds = peer.roundsFinished
            let pulse = changed && rounds > (lastRounds[site] ?? 0)
            lastRounds[site] = rounds
            state.links.append(
                .init(a: 0, b: offset + 1, kind: "lan", state: peer.isConnected ? "live" : "down", pulse: pulse)
            )
        }
        state.nodes.insert(me, at: 0)
        if let relay = node.relay?.status {
            var card = DashboardState.Node(
                index: state.nodes.count,
                name: "relay",
                site: "",
                running: relay.reachable == true
            )
            card.pending = relay.lacking
            state.nodes.append(card)
            state.links.append(
                .init(a: 0, b: card.index, kind: "relay", state: relay.reachable == true ? "live" : "down")
            )
        }
        // Converged: every digest known is this node's, and every peer holds what this node holds (a peer's digest
        // comes with its acknowledgements, and is not always known).
        let digests = Set(state.nodes.filter { $0.name != "relay" }.compactMap(\.digest))
        state.converged = digests.count == 1 && peers.allSatisfy { $0.versionVector == mine }
        measured.lock.withLock {
            state.latency = measured.latency.summary
            state.changeSets = measured.changeSets
        }
        state.conflicts = (status?.1 ?? []).map { DemoCluster.conflict($0, node: name, siteName: label) }
        return state
    }
}
