import Foundation
import Shoal
import ShoalDashboard
import ShoalProcesses

/// The demo's nodes: their `shoal serve` processes, and, for the dashboard, the links between them (each through a
/// ``LinkProxy`` it can cut), what the page shows of them, and the controls the page sends.
///
/// Without the dashboard the nodes find each other by mDNS when the Avahi daemon runs, else dial each other directly;
/// with it, every node dials each earlier node through a proxy of that pair's own, so a pair can be partitioned.
actor DemoCluster {
    let paths: [String]
    let names: [String]
    let mdns: Bool
    let proxied: Bool
    private var children: [ServeProcess?]
    private var proxies: [Pair: LinkProxy] = [:]
    private var sites: [String: String] = [:]  // site hex -> node name
    private var stores: [Int: Store] = [:]

    // What the dashboard shows and measures.
    /// Propagation, as the nodes timed their applies of the app's change sets (``ApplyLog``).
    private var latency = LatencySamples()
    /// Per node, its apply log as read so far.
    private var applyLogs: [Int: ApplyLog.Tail] = [:]
    /// Per node, the highest sequence number its apply log holds of each site (hex).
    private var loggedHeads: [Int: [String: UInt64]] = [:]
    /// Per node, since when its process runs (wall milliseconds, when it listened): a change set committed before is
    /// a catch-up when it arrives (it waited for the node), not propagation, and is not timed.
    private var runningSince: [Int: UInt64] = [:]
    /// Per node, when a link of its was last healed (wall milliseconds): a change set committed before and applied
    /// after waited for the heal (a catch-up, which the time to converge after a heal shows), and is not timed.
    private var healedAt: [Int: UInt64] = [:]
    private var changeSets: [DashboardState.ChangeSet] = []
    private var seenDots: Set<String> = []
    private var appliedCounts: [Int]
    private var lastApplied: [Int]
    private var lastBytes: [Pair: UInt64] = [:]
    private var healStarted: ContinuousClock.Instant?
    private var lastHealConvergeMs: Double?
    private var message: String?
    private var columnsAdded = 0
    private let title: String

    /// A pair of nodes, the lower index first.
    struct Pair: Hashable {
        let a: Int
        let b: Int
        init(_ x: Int, _ y: Int) {
            a = min(x, y)
            b = max(x, y)
        }
    }

    init(paths: [String], mdns: Bool, proxied: Bool) {
        self.paths = paths
        self.names = paths.indices.map { "node\($0)" }
        self.mdns = mdns && !proxied
        self.proxied = proxied
        self.children = Array(repeating: nil, count: paths.count)
        self.appliedCounts = Array(repeating: 0, count: paths.count)
        self.lastApplied = Array(repeating: 0, count: paths.count)
        self.title = "Shoal demo: \(paths.count) nodes"
    }

    /// The port node `index` listens on, while it runs.
    func port(_ index: Int) -> Int? { children[index]?.port }

    /// Starts node `index` (again); returns the port it listens on.
    @discardableResult
    func start(_ index: Int) async throws -> Int {
        if let child = children[index], child.isRunning { return child.port }
        // With the dashboard, each node also times its own applies (``ApplyLog``), for the propagation line printed.
        let extra = ["--round-interval", "1000"] + (proxied ? ["--apply-log", Self.applyLogPath(paths[index])] : [])
        let child: ServeProcess
        if mdns {
            child = try ServeProcess.start(database: paths[index], name: names[index], peers: [], extra: extra)
        } else if proxied {
            // Each earlier node through the proxy of the pair.
            var peers: [Int] = []
            for earlier in 0..<index {
                let pair = Pair(earlier, index)
                if proxies[pair] == nil {
                    guard let target = children[earlier]?.port else { continue }
                    proxies[pair] = try await LinkProxy.start(target: target)
                }
                peers.append(proxies[pair]!.port)
            }
            child = try ServeProcess.startIsolated(
                database: paths[index],
                name: names[index],
                peers: peers,
                extra: extra
            )
            // The later nodes reach this one through their pairs' proxies, at its new port.
            for (pair, proxy) in proxies where pair.a == index { proxy.retarget(child.port) }
        } else {
            let peers = children.prefix(index).compactMap { $0?.port }
            child = try ServeProcess.startIsolated(
                database: paths[index],
                name: names[index],
                peers: peers,
                extra: extra
            )
        }
        children[index] = child
        runningSince[index] = SystemWallClock().nowMilliseconds()
        return child.port
    }

    /// Stops every node and closes the links.
    func stopAll() {
        for index in children.indices {
            children[index]?.stop()
            children[index] = nil
        }
        for proxy in proxies.values { proxy.close() }
        stores.removeAll()
    }

    /// Learns each node's site id, to name the origins of change sets and the heads of version vectors.
    func learnSites() throws {
        for (index, path) in paths.enumerated() {
            let store = try Store(path: path)
            sites[store.identitySiteID.hex] = names[index]
        }
    }

    /// The name of the node writing as `site`, or the site's first 8 hex digits.
    private func name(ofSite hex: String) -> String { sites[hex] ?? String(hex.prefix(8)) }

    // MARK: - Measuring

    /// Follows node `index`'s change sets as they commit (its file's `data_version`, looked at every 10 ms): each is
    /// listed once, as first seen, and one from another node makes the links it may have crossed pulse. Returns
    /// when cancelled.
    nonisolated func follow(_ index: Int) async {
        guard let store = try? SerializedStore(path: paths[index], options: StoreOptions()),
            let start = try? await store.versionVector()
        else { return }
        await withDiscardingTaskGroup { group in
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(10))  // another process's commits have no signal here
                    _ = try? await store.changedElsewhere()
                }
            }
            group.addTask {
                do {
                    for try await set in store.changes(after: ChangeFeedCursor(start)) {
                        await self.saw(set, at: index)
                    }
                } catch {}
            }
        }
    }

    private func saw(_ set: FeedChangeSet, at index: Int) {
        // Change sets of Shoal's own rows (member reports, about one a second a node) would crowd the list out and
        // keep the links pulsing: the list and the pulses show the app's.
        guard set.rows.contains(where: { !Store.isShoalTable($0.table) }) else { return }
        if !set.isLocal { appliedCounts[index] += 1 }
        let dot = "\(set.dot.site.hex):\(set.dot.seq)"
        guard seenDots.insert(dot).inserted else { return }
        let tables = Array(Set(set.rows.map(\.table))).sorted()
        changeSets.insert(
            DashboardState.ChangeSet(
                origin: name(ofSite: set.dot.site.hex),
                dot: "\(set.dot.site.hex.prefix(8)):\(set.dot.seq)",
                tables: tables,
                rows: set.rows.count,
                atMs: set.hlc.milliseconds
            ),
            at: 0
        )
        if changeSets.count > 12 { changeSets.removeLast(changeSets.count - 12) }
        if seenDots.count > 100_000 { seenDots.removeAll() }
    }

    /// Where node `path` logs its applies (``ApplyLog``).
    static func applyLogPath(_ path: String) -> String { path + ".applies" }

    /// Reads what the nodes logged of their applies since the last read: each apply of an app's change set committed
    /// while the node ran, and not held up by a partition, is a propagation sample (from its origin's commit to the
    /// apply, as the node timed it).
    private func readApplyLogs() {
        for index in paths.indices {
            var tail = applyLogs[index] ?? ApplyLog.Tail(Self.applyLogPath(paths[index]))
            for entry in tail.next() {
                loggedHeads[index, default: [:]][entry.site] = max(loggedHeads[index]?[entry.site] ?? 0, entry.seq)
                let waitedForHeal = healedAt[index].map { entry.originMs < $0 && entry.appliedMs >= $0 } ?? false
                if entry.isApp, let running = runningSince[index], entry.originMs >= running, !waitedForHeal {
                    latency.add(Double(Int64(entry.appliedMs) - Int64(entry.originMs)))
                }
            }
            applyLogs[index] = tail
        }
    }

    /// Propagation so far (the figures the page shows), and how many of the change sets each node holds from the
    /// others its apply log does not show yet: the newest of each other site it holds, counted when the log has not
    /// reached it.
    func propagation() -> (latency: DashboardState.Latency, notLogged: Int) {
        readApplyLogs()
        var notLogged = 0
        for (index, path) in paths.enumerated() {
            guard let store = try? stores[index] ?? Store(path: path), let vector = try? store.versionVector() else {
                continue
            }
            stores[index] = store
            for (site, head) in vector.entries where site != store.siteID {
                if (loggedHeads[index]?[site.hex] ?? 0) < head { notLogged += 1 }
            }
        }
        return (latency.summary, notLogged)
    }

    // MARK: - The page's state

    /// Reads every node's status (its file, and the running node's live status) into the page's state.
    func state() -> DashboardState {
        var state = DashboardState(title: title, mode: "demo", controls: proxied)
        var vectors: [Int: [String: UInt64]] = [:]
        var live: [Int: LiveStatus] = [:]
        var allConflicts: [DashboardState.Conflict] = []
        for (index, path) in paths.enumerated() {
            var node = DashboardState.Node(
                index: index,
                name: names[index],
                site: "",
                running: children[index]?.isRunning ?? false
            )
            do {
                let store = try stores[index] ?? Store(path: path)
                stores[index] = store
                let status = try store.status(settlingDigest: true)
                node.site = status.siteID.hex
                node.digest = status.digest.hex
                // The app's tables: Shoal's own (the roster) are not what the demo writes.
                let appTables = status.tables.filter { !Store.isShoalTable($0.name) }
                node.rows = appTables.reduce(0) { $0 + $1.rows }
                node.tombstones = appTables.reduce(0) { $0 + $1.tombstones }
                node.schemaChanges = status.schemaChanges
                node.schemaPending = status.schemaPending.count
                node.conflicts = status.conflicts
                var vector: [String: UInt64] = [:]
                for (site, seq) in status.versionVector.entries { vector[site.hex] = seq }
                vectors[index] = vector
                node.heads = Dictionary(
                    vector.map { (name(ofSite: $0.key), $0.value) },
                    uniquingKeysWith: { max($0, $1) }
                )
                node.metadataBytes = Self.metadataBytes(store, replicated: Set(status.tables.map(\.name)))
                for record in (try? store.conflicts(limit: 8)) ?? [] {
                    allConflicts.append(Self.conflict(record, node: names[index], siteName: name(ofSite:)))
                }
            } catch {
                stores[index] = nil
            }
            node.fileBytes = ["", "-wal"].reduce(Int64(0)) { total, suffix in
                let size = (try? FileManager.default.attributesOfItem(atPath: path + suffix)[.size] as? Int64) ?? nil
                return total + (size ?? 0)
            }
            if node.running, let status = LiveStatus.read(forDatabase: path) {
                live[index] = status
                node.pending = status.pendingLocalChanges
                node.livePeers = status.peers.filter(\.connected).count
            }
            state.nodes.append(node)
        }
        // "Needs N changes from X": what each peer reported holding beyond this node's vector.
        for index in state.nodes.indices {
            guard let mine = vectors[index], let status = live[index] else { continue }
            for peer in status.peers where !peer.site.isEmpty {
                let lacking = peer.versionVector.reduce(UInt64(0)) { total, entry in
                    total + (entry.value > (mine[entry.key] ?? 0) ? entry.value - (mine[entry.key] ?? 0) : 0)
                }
                if lacking > 0 {
                    state.nodes[index].needs.append(.init(from: name(ofSite: peer.site), changes: lacking))
                }
            }
        }
        // Links: each pair, live when either end reports the other connected.
        for a in paths.indices {
            for b in paths.indices where b > a {
                let pair = Pair(a, b)
                let proxy = proxies[pair]
                let siteB = state.nodes[b].site
                let siteA = state.nodes[a].site
                let connected =
                    (live[a]?.peers.contains { $0.site == siteB && $0.connected } ?? false)
                    || (live[b]?.peers.contains { $0.site == siteA && $0.connected } ?? false)
                let stateName = proxy?.isCut == true ? "partitioned" : connected ? "live" : "down"
                let bytes = proxy?.bytes
                let moved = bytes.map { $0 > (lastBytes[pair] ?? 0) } ?? true
                let applied = appliedCounts[a] > lastApplied[a] || appliedCounts[b] > lastApplied[b]
                if let bytes { lastBytes[pair] = bytes }
                state.links.append(
                    .init(a: a, b: b, kind: "lan", state: stateName, pulse: connected && moved && applied, bytes: bytes)
                )
            }
        }
        lastApplied = appliedCounts
        let digests = Set(state.nodes.map { $0.digest ?? "" })
        // Every node running and showing one digest (nodes not started yet show none).
        state.converged = digests.count == 1 && !digests.contains("") && state.nodes.allSatisfy(\.running)
        if state.converged, let started = healStarted {
            let elapsed = ContinuousClock.now - started
            lastHealConvergeMs =
                Double(elapsed.components.seconds) * 1000
                + Double(elapsed.components.attoseconds) / 1e15
            healStarted = nil
        }
        state.healing = healStarted != nil
        state.lastHealConvergeMs = lastHealConvergeMs
        readApplyLogs()
        state.latency = latency.summary
        state.changeSets = changeSets
        state.conflicts = Array(allConflicts.sorted { $0.atMs > $1.atMs }.prefix(12))
        state.message = message
        return state
    }

    /// The bytes of every table and index but the replicated tables' own (SQLite's `dbstat`, which reads every page:
    /// fine for the demo's small files); nil where SQLite was built without it.
    private static func metadataBytes(_ store: Store, replicated: Set<String>) -> Int64? {
        let sizes = try? store.execute(
            """
            SELECT coalesce(s.tbl_name, d.name), sum(d.pgsize) FROM dbstat AS d
            LEFT JOIN sqlite_schema AS s ON s.name = d.name GROUP BY 1
            """
        )
        guard let sizes else { return nil }
        return sizes.rows.reduce(Int64(0)) { total, row in
            guard case .text(let owner) = row[0], !replicated.contains(owner), owner != "sqlite_schema" else {
                return total
            }
            return total + (row[1].integerValue ?? 0)
        }
    }

    static func conflict(
        _ record: ConflictRecord,
        node: String,
        siteName: (String) -> String
    ) -> DashboardState.Conflict {
        func text(_ value: SQLValue) -> String {
            switch value {
            case .null: "NULL"
            case .integer(let integer): String(integer)
            case .real(let real): String(real)
            case .text(let text): "'\(text.prefix(24))'"
            case .invalidText(let bytes): "<\(bytes.count) bytes of text>"
            case .blob(let bytes): "<blob, \(bytes.count) bytes>"
            }
        }
        let (winning, losing) =
            record.winner == .local ? (record.localStamp, record.remoteStamp) : (record.remoteStamp, record.localStamp)
        let why =
            winning.hlc != losing.hlc
            ? "later clock (\(siteName(winning.site.hex)) wrote it \(Int64(winning.hlc.milliseconds) - Int64(losing.hlc.milliseconds)) ms later)"
            : "same clock: the larger site id wins"
        return DashboardState.Conflict(
            node: node,
            table: record.table,
            key: "(" + record.primaryKey.map(text).joined(separator: ", ") + ")",
            column: record.column,
            local: text(record.localValue),
            remote: text(record.remoteValue),
            winner: record.winner.rawValue,
            why: why,
            atMs: record.recordedAt
        )
    }

    // MARK: - Controls

    /// Carries out one of the page's controls; what happened, for the page.
    func perform(_ control: DashboardControl) async throws -> String {
        func node(_ index: Int?, field: String = "node") throws -> Int {
            guard let index, paths.indices.contains(index) else {
                throw DashboardControlError("no such node: give \"\(field)\" between 0 and \(paths.count - 1)")
            }
            return index
        }
        let said: String
        switch control.action {
        case .burst:
            let index = try node(control.node)
            let count = 50
            let nodes = paths.count
            let path = paths[index]
            let offset = Int.random(in: 1_000_000..<9_000_000)
            ShoalCommand.Demo.write(path: path, node: index, nodes: nodes, writes: count, offset: offset)
            said = "\(names[index]) wrote a burst of \(count) transactions"
        case .partition:
            let index = try node(control.node)
            let pairs = try pairs(of: index, control.peer.map { try node($0, field: "peer") })
            for pair in pairs { proxies[pair]?.cut() }
            said =
                control.peer.map { "partitioned \(names[index]) from \(names[$0])" }
                ?? "partitioned \(names[index]) from every other node"
        case .heal:
            // Without a node, every cut link heals; a node (and peer) given must be one.
            let index = try control.node.map { try node($0) }
            let peer = try control.peer.map { try node($0, field: "peer") }
            let cut = proxies.filter { $0.value.isCut }
            let mending = cut.filter { entry in
                guard let index else { return true }
                guard entry.key.a == index || entry.key.b == index else { return false }
                return peer.map { entry.key == Pair(index, $0) } ?? true
            }
            guard !mending.isEmpty else { throw DashboardControlError("no partitioned link to heal there") }
            let now = SystemWallClock().nowMilliseconds()
            for (pair, proxy) in mending {
                proxy.mend()
                healedAt[pair.a] = now
                healedAt[pair.b] = now
            }
            healStarted = .now
            said = "healed \(mending.count) link\(mending.count == 1 ? "" : "s")"
        case .stop:
            let index = try node(control.node)
            guard let child = children[index] else { throw DashboardControlError("\(names[index]) is not running") }
            child.stop()
            children[index] = nil
            stores[index] = nil
            said = "stopped \(names[index])"
        case .start:
            let index = try node(control.node)
            guard children[index] == nil else { throw DashboardControlError("\(names[index]) is running") }
            let port = try await start(index)
            healStarted = .now
            said = "started \(names[index]) again (listening on 127.0.0.1:\(port))"
        case .addColumn:
            let index = try node(control.node)
            columnsAdded += 1
            let column = "extra\(columnsAdded)_\(Int.random(in: 100...999))"
            let store = try Store(path: paths[index])
            try store.execute("ALTER TABLE stock ADD COLUMN \(column) TEXT DEFAULT 'new'")
            said = "\(names[index]) added the column stock.\(column); the others follow"
        case .deleteRows:
            let index = try node(control.node)
            let store = try Store(path: paths[index])
            func rows() throws -> Int64 {
                try store.execute("SELECT count(*) FROM stock").rows.first?.first?.integerValue ?? 0
            }
            let before = try rows()
            try store.execute(
                "DELETE FROM stock WHERE sku IN (SELECT sku FROM stock WHERE sku NOT LIKE 'shared-%' LIMIT 100)"
            )
            let after = try rows()
            said =
                "\(names[index]) deleted \(before - after) rows; the others delete them too; their tombstones go once every node holds the deletes"
        }
        message = said
        return said
    }

    /// The links of `index` (with `peer` only, or all of them).
    private func pairs(of index: Int, _ peer: Int?) throws -> [Pair] {
        guard proxied else { throw DashboardControlError("the links cannot be cut in this mode") }
        if let peer {
            guard peer != index else { throw DashboardControlError("pick two different nodes") }
            return [Pair(index, peer)]
        }
        return paths.indices.filter { $0 != index }.map { Pair(index, $0) }
    }
}
