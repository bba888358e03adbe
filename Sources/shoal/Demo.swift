import ArgumentParser
import Dispatch
import Foundation
import Logging
import ServiceLifecycle
import Shoal
import ShoalDashboard
import ShoalProcesses

extension ShoalCommand {
    struct Demo: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "demo",
            abstract: "Run N live nodes on this machine, write on all at once, and watch them converge.",
            discussion: """
                Starts N `shoal serve` processes on loopback, each with its own database: node 0 founds a cluster, \
                the others join it with invite codes, and all talk mutual TLS 1.3. Every node then writes at the same time: rows of its own, conflicting edits of shared rows, \
                deletes, and counter increments. The table shows each node's rows, version vector, digest and \
                live peers; the demo ends when all digests match (exit 0) or after a timeout (exit 1).
                """
        )

        @Option(help: "How many nodes.") var nodes = 5
        @Option(help: "Writes per node.") var writes = 200
        @Option(help: "Folder for the databases (default: a new temporary folder).") var dir: String?
        @Option(help: "Seconds to wait for convergence.") var timeout: Double = 30
        @OptionGroup var dashboardOptions: DashboardOptions

        /// `shoal demo … --dashboard` with no address (last, or before another option) gets the default one: the
        /// argument parser has no options whose value may be left out.
        static func givingDashboardItsDefault(_ arguments: [String]) -> [String] {
            guard arguments.first == "demo", let at = arguments.firstIndex(of: "--dashboard") else { return arguments }
            let next = arguments.index(after: at)
            guard next == arguments.endIndex || arguments[next].hasPrefix("-") else { return arguments }
            var given = arguments
            given.insert(DashboardOptions.defaultAddress, at: next)
            return given
        }

        func run() async throws {
            guard (2...32).contains(nodes) else {
                throw ShoalError(code: .invalidArgument, message: "--nodes must be between 2 and 32")
            }
            let directory = dir ?? NSTemporaryDirectory() + "shoal-demo-\(getpid())"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let paths = (0..<nodes).map { "\(directory)/node\($0).db" }
            for (index, path) in paths.enumerated() {
                for suffix in ["", "-wal", "-shm", ".applies"] {
                    try? FileManager.default.removeItem(atPath: path + suffix)
                }
                var options = StoreOptions()
                options.nodeName = "node\(index)"
                let store = try Store(path: path, options: options)
                try store.execute(
                    "CREATE TABLE stock(sku TEXT PRIMARY KEY, owner TEXT, price REAL, note TEXT, sold INTEGER DEFAULT 0)"
                )
                try store.replicate(table: "stock", counters: ["sold"])
            }
            // With the Avahi daemon up, nodes find each other by mDNS (their cluster's hint tells them apart from
            // any other node on this machine); without it, they are wired as a full mesh of static peers. With the
            // dashboard, always the mesh, each link through a proxy the page can cut.
            guard !dashboardOptions.dashboardTls else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--dashboard-tls goes with shoal serve (a node's own TLS identity); the demo takes --dashboard-token"
                )
            }
            let dashboardAddress = try dashboardOptions.address(
                exposing: "the page's controls stop nodes and write rows"
            )
            let mdns = dashboardAddress == nil && Self.mdnsAvailable()
            print(
                "Shoal demo: \(nodes) nodes in \(directory), mode: "
                    + (dashboardAddress != nil
                        ? "static peers on loopback (full mesh, each link through a proxy the dashboard can cut), mutual TLS 1.3"
                        : mdns
                        ? "mDNS discovery on loopback, mutual TLS 1.3"
                        : "static peers on loopback (full mesh; the Avahi daemon is not running), mutual TLS 1.3")
            )
            let cluster = DemoCluster(paths: paths, mdns: mdns, proxied: dashboardAddress != nil)
            guard let dashboardAddress else {
                do {
                    try await demonstrate(cluster)
                } catch {
                    await cluster.stopAll()
                    throw error
                }
                await cluster.stopAll()
                return
            }
            // The dashboard: its server, what feeds it, and the demo itself, which then keeps the nodes running
            // until SIGINT or SIGTERM.
            let hub = DashboardHub()
            let token = dashboardOptions.dashboardToken
            let server = DashboardServer(
                host: dashboardAddress.host,
                port: dashboardAddress.port,
                hub: hub,
                token: token,
                logger: Logger(label: "shoal.dashboard"),
                controls: { control in try await cluster.perform(control) },
                onListening: { port in
                    let url = DashboardServer.url(host: dashboardAddress.host, port: port, token: token)
                    FileHandle.standardOutput.write(Data("dashboard: \(url)\n".utf8))
                }
            )
            let group = ServiceGroup(
                services: [
                    server,
                    DemoDashboardFeed(cluster: cluster, hub: hub),
                    DemoRun {
                        try await demonstrate(cluster)
                        print("\nThe nodes keep running: play with them on the dashboard; stop the demo with Ctrl-C.")
                        // Out now, also into a pipe: a script (the browser test) reads the figures while the demo runs.
                        fflush(nil)
                    },
                ],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: Logger(label: "shoal.demo")
            )
            do {
                try await group.run()
            } catch {
                await cluster.stopAll()
                if let error = error as? DashboardServerError {
                    throw ShoalError(code: .invalidArgument, message: "--dashboard: \(error)")
                }
                throw error
            }
            await cluster.stopAll()
        }

        /// Founds the cluster, admits the nodes, seeds the shared rows, has every node write at once, and waits for
        /// convergence (throws exit code 1 if it does not come in time).
        private func demonstrate(_ cluster: DemoCluster) async throws {
            let paths = cluster.paths
            // Node 0 founds the cluster and serves; each other node is admitted with an invite code of its own,
            // over the network, as a new device on a LAN would be.
            let now = SystemWallClock().nowMilliseconds()
            let founder = try Store(path: paths[0])
            let founderKey = try Membership.initialize(databasePath: paths[0], store: founder, now: now)
            print("  node0 founded cluster \(founderKey.cluster.idHex) (node id \(founderKey.identity.nodeID.short))")
            let founderPort = try await cluster.start(0)
            print("  node0 listening on 127.0.0.1:\(founderPort)")
            for index in 1..<nodes {
                let code = try Membership.invite(store: founder, now: now)
                let store = try Store(path: paths[index])
                let keyFile = try Membership.initialize(databasePath: paths[index], store: store, now: now)
                let admission = try await JoinClient.exchange(
                    code: code,
                    identity: keyFile.identity,
                    name: "node\(index)",
                    siteID: store.identitySiteID,
                    address: PeerAddress(host: "127.0.0.1", port: founderPort)
                )
                try JoinClient.adopt(admission, databasePath: paths[index], store: store)
                print("  node\(index) joined with invite code \(code) (node id \(keyFile.identity.nodeID.short))")
            }
            try await cluster.learnSites()
            for index in 1..<nodes {
                let port = try await cluster.start(index)
                print("  node\(index) listening on 127.0.0.1:\(port)")
            }

            // Shared rows everyone will fight over, created on node 0 and spread by sync.
            let seed = try Store(path: paths[0])
            try seed.transaction {
                for index in 0..<10 {
                    try seed.execute(
                        "INSERT INTO stock(sku, owner, price, note) VALUES (?, 'node0', 1.0, 'shared')",
                        [.text("shared-\(index)")]
                    )
                }
            }
            guard try await waitForConvergence(paths, seconds: timeout, show: false) != nil else {
                print("the nodes did not converge on the shared rows in time")
                throw ExitCode(1)
            }

            print("\nAll \(nodes) nodes now write at once: own rows, conflicting edits, deletes, counters.")
            let started = Date()
            let writeCount = writes
            let nodeCount = nodes
            DispatchQueue.concurrentPerform(iterations: nodes) { index in
                Self.write(path: paths[index], node: index, nodes: nodeCount, writes: writeCount)
            }
            let lastWrite = Date()
            print(
                String(format: "writes done in %.2f s; waiting for convergence\n", lastWrite.timeIntervalSince(started))
            )
            guard let converged = try await waitForConvergence(paths, seconds: timeout, show: true) else {
                print("NOT converged after \(Int(timeout)) s")
                throw ExitCode(1)
            }
            let digest = try Store(path: paths[0]).digest().hex
            print(
                String(
                    format: "\nconverged %.0f ms after the last write: all %d digests are %@",
                    converged.timeIntervalSince(lastWrite) * 1000,
                    nodes,
                    String(digest.prefix(16))
                )
            )
            if cluster.proxied {
                // Propagation as each node timed its own applies (the figures the dashboard shows), once every node's
                // log shows the change sets it holds.
                let deadline = ContinuousClock.now + .seconds(5)
                var measured = await cluster.propagation()
                while measured.notLogged > 0 && ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(50))  // polling the nodes' logs, with a deadline
                    measured = await cluster.propagation()
                }
                print(
                    String(
                        format: "propagation (origin's commit to each other node's apply, as each node timed it): "
                            + "p50 %.1f ms, p95 %.1f ms over %d applies",
                        measured.latency.p50Ms ?? 0,
                        measured.latency.p95Ms ?? 0,
                        measured.latency.samples
                    )
                )
            }
        }

        /// Whether the Avahi daemon answers (a registration that is withdrawn at once).
        private static func mdnsAvailable() -> Bool {
            let probe = MDNSDiscovery(
                instanceName: "shoal-demo-probe-\(getpid())",
                port: 9,
                txt: [:],
                interface: "lo"
            )
            do {
                try probe.start()
                probe.stop()
                return true
            } catch {
                return false
            }
        }

        /// One node's share of the writes, through its own database file (the node picks them up at once).
        static func write(path: String, node: Int, nodes: Int, writes: Int, offset: Int = 0) {
            guard let store = try? Store(path: path) else { return }
            var random = SystemRandomNumberGenerator()
            for step in 0..<writes {
                let shared = SQLValue.text("shared-\(Int.random(in: 0..<10, using: &random))")
                switch step % 5 {
                case 0:
                    _ = try? store.execute(
                        "INSERT OR REPLACE INTO stock(sku, owner, price, note) VALUES (?, ?, ?, 'own')",
                        [.text("node\(node)-\(offset + step)"), .text("node\(node)"), .real(Double(step))]
                    )
                case 1:
                    _ = try? store.execute(
                        "UPDATE stock SET price = ?, owner = ? WHERE sku = ?",
                        [.real(Double(node * 1_000 + step)), .text("node\(node)"), shared]
                    )
                case 2:
                    _ = try? store.execute("UPDATE stock SET sold = sold + 1 WHERE sku = ?", [shared])
                case 3:
                    _ = try? store.execute(
                        "UPDATE stock SET note = ? WHERE sku = ?",
                        [.text("edited by node\(node)"), shared]
                    )
                default:
                    if step % 25 == 4 {
                        _ = try? store.execute(
                            "DELETE FROM stock WHERE sku = ?",
                            [.text("node\((node + 1) % nodes)-\(offset + step - 4)")]
                        )
                    } else {
                        _ = try? store.execute("UPDATE stock SET sold = sold + 2 WHERE sku = ?", [shared])
                    }
                }
            }
        }

        /// Polls every node until all digests match; returns when, or `nil` after `seconds`.
        private func waitForConvergence(_ paths: [String], seconds: Double, show: Bool) async throws -> Date? {
            let deadline = Date().addingTimeInterval(seconds)
            var lastShown = Date.distantPast
            while Date() < deadline {
                var rows: [(name: String, rows: Int, vector: VersionVector, digest: String, peers: Int)] = []
                for (index, path) in paths.enumerated() {
                    let store = try Store(path: path)
                    let status = try store.status()
                    let live = LiveStatus.read(forDatabase: path)?.peers.filter(\.connected).count ?? 0
                    rows.append(
                        ("node\(index)", status.tables.first { $0.name == "stock" }?.rows ?? 0, status.versionVector, status.digest.hex, live)
                    )
                }
                let converged = Set(rows.map(\.digest)).count == 1
                if show && converged {
                    // Live peers as of now: each node publishes its status every 250 ms, so wait for reports
                    // written after convergence rather than show older ones.
                    let now = SystemWallClock().nowMilliseconds()
                    let fresh = Date().addingTimeInterval(3)
                    var reports = paths.map { LiveStatus.read(forDatabase: $0) }
                    while Date() < fresh && reports.contains(where: { ($0?.writtenAtMs ?? 0) < now }) {
                        try await Task.sleep(for: .milliseconds(50))  // polling the reports, with a deadline
                        reports = paths.map { LiveStatus.read(forDatabase: $0) }
                    }
                    for index in rows.indices { rows[index].peers = reports[index]?.peers.filter(\.connected).count ?? 0 }
                }
                if show && (converged || Date().timeIntervalSince(lastShown) > 0.5) {
                    lastShown = Date()
                    print("node    rows  changes seen  digest            live peers")
                    for row in rows {
                        let seen = row.vector.entries.values.reduce(0, +)
                        print(
                            row.name.padding(toLength: 8, withPad: " ", startingAt: 0)
                                + String(row.rows).padding(toLength: 6, withPad: " ", startingAt: 0)
                                + String(seen).padding(toLength: 14, withPad: " ", startingAt: 0)
                                + String(row.digest.prefix(16)) + "  " + String(row.peers)
                        )
                    }
                    print(converged ? "all digests match" : "not yet converged")
                }
                if converged { return Date() }
                try await Task.sleep(for: .milliseconds(50))
            }
            return nil
        }
    }
}
