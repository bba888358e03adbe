import ArgumentParser
import Foundation
import Shoal
import ShoalStore
import ShoalProcesses

/// A write the harness committed on a node, with the stamp it got there.
struct AcknowledgedWrite {
    enum Kind {
        case value(column: String, value: ChaosValue)
        case delete
    }
    let node: Int
    let key: Int64
    let kind: Kind
    let causalLength: UInt64
    let stamp: Stamp
    /// Made by a node after its removal (see ``Removal``).
    var afterRemoval = false
}

@main
struct ShoalChaos: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "shoal-chaos",
        abstract: "Run shoal serve nodes through faults (kill -9, partitions, delayed, duplicated and reordered "
            + "frames; on the relay path: relay kills, restores and storage losses, a member's removal, a proxy that "
            + "tampers with pull answers), then heal and check convergence against a log of acknowledged writes."
    )

    @Option(help: "Seed (printed; pass it again to replay the same faults and writes).") var seed: UInt64?
    @Option(help: "How many nodes.") var nodes = 4
    @Option(help: "Seconds of chaos before healing.") var seconds: Double = 8
    @Option(help: "Seconds allowed to converge after healing.") var convergeTimeout: Double = 90
    @Option(help: "Folder for the databases and logs.") var dir: String?
    @Flag(
        help: "The relay path: nodes never reach each other and converge only through a relay, which is killed (-9) at random."
    )
    var relay = false
    @Option(
        help: "The relay path on PostgreSQL (implies --relay): two relay instances on this database, every node given both, one of them killed (-9) at random."
    )
    var postgres: String?
    @Flag(
        help: "The relay path on SQLite: now and then a killed relay comes back restored from an older copy of its files. Off by default until it has had its long runs."
    )
    var relayRestores = false
    @Flag(
        help: "The relay path: now and then the relay loses its storage (killed, its SQLite files deleted or its PostgreSQL database dropped and made again) and comes back empty; its operator makes a new token and restarts the members with it, and they must upload again all it lost."
    )
    var relayLosses = false
    @Flag(
        help: "The relay path: at a random moment one member removes another (`shoal trust remove` on its file), which rotates the relay's key; the removed node keeps running and writing, and what it writes beyond its removal's cut must reach no one. With --relay-restores, a later kill restores the relay from a copy made before the rotation."
    )
    var removal = false
    @Flag(
        help: "The relay path: the nodes reach the relay through a proxy that, now and then, alters pull answers (a byte flipped, two chunks swapped, a chunk of another cluster injected, an earlier chunk replayed as a later range); nothing altered may be applied, and once it stops everyone converges."
    )
    var tampering = false
    @Flag(help: "All of --relay-losses, --removal and --tampering (and --relay-restores on SQLite).")
    var relayHostile = false
    @Option(
        help: "Nodes collect deletes without a member silent longer than this many milliseconds, and once a run one node is cut off from all others for three horizons (on the relay path: stopped, its app writing to its file), writing all the while; it must come back without bringing a collected row back."
    )
    var horizonMs: UInt64?

    func run() async throws {
        let seed = seed ?? UInt64.random(in: 0...UInt64.max)
        let (relayLosses, removal, tampering) = (relayLosses || relayHostile, removal || relayHostile, tampering || relayHostile)
        let relayRestores = relayRestores || (relayHostile && postgres == nil)
        let relay = relay || postgres != nil || relayLosses || removal || tampering
        let through = postgres != nil ? " through two relay instances on PostgreSQL" : relay ? " through a relay" : ""
        print("shoal-chaos seed \(seed): \(nodes) nodes\(through), \(seconds) s of chaos")
        var random = SeededRandom(state: seed)
        let directory = dir ?? NSTemporaryDirectory() + "shoal-chaos-\(seed)"
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let paths = (0..<nodes).map { "\(directory)/node\($0).db" }
        var stores: [Store] = []
        for (index, path) in paths.enumerated() {
            var options = StoreOptions()
            options.nodeName = "node\(index)"
            let store = try Store(path: path, options: options)
            try store.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, a, b, n INTEGER DEFAULT 0)")
            try store.replicate(table: "t", counters: ["n"])
            stores.append(store)
        }
        // One cluster: node keys, node 0 founds it, the others join with invites (through its database file).
        try Membership.formLocally(paths, now: SystemWallClock().nowMilliseconds())
        var foreignWriters = try paths.map { try ForeignWriter(path: $0) }
        // A backup taken of a node's file (a consistent copy, as `VACUUM INTO` or the SQLite shell's `.backup` makes),
        // waiting to be restored over it.
        var backups: [Int: String] = [:]
        var lostWithRestores = 0

        // The relay path: one relay, a token for the cluster, and no links between nodes at all.
        var relayServer: RelayServer?
        if relay {
            let cluster = try KeyFile.load(forDatabase: paths[0]).cluster.idHex
            if let postgres {
                // A database of this run's own on the server, so runs never share a relay's data.
                let name = "chaos_\(seed % 1_000_000_007)"
                let database = postgres.replacingOccurrences(of: "/shoal?", with: "/\(name)?")
                try RelayServer.createDatabase(server: postgres, name: name)
                relayServer = try RelayServer(
                    storage: ["--postgres", database], log: directory + "/relay", instances: 2, cluster: cluster,
                    postgres: (postgres, name)
                )
            } else {
                relayServer = try RelayServer(storage: ["--data", directory + "/relay"], log: directory + "/relay", instances: 1, cluster: cluster)
            }
        }
        defer { relayServer?.stop() }
        // Every pair talks through a proxy: node i dials node j (j < i) via proxy (i, j).
        let faults = Faults()
        var peerPorts: [[Int]] = Array(repeating: [], count: nodes)
        let proxies = Task {
            try await withThrowingDiscardingTaskGroup { group in
                for i in 0..<(relay ? 0 : nodes) {
                    for j in 0..<i {
                        let ready = AsyncStream.makeStream(of: Int.self)
                        group.addTask {
                            try await FaultProxy(from: i, to: j, faults: faults).run { ready.continuation.yield($0) }
                        }
                        for await port in ready.stream {
                            await MainActorBox.shared.record(i, port)
                            break
                        }
                    }
                }
            }
        }
        defer { proxies.cancel() }
        while await MainActorBox.shared.count < (relay ? 0 : nodes * (nodes - 1) / 2) {
            try await Task.sleep(for: .milliseconds(10))
        }
        for (i, port) in await MainActorBox.shared.ports { peerPorts[i].append(port) }

        // With --tampering the nodes reach every relay instance through a proxy of its own, which alters some pull
        // answers while the schedule says so; a one-node cluster of another id uploads through it first, so that the
        // proxy holds chunks of another cluster to inject.
        var relayURLs = relayServer?.urls ?? []
        let altering = Tampering(cluster: try KeyFile.load(forDatabase: paths[0]).cluster.idHex)
        let upstreamPorts = tampering ? relayServer?.instancePorts ?? [] : []
        let tamperingProxies = Task {
            try await withThrowingDiscardingTaskGroup { group in
                for port in upstreamPorts {
                    let ready = AsyncStream.makeStream(of: Int.self)
                    group.addTask {
                        try await TamperingProxy(upstreamPort: port, tampering: altering).run { ready.continuation.yield($0) }
                    }
                    for await port in ready.stream {
                        await MainActorBox.shared.recordProxy(port)
                        break
                    }
                }
            }
        }
        defer { tamperingProxies.cancel() }
        if tampering, let relayServer {
            while await MainActorBox.shared.proxyPorts.count < relayServer.instancePorts.count {
                try await Task.sleep(for: .milliseconds(10))
            }
            relayURLs = await MainActorBox.shared.proxyPorts.map { "http://127.0.0.1:\($0)" }
            try await ForeignCluster.upload(directory: directory, relay: relayServer, through: relayURLs[0], proxy: altering)
        }

        var cluster = Cluster(
            paths: paths,
            peerPorts: peerPorts,
            faults: faults,
            relayURLs: relayURLs,
            relayToken: relayServer?.token
        )
        defer { cluster.stopAll() }
        cluster.horizonMilliseconds = horizonMs
        for node in 0..<nodes { try await cluster.start(node) }
        var written = try WrittenValues()
        var removed: Removal?
        // The removal comes at a random moment in the middle of the run.
        let removalAt = removal && nodes >= 3 ? Date().addingTimeInterval(seconds * Double.random(in: 0.2...0.6, using: &random)) : nil
        // After the removal, with --relay-restores, the first relay kill from this moment on (a few seconds later, once
        // the key has moved to its new epoch) restores a copy made before the rotation.
        var restoreAcrossRotation: Date?

        var log: [AcknowledgedWrite] = []
        var restarts: [(node: Int, at: Date)] = []
        var heals: [(pair: (Int, Int), at: Date)] = []
        var relayRestart: Date?
        var counts = [String: Int]()
        let deadline = Date().addingTimeInterval(seconds)
        // An app update halfway through: one node adds a column to t (through its file, as the app would) and
        // writes it; the change must reach every node with the data while they all keep writing.
        var schemaChangeAt: Date? = Date().addingTimeInterval(seconds / 2)
        // With a horizon: one node cut off from every other for three horizons, from a random moment early in the run.
        var isolation: (node: Int, from: Date, until: Date)?
        if let horizon = cluster.horizonMilliseconds, nodes >= 3 {
            let from = Date().addingTimeInterval(seconds * Double.random(in: 0.05...0.2, using: &random))
            let node = Int.random(in: 0..<nodes, using: &random)
            isolation = (node, from, from.addingTimeInterval(3 * Double(horizon) / 1_000))
        }
        var isolating = false
        while Date() < deadline {
            let now = Date()
            if let at = schemaChangeAt, at <= now {
                let node = Int.random(in: 0..<nodes, using: &random)
                try foreignWriters[node].run("ALTER TABLE t ADD COLUMN note TEXT DEFAULT 'none'", [])
                try foreignWriters[node].run("UPDATE t SET note = 'updated app' WHERE k % 3 = 0", [])
                _ = try stores[node].captureForeignWrites()
                schemaChangeAt = nil
                counts["schema changes", default: 0] += 1
            }
            // On the relay path the node cut off is stopped (nodes meet only there); it starts again when it is due.
            let stopped = relay && isolating ? isolation?.node : nil
            for restart in restarts where restart.at <= now && restart.node != stopped { try await cluster.start(restart.node) }
            restarts.removeAll { $0.at <= now && $0.node != stopped }
            if let at = relayRestart, at <= now {
                try relayServer?.start()
                relayRestart = nil
            }
            if let cut = isolation, !isolating, cut.from <= now, now < cut.until {
                if relay {
                    cluster.kill(cut.node)
                    restarts.removeAll { $0.node == cut.node }
                }
                for other in 0..<nodes where other != cut.node { await faults.partition(cut.node, other) }
                print(String(format: "node\(cut.node) cut off from every other node for %.1f s", cut.until.timeIntervalSince(now)))
                isolating = true
                counts["isolations past the horizon", default: 0] += 1
            }
            if let cut = isolation, isolating, cut.until <= now {
                for other in 0..<nodes where other != cut.node { await faults.heal(cut.node, other) }
                if relay, !cluster.isRunning(cut.node) { try await cluster.start(cut.node) }
                isolating = false
                isolation = nil
            }
            let cutOff = isolating ? isolation?.node : nil
            for heal in heals where heal.at <= now && (cutOff.map { ![heal.pair.0, heal.pair.1].contains($0) } ?? true) {
                await faults.heal(heal.pair.0, heal.pair.1)
            }
            heals.removeAll { $0.at <= now }
            if isolating, counts["members suspended", default: 0] == 0,
                try stores.contains(where: { try !$0.suspensions().isEmpty })
            {
                counts["members suspended", default: 0] += 1
            }

            let roll = Int.random(in: 0..<100, using: &random)
            let node = Int.random(in: 0..<nodes, using: &random)
            switch roll {
            case 0..<75:
                if var write = try write(
                    on: node, store: stores[node], foreign: foreignWriters[node], written: &written, random: &random
                ) {
                    write.afterRemoval = removed?.node == node
                    log.append(write)
                }
                counts["writes", default: 0] += 1
            case 75..<80 where cluster.isRunning(node) && restarts.count < nodes - 1 && node != stopped:
                cluster.kill(node)
                restarts.append((node, now.addingTimeInterval(Double.random(in: 0.2...1.5, using: &random))))
                counts["kill -9", default: 0] += 1
            case 88..<90 where tampering:
                // Pull answers altered now and then, or no longer.
                let on = !(await altering.isOn)
                await altering.set(on: on, probability: Double.random(in: 0.1...0.5, using: &random))
                if on { counts["tampering spells", default: 0] += 1 }
            case 80..<90 where relay:
                // The relay dies mid-whatever (an upload, a pull) and comes back on the same port and data.
                if relayRestart == nil, let server = relayServer {
                    // Now and then (at most twice a run) the relay loses its storage: it comes back at once, empty,
                    // with a new token the members are restarted with.
                    if relayLosses, counts["relay storage lost", default: 0] < 2, Int.random(in: 0..<5, using: &random) == 0 {
                        try server.loseStorage()
                        restoreAcrossRotation = nil
                        cluster.relayToken = server.token
                        for member in 0..<nodes where member != removed?.node && cluster.isRunning(member) {
                            try await cluster.restart(member)
                        }
                        counts["relay storage lost", default: 0] += 1
                        break
                    }
                    server.kill(Int.random(in: 0...1, using: &random))
                    relayRestart = now.addingTimeInterval(Double.random(in: 0.2...2, using: &random))
                    counts["relay kill -9", default: 0] += 1
                    // Now and then its files are kept as they are (a crash image), and a later kill puts them back:
                    // the relay comes back restored from an older copy, without what was uploaded since.
                    let acrossRotation = restoreAcrossRotation.map { $0 <= now && server.holdsImage } ?? false
                    if relayRestores, server.dataDirectory != nil,
                        acrossRotation || restoreAcrossRotation == nil && Int.random(in: 0..<3, using: &random) == 0,
                        try server.keepOrRestoreImage()
                    {
                        counts["relay restored from an older copy", default: 0] += 1
                        if acrossRotation {
                            counts["relay restored from before the rotation", default: 0] += 1
                            restoreAcrossRotation = nil
                        }
                    }
                }
            case 80..<85:
                let other = (node + Int.random(in: 1..<nodes, using: &random)) % nodes
                await faults.partition(node, other)
                heals.append(((node, other), now.addingTimeInterval(Double.random(in: 0.2...2, using: &random))))
                counts["partitions", default: 0] += 1
            case 85..<90:
                let on = Bool.random(using: &random)
                await faults.set(
                    delay: on ? UInt64.random(in: 1...40, using: &random) : 0,
                    duplicate: on ? Double.random(in: 0...0.05, using: &random) : 0,
                    reorder: on ? Double.random(in: 0...0.05, using: &random) : 0
                )
                counts["frame faults", default: 0] += 1
            case 90..<91:
                // Every node dies at once: no version vector may claim what its node does not hold.
                for index in 0..<nodes { cluster.kill(index) }
                try checkClaims(stores: stores, log: log)
                for index in 0..<nodes where index != stopped { try await cluster.start(index) }
                restarts = []
                counts["crash-all checks", default: 0] += 1
            case 91..<92 where backups[node] == nil && removed?.node != node:
                let backup = "\(directory)/node\(node)-backup-\(counts["backups", default: 0]).db"
                try foreignWriters[node].run("VACUUM INTO ?", [.text(Array(backup.utf8))])
                backups[node] = backup
                counts["backups", default: 0] += 1
            case 91..<92 where removed?.node != node && node != stopped:
                // The node's file is replaced by its older backup (the node stopped first, as an operator would): it
                // must move to a fresh site and take back from peers what it had sent. Writes it made after the
                // backup and never sent are gone with the restore; every other acknowledged write must survive.
                cluster.kill(node)
                restarts.removeAll { $0.node == node }
                // The harness's own connections to the file close with the objects that hold them.
                stores[node] = try Store(path: ":memory:")
                foreignWriters[node] = try ForeignWriter(path: ":memory:")
                for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: paths[node] + suffix) }
                try FileManager.default.copyItem(atPath: backups[node]!, toPath: paths[node])
                backups[node] = nil
                var options = StoreOptions()
                options.nodeName = "node\(node)"
                stores[node] = try Store(path: paths[node], options: options)
                foreignWriters[node] = try ForeignWriter(path: paths[node])
                // A write of this node survives the restore when the restored file holds its dot (it was in the
                // backup) or another node's version vector covers it (it was sent). Not "some row holds it or beats
                // it": a row re-inserted elsewhere (a higher causal length) beats a write that was never sent, and
                // the write was wrongly kept, then reported lacking once the node reused its number.
                let before = log.count
                let holders = stores.indices.filter { $0 != removed?.node }.map { stores[$0] }
                log = try log.filter { write in
                    try write.node != node || holders.contains { try $0.versionVector().covers(write.stamp.dot) }
                }
                lostWithRestores += before - log.count
                try await cluster.start(node)
                counts["restores", default: 0] += 1
            default:
                break
            }
            if let at = removalAt, removed == nil, now >= at {
                let victim = Int.random(in: 0..<nodes, using: &random)
                let first = Int.random(in: 1..<nodes, using: &random)
                let signers = (0..<nodes - 1).map { (victim + 1 + (first - 1 + $0) % (nodes - 1)) % nodes }
                // With --relay-restores, a copy of the relay's files from before the rotation, put back at a later kill.
                if relayRestores, relayRestart == nil, let server = relayServer, server.dataDirectory != nil {
                    if !server.holdsImage {
                        server.kill(0)
                        _ = try server.keepOrRestoreImage()
                        try server.start()
                    }
                    restoreAcrossRotation = now.addingTimeInterval(3)
                }
                guard let removal = try Removal.perform(node: victim, signers: signers, paths: paths) else {
                    try await Task.sleep(for: .milliseconds(100))  // every other member awaits its fresh state
                    continue
                }
                removed = removal
                let signer = removal.signer
                // A backup of the signer's file from before the removal is not put back: it would take the removal
                // with it while no other member may have read it yet (the cluster would then never have removed
                // anyone, and the run would check a removal that did not happen).
                backups[signer] = nil
                // Its operator hands a new token to the members only, should the relay lose its storage.
                cluster.freezeRelayArguments(of: victim)
                cluster.removedNode = victim
                counts["removals", default: 0] += 1
            }
            try await Task.sleep(for: .milliseconds(Int.random(in: 5...30, using: &random)))  // pacing the load
        }

        if lostWithRestores > 0 {
            print("\(lostWithRestores) acknowledged writes were made after a backup later restored, and never sent")
        }
        for (kind, count) in await altering.counts { counts["pull answers tampered (\(kind))"] = count }
        print("chaos: " + counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
        await faults.healAll()
        await altering.set(on: false, probability: 0)
        if relayRestart != nil { try relayServer?.start() }
        for node in 0..<nodes where !cluster.isRunning(node) { try await cluster.start(node) }
        // A removed node is left out of every comparison: it converges with no one.
        let members = (0..<nodes).filter { $0 != removed?.node }
        let healed = Date()
        var converged = false
        // After a removal, the members have also converged on its line: the same fences everywhere (a member installs
        // its fence when it reads the removal, and may sign a cut of its own then, which changes the digests again).
        var fencesAgree = true
        while Date().timeIntervalSince(healed) < convergeTimeout {
            let fences = try removed == nil ? [] : members.map { try stores[$0].fences() }
            fencesAgree = removed == nil || Set(fences).count == 1 && !fences[0].isEmpty
            // With a horizon, the member collected without is back: it took its fresh state and told the others, and
            // no node still holds a suspension.
            let settled = try members.allSatisfy {
                try stores[$0].suspensions().isEmpty && stores[$0].ownSuspensions().isEmpty
            }
            if try fencesAgree && settled && Set(members.map { try stores[$0].digest() }).count == 1 {
                converged = true
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        guard converged else {
            // What each member's own Store sees, so that a failure says which check held it back.
            for node in members {
                let status = try stores[node].status()
                let paused = status.pausedTables.map(\.name)
                let notices = try stores[node].suspensions().map { "\($0.site.hex.prefix(8))/\($0.by.hex.prefix(8))" }
                print(
                    "node\(node): site \(status.siteID.hex.prefix(8)) digest \(status.digest) suspensions \(notices) "
                        + "own \(try stores[node].ownSuspensions().keys.map { $0.hex.prefix(8) }) "
                        + "awaiting \(status.awaitsFreshState) paused \(paused) "
                        + "tables \(try stores[node].tableDigests().tables.map { "\($0.name) \($0.digest)" }) "
                        + "vector \(status.versionVector)"
                )
            }
            print(
                "FAILED: \(fencesAgree ? "digests (or suspensions)" : "the members' fences") still differ "
                    + "\(Int(convergeTimeout)) s after healing (logs in \(directory))"
            )
            throw ExitCode(1)
        }
        print(String(format: "converged %.2f s after healing", Date().timeIntervalSince(healed)))
        // The digest is not trusted alone: every table's rows, value by value, read with plain connections; and each
        // file's data rows agree with its metadata.
        let contents = try members.map { try SQLiteConnection(path: paths[$0]).applicationTableContents() }
        for (index, content) in contents.enumerated() where content != contents[0] {
            let tables = Set(content.keys).union(contents[0].keys).filter { content[$0] != contents[0][$0] }.sorted()
            print("FAILED: node\(members[index])'s rows differ from node\(members[0])'s in \(tables.joined(separator: ", ")) "
                + "though the digests match (files in \(directory))")
            throw ExitCode(1)
        }
        // Every value read outside Shoal is one some write put there: nothing altered on the way was applied.
        for (index, content) in contents.enumerated() {
            try written.check(node: members[index], rows: content["t"] ?? [])
        }
        for node in members {
            let report = try stores[node].verify(limit: 10)
            guard report.isConsistent else {
                print("FAILED: node\(node)'s data rows disagree with its metadata: \(report.mismatches)")
                throw ExitCode(1)
            }
        }
        var checked = log
        if let removed {
            let settled = try removed.settle(log: log, remaining: members.map { ($0, stores[$0]) })
            checked = settled.log
            print(settled.summary)
        }
        let remaining = members.map { stores[$0] }
        try checkClaims(stores: remaining, log: checked)
        try checkAcknowledged(stores: remaining, log: checked)
        print(
            "checked \(checked.count) acknowledged writes on \(members.count) nodes: all present or overwritten by a later "
                + "write; no deleted row reappeared; no version vector claims what its node lacks; every table's rows "
                + "identical value by value, read outside Shoal, each value one a write made"
        )
        print("0 failed, 1 passed")
    }

    /// One random write through node `node`'s own file, made through the harness's `Store` or, one time in
    /// four, through a plain SQLite connection (as an app with its own SQLite library would); returns it if it
    /// committed a change that still holds what was written.
    private func write(
        on node: Int,
        store: Store,
        foreign: ForeignWriter,
        written: inout WrittenValues,
        random: inout SeededRandom
    ) throws -> AcknowledgedWrite? {
        let key = Int64.random(in: 0..<12, using: &random)
        let isForeign = Int.random(in: 0..<4, using: &random) == 0
        let before = try store.versionVector()[store.siteID]
        var kind: AcknowledgedWrite.Kind?
        switch Int.random(in: 0..<6, using: &random) {
        case 0, 1:
            let value = ChaosValue.random(using: &random)
            try written.record(key: key, column: "a", value: value)
            if isForeign {
                try foreign.run(
                    "INSERT INTO t(k, a, b) VALUES (?, ?, 'new') ON CONFLICT(k) DO UPDATE SET a = excluded.a",
                    [.integer(key), value.binding]
                )
            } else {
                // In one transaction: the node may apply a row with this key between a lone check and the insert.
                try store.transaction {
                    if try store.execute("SELECT 1 FROM t WHERE k = ?", [.integer(key)]).rows.isEmpty {
                        try store.execute(
                            "INSERT INTO t(k, a, b) VALUES (?, \(value.expression), 'new')",
                            [.integer(key), value.argument]
                        )
                    } else {
                        try store.execute("UPDATE t SET a = \(value.expression) WHERE k = ?", [value.argument, .integer(key)])
                    }
                }
            }
            kind = .value(column: "a", value: value)
        case 2:
            let value = ChaosValue.random(using: &random)
            try written.record(key: key, column: "b", value: value)
            if isForeign {
                try foreign.run("UPDATE t SET b = ? WHERE k = ?", [value.binding, .integer(key)])
            } else {
                try store.execute("UPDATE t SET b = \(value.expression) WHERE k = ?", [value.argument, .integer(key)])
            }
            kind = .value(column: "b", value: value)
        case 3:
            if isForeign {
                try foreign.run("DELETE FROM t WHERE k = ?", [.integer(key)])
            } else {
                try store.execute("DELETE FROM t WHERE k = ?", [.integer(key)])
            }
            kind = .delete
        default:
            written.recordIncrement(key: key)
            if isForeign {
                try foreign.run("UPDATE t SET n = n + 1 WHERE k = ?", [.integer(key)])
            } else {
                try store.execute("UPDATE t SET n = n + 1 WHERE k = ?", [.integer(key)])
            }
        }
        // A foreign write gets its clock when the node stamps it (the running node may have done so already).
        if isForeign { _ = try store.captureForeignWrites() }
        guard let kind, try store.versionVector()[store.siteID] > before,
            let state = try store.rowState(table: "t", primaryKey: [.integer(key)])
        else { return nil }
        switch kind {
        case .value(let column, let value):
            // The node may have applied a later remote write to this cell in between: then there is nothing of
            // ours to follow.
            guard case .value(let stamp, _) = state.cells[column == "a" ? 0 : 1], stamp.site == store.siteID,
                try value.isStored(in: store, column: column, key: key)
            else { return nil }
            return AcknowledgedWrite(node: node, key: key, kind: kind, causalLength: state.causalLength, stamp: stamp)
        case .delete:
            guard let stamp = state.lengthStamp, !state.isAlive, stamp.site == store.siteID else { return nil }
            return AcknowledgedWrite(node: node, key: key, kind: kind, causalLength: state.causalLength, stamp: stamp)
        }
    }

    /// A version vector covering a write's dot must hold that write or something that beat it.
    private func checkClaims(stores: [Store], log: [AcknowledgedWrite]) throws {
        for (index, store) in stores.enumerated() {
            let vector = try store.versionVector()
            for write in log where vector.covers(write.stamp.dot) {
                let state = try store.rowState(table: "t", primaryKey: [.integer(write.key)])
                if state.map({ !holds($0, write) }) ?? true, try wasCollected(write, in: store, restored: true) {
                    continue
                }
                if state.map({ !holds($0, write) }) ?? true,
                    try overwrittenBeyondFence(write, in: store, others: stores.filter { $0 !== store })
                {
                    continue
                }
                guard let state, holds(state, write) else {
                    print("FAILED: node\(index) claims \(write.stamp.dot) but lacks its write to key \(write.key)")
                    throw ExitCode(1)
                }
            }
        }
    }

    /// Whether another node holds a later write to `write`'s key by a removed node, beyond the fence `store` keeps of
    /// it. `store` refuses that write for now (another member held more of the removed node when the removal reached
    /// this one; its own cut raises the fence soon), and a range that carries only that overwrite still claims `write`
    /// here, as the relay pull allows for another member's write (see `RelayPullSessionModelTests`). The final check
    /// compares every node's rows once the fences are equal.
    private func overwrittenBeyondFence(_ write: AcknowledgedWrite, in store: Store, others: [Store]) throws -> Bool {
        let fences = try store.fences()
        guard !fences.isEmpty else { return false }
        for other in others {
            guard let state = try other.rowState(table: "t", primaryKey: [.integer(write.key)]) else { continue }
            var stamps = state.cells.compactMap { cell -> Stamp? in
                if case .value(let stamp, _) = cell { stamp } else { nil }
            }
            if let stamp = state.lengthStamp { stamps.append(stamp) }
            if stamps.contains(where: { stamp in fences[stamp.site].map { stamp.seq > $0 } ?? false }) { return true }
        }
        return false
    }

    /// Every acknowledged write is present, unless a later write (by the merge rules) replaced it; a deleted
    /// row stays deleted unless re-inserted after the delete.
    private func checkAcknowledged(stores: [Store], log: [AcknowledgedWrite]) throws {
        for store in stores {
            for write in log {
                let state = try store.rowState(table: "t", primaryKey: [.integer(write.key)])
                if state == nil, try wasCollected(write, in: store) { continue }
                guard let state, holds(state, write) else {
                    print("FAILED: the write to key \(write.key) by node\(write.node) at \(write.stamp) is lost")
                    throw ExitCode(1)
                }
                let present = try !store.execute("SELECT 1 FROM t WHERE k = ?", [.integer(write.key)]).rows.isEmpty
                if present != state.isAlive {
                    print(
                        "FAILED: key \(write.key) is \(present ? "present" : "absent") but its causal length is "
                            + "\(state.causalLength)"
                    )
                    throw ExitCode(1)
                }
                if case .value(let column, let value) = write.kind, state.causalLength == write.causalLength,
                    case .value(let stamp, _) = state.cells[column == "a" ? 0 : 1], stamp == write.stamp
                {
                    guard try value.isStored(in: store, column: column, key: write.key) else {
                        print(
                            "FAILED: key \(write.key).\(column) holds the winning stamp but not its value "
                                + "(\(value.summary))"
                        )
                        throw ExitCode(1)
                    }
                }
            }
        }
    }

    /// Whether a write's row is gone with its metadata because a delete that beat it was collected: the row is absent,
    /// and some node collected a causal length in the table at least as high as the delete's. With `restored`, a node
    /// that lost history, or was collected without (it holds a suspension naming it), and has not taken its fresh
    /// state yet may still hold the row (its claim came from a peer that had collected it; the fresh state removes it).
    private func wasCollected(_ write: AcknowledgedWrite, in store: Store, restored: Bool = false) throws -> Bool {
        let present = try !store.execute("SELECT 1 FROM t WHERE k = ?", [.integer(write.key)]).rows.isEmpty
        // A node that never collected nor heard of a collection has no such table: nothing was collected there.
        let collecting = try !store.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(Store.collectedTable)]
        ).rows.isEmpty
        guard collecting else { return false }
        let floor = try store.execute("SELECT max(cl) FROM \(Store.collectedTable) WHERE tbl = 't'").rows
        let pending = try restored && (store.awaitsFreshState() || !store.unsettledSuspensions().isEmpty)
        guard !present || pending, case .integer(let collected)? = floor.first?.first else { return false }
        return UInt64(collected) >= write.causalLength + write.causalLength % 2
    }

    private func holds(_ state: RowState, _ write: AcknowledgedWrite) -> Bool {
        if state.causalLength > write.causalLength { return true }
        guard state.causalLength == write.causalLength else { return false }
        switch write.kind {
        case .delete:
            return true
        case .value(let column, _):
            guard case .value(let stamp, _) = state.cells[column == "a" ? 0 : 1] else { return false }
            return stamp >= write.stamp
        }
    }
}

/// Collects the proxies' ports as they bind.
actor MainActorBox {
    static let shared = MainActorBox()
    private(set) var ports: [(Int, Int)] = []
    var count: Int { ports.count }
    func record(_ node: Int, _ port: Int) { ports.append((node, port)) }
    /// The tampering proxies' ports, one per relay instance, in order.
    private(set) var proxyPorts: [Int] = []
    func recordProxy(_ port: Int) { proxyPorts.append(port) }
}
