import ArgumentParser
import Dispatch
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import Shoal
import ShoalProcesses
import ShoalDashboard
import ShoalMetricsEndpoint
import Synchronization

extension ShoalCommand {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "serve",
            abstract: "Run a node: listen for peers, dial static peers, and keep them in sync until stopped.",
            discussion: """
                Prints `listening on HOST:PORT` once bound (port 0 picks a free port). Writes made to the same \
                database by other processes, through `shoal sql` or any other SQLite client (the app's own driver, \
                the `sqlite3` shell), reach the peers within milliseconds. \
                Stop it with SIGINT or SIGTERM. Peer links are mutual TLS 1.3: a peer gets data only when its key is \
                on the cluster's roster (`shoal invite` / `shoal join`, `shoal trust`). --insecure-plaintext turns \
                that off (no authentication, no encryption: the cluster id is the only gate). --metrics HOST:PORT \
                serves the node's sync-health metrics for Prometheus at http://HOST:PORT/metrics, with no \
                authentication (keep it on loopback or a private address), and prints `metrics listening on \
                HOST:PORT` once bound. --dashboard HOST:PORT serves a live web page of the node and its peers \
                (loopback only, unless --dashboard-token is given, which every request must then carry) and prints \
                `dashboard: URL` once bound.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Address to listen on.") var listen = "127.0.0.1:0"
        @Option(name: .customLong("peer"), help: "A peer to dial, HOST:PORT (repeatable).") var peers: [String] = []
        @Option(help: "With --insecure-plaintext only: the cluster id (nodes of other clusters are refused).")
        var cluster: String?
        @Flag(help: "No TLS: peers are neither authenticated nor encrypted (for tests of the plaintext path only).")
        var insecurePlaintext = false
        @Option(help: "Node name shown to peers.") var name: String?
        @Option(help: "Milliseconds between periodic rounds.") var roundInterval: UInt64 = 2_000
        @Option(help: "Milliseconds between change-log compactions (0: never).")
        var compactionInterval: UInt64 = 60_000
        @Flag(
            inversion: .prefixedNo,
            help: """
                Collect tombstones once every member of the roster holds their deletes (on by default; a member \
                restored from an older backup or a copied file takes a fresh state from its first peer).
                """
        )
        var collectDeletes = true
        @Option(
            help: ArgumentHelp(
                "Collect tombstones without a member silent longer than this (e.g. 30m, 12h, 7d; default: wait for every member).",
                discussion: "A member collected without is suspended for collection only: when it comes back it takes a fresh state from a peer before its own writes leave it, and its writes to rows deleted and collected meanwhile go to its conflict log (shoal conflicts; restorable with shoal conflicts restore). Give every member the same horizon.",
                valueName: "duration"
            )
        )
        var gcHorizon: HorizonDuration?
        @Option(
            help: ArgumentHelp(
                "For tests: a horizon in milliseconds, below the 2-minute minimum (every member must meet every other directly).",
                visibility: .private
            )
        )
        var gcHorizonUncheckedMs: UInt64?
        @Flag(help: "Send change batches uncompressed, to peers and to the relay (for measuring, or for a relay that members older than compression pull from).")
        var noCompression = false
        @Flag(help: "Compress links to peers on this machine too (loopback addresses; off by default: their bytes never cross a network). For measuring.")
        var compressLoopback = false
        @Option(
            help: ArgumentHelp(
                "How to follow peers' schema changes: automatic (run a peer's new column or table here at once) or manual.",
                discussion: "manual: for an app that migrates itself. A peer's change is recorded and its values are held (and forwarded) until the app runs the identical ALTER, which is then the same change, not a conflict.",
                valueName: "automatic|manual"
            )
        )
        var schemaChanges = SchemaChangesMode.automatic
        @Flag(help: "Do not advertise or browse with mDNS (static peers only).") var noMdns = false
        @Flag(help: "Neither remember peers nor dial the ones remembered from earlier runs.") var noRemembered = false
        @Option(
            help: ArgumentHelp(
                "A relay to sync through whenever it answers: https://HOST:PORT (http:// to loopback only).",
                discussion: "Give it again for other instances of the same relay: the next is tried when one does not answer."
            )
        )
        var relay: [String] = []
        @Option(help: "The relay's bearer token for this cluster (`shoal relay token create`).") var relayToken: String?
        @Option(help: "A file holding the relay token (kept out of the process list).") var relayTokenFile: String?
        @Option(help: "Upload a snapshot to the relay once the change sets it does not cover outgrow this many bytes (and the last snapshot).")
        var relaySnapshotBytes: Int64 = 8 * 1024 * 1024
        @Option(help: "A PEM CA (or self-signed certificate) to trust for the relay instead of the system's roots.")
        var relayCa: String?
        @Option(help: "Serve Prometheus metrics at http://HOST:PORT/metrics (no authentication: keep it private).")
        var metrics: String?
        @OptionGroup var dashboardOptions: DashboardOptions
        @Option(help: .hidden) var applyLog: String?  // for shoal demo: see ApplyLog

        /// Started by a `shoal demo`, a harness or a test (``ServeProcess``): stops as on SIGTERM once that parent is
        /// gone (it died without stopping its nodes), looked at once a second.
        static func stopWithParent() {
            guard let text = ProcessInfo.processInfo.environment[ServeProcess.parentVariable], let parent = pid_t(text)
            else { return }
            guard getppid() == parent else {
                FileHandle.standardError.write(Data("shoal: the process that started this node is gone; stopped\n".utf8))
                Foundation.exit(1)
            }
            Task.detached {
                while getppid() == parent {
                    try? await Task.sleep(for: .seconds(1))
                }
                kill(getpid(), SIGTERM)
            }
        }

        func run() async throws {
            // A reader asks for a fresh status with SIGUSR1 (see ``ServeReporter``): never the signal's default
            // action (ending the process), even before the reporter listens for it.
            signal(SIGUSR1, SIG_IGN)
            Self.stopWithParent()
            guard let address = PeerAddress(parsing: listen) else {
                throw ShoalError(code: .invalidArgument, message: "--listen wants HOST:PORT, got \"\(listen)\"")
            }
            let metricsAddress = try metrics.map { text throws(ShoalError) in
                guard let parsed = PeerAddress(parsing: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--metrics wants HOST:PORT, got \"\(text)\"")
                }
                return parsed
            }
            let dashboardAddress = try dashboardOptions.address(
                exposing: "the page shows the node's peers, tables and conflicting values"
            )
            try database.requireExisting()
            let lock = try ServeLock.acquire(database: database.db)
            defer { withExtendedLifetime(lock) {} }
            var options = ShoalNodeOptions(database: database.db)
            options.listen = address
            options.name = name
            options.roundIntervalMilliseconds = roundInterval
            options.compactionIntervalMilliseconds = compactionInterval
            options.collectDeletes = collectDeletes
            if let gcHorizon, gcHorizon.milliseconds < HorizonDuration.minimumMilliseconds {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--gc-horizon must be at least 2m: what members hold is passed on about once a minute, "
                        + "so a member that is only reached through others may look silent for that long"
                )
            }
            options.collectionHorizonMilliseconds = gcHorizonUncheckedMs ?? gcHorizon?.milliseconds ?? 0
            options.mdns = !noMdns
            options.rememberPeers = !noRemembered
            options.peers = try peers.map { text in
                guard let peer = PeerAddress(parsing: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--peer wants HOST:PORT, got \"\(text)\"")
                }
                return peer
            }
            options.relay = try relayOptions()
            options.compression = !noCompression
            options.compressesLoopback = compressLoopback
            options.schemaChanges = schemaChanges.following
            if insecurePlaintext {
                options.insecurePlaintextCluster = cluster ?? "default"
                log("WARNING: --insecure-plaintext: peer links are neither authenticated nor encrypted; anyone who can reach \(listen) can read and write this database")
            } else if cluster != nil {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--cluster goes with --insecure-plaintext only: with TLS the cluster is the one in the node key (shoal invite / shoal join)"
                )
            }
            // The registry first: the node and the relay link make their metrics' handles as they start.
            let metricsEndpoint = metricsAddress.map { address in
                MetricsEndpoint(
                    host: address.host,
                    port: address.port,
                    registry: PrometheusMetrics.bootstrap(),
                    logger: Logger(label: "shoal.metrics")
                ) { port in
                    // One unbuffered write, like `listening on`, so a script reading the pipe sees it at once.
                    let bound = PeerAddress(host: address.host, port: port)
                    FileHandle.standardOutput.write(Data("metrics listening on \(bound)\n".utf8))
                }
            }
            let node = try await ShoalNode(options: options)
            if node.madeKey, let keyFile = node.security?.keyFile {
                // A database made before nodes had keys, or by an app through the library: it got one now.
                log("made a node key (\(KeyFile.path(forDatabase: database.db))): node \(keyFile.identity.nodeID.short), a cluster of one; add devices with `shoal invite`")
            }
            let reporter = ServeReporter(
                node: node,
                database: database.db,
                listenHost: address.host,
                plaintextCluster: options.insecurePlaintextCluster
            )
            var secureChannel: (@Sendable (any Channel) throws -> Void)?
            if dashboardOptions.dashboardTls {
                let setup = try Self.dashboardTLS(node)
                secureChannel = { channel in try setup.addHandler(to: channel) }
            }
            let secure = secureChannel != nil
            let dashboardServices: [ServiceGroupConfiguration.ServiceConfiguration] = dashboardAddress.map { address in
                let hub = DashboardHub()
                let token = dashboardOptions.dashboardToken
                let server = DashboardServer(
                    host: address.host,
                    port: address.port,
                    hub: hub,
                    token: token,
                    secureChannel: secureChannel,
                    logger: Logger(label: "shoal.dashboard"),
                    onListening: { port in
                        let url = DashboardServer.url(host: address.host, port: port, token: token, secure: secure)
                        FileHandle.standardOutput.write(Data("dashboard: \(url)\n".utf8))
                    }
                )
                let feed = ServeDashboardFeed(
                    node: node,
                    hub: hub,
                    givenName: name,
                    database: database.db
                )
                return [.init(service: server), .init(service: feed)]
            } ?? []
            var serviceList: [ServiceGroupConfiguration.ServiceConfiguration] = [
                .init(service: node), .init(service: reporter),
            ]
            if let metricsEndpoint { serviceList.append(.init(service: metricsEndpoint)) }
            serviceList += dashboardServices
            if let applyLog { serviceList.append(.init(service: ApplyLog(node: node, path: applyLog))) }
            // SIGINT and SIGTERM shut the node down gracefully: connections close, the database is left clean.
            let services = ServiceGroup(
                configuration: ServiceGroupConfiguration(
                    services: serviceList,
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: Logger(label: "shoal.serve")
                )
            )
            do {
                try await services.run()
            } catch let error as ShoalError {
                throw error
            } catch let error as DashboardServerError {
                throw ShoalError(code: .invalidArgument, message: "--dashboard: \(error)")
            } catch let error as MetricsEndpointError {
                throw ShoalError(code: .invalidArgument, message: "--metrics: \(Output.failure(error.underlying, while: "could not listen on \(error.host):\(error.port)"))")
            } catch {
                // The listening socket is bound first: a failure before the node said where it listens is that.
                throw ShoalError(
                    code: .invalidArgument,
                    message: reporter.listened
                        ? "the node stopped: \(Output.failure(error, while: nil))"
                        : "could not start listening on \(listen): \(Output.failure(error, while: nil))"
                )
            }
            log("stopped")
        }

        /// HTTPS for the dashboard with the node's own TLS identity, admitting members' certificates only.
        private static func dashboardTLS(_ node: ShoalNode) throws(ShoalError) -> MemberTLSServerSetup {
            guard let security = node.security else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--dashboard-tls needs the node's TLS identity: not with --insecure-plaintext (use --dashboard-token)"
                )
            }
            return try MemberTLSServerSetup(
                identity: security.keyFile.identity,
                name: security.name,
                siteID: security.siteID,
                trust: security.trust
            )
        }

        /// The relay `--relay` asks for, if any.
        private func relayOptions() throws -> ShoalNodeOptions.Relay? {
            guard let url = relay.first else {
                guard relayToken == nil, relayTokenFile == nil, relayCa == nil else {
                    throw ShoalError(code: .invalidArgument, message: "--relay-token, --relay-token-file and --relay-ca go with --relay URL")
                }
                return nil
            }
            if insecurePlaintext {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--relay needs the cluster's secret to seal change sets: run without --insecure-plaintext"
                )
            }
            var token = relayToken ?? ""
            if let relayTokenFile {
                guard relayToken == nil else {
                    throw ShoalError(code: .invalidArgument, message: "give --relay-token or --relay-token-file, not both")
                }
                guard let text = try? String(contentsOfFile: relayTokenFile, encoding: .utf8) else {
                    throw ShoalError(code: .invalidArgument, message: "cannot read the relay token file \(relayTokenFile)")
                }
                token = text.trimmingCharacters(in: .whitespacesAndNewlines)
            }
            if let relayCa, !FileManager.default.isReadableFile(atPath: relayCa) {
                throw ShoalError(code: .invalidArgument, message: "cannot read the relay CA file \(relayCa)")
            }
            var options = ShoalNodeOptions.Relay(url: url, token: token)
            options.otherURLs = Array(relay.dropFirst())
            options.caCertificatePath = relayCa
            options.snapshotMinimumBytes = relaySnapshotBytes
            return options
        }

        private func log(_ line: String) {
            FileHandle.standardError.write(Data("shoal: \(line)\n".utf8))
        }
    }
}

/// `shoal serve --schema-changes`: how the node follows its peers' schema changes.
/// A horizon given as a number and a unit: `ms`, `s`, `m`, `h` or `d` (`90s`, `30m`, `7d`).
struct HorizonDuration: ExpressibleByArgument, Hashable {
    var milliseconds: UInt64
    /// The shortest horizon taken: twice the interval at which member reports are passed on.
    static let minimumMilliseconds: UInt64 = 120_000

    init?(argument: String) {
        let units: [(String, UInt64)] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
        guard let (unit, scale) = units.first(where: { argument.hasSuffix($0.0) }),
            let count = UInt64(argument.dropLast(unit.count)), count > 0
        else { return nil }
        let (product, overflow) = count.multipliedReportingOverflow(by: scale)
        guard !overflow else { return nil }
        milliseconds = product
    }
}

enum SchemaChangesMode: String, ExpressibleByArgument, CaseIterable {
    case automatic
    case manual

    /// The store's setting it stands for.
    var following: SchemaChangeFollowing {
        switch self {
        case .automatic: .apply
        case .manual: .manual
        }
    }
}

/// One `shoal serve` per database: an exclusive `flock` on the database file itself, so a second node is refused
/// whatever name it reaches the file by (a symbolic or hard link), released by the kernel when the process ends
/// however it ends (so a crashed node never leaves a stale lock). A side file beside the file's real path holds
/// the owner's pid, to name it.
final class ServeLock {
    private let descriptor: Int32

    private init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    deinit {
        // The side file stays (removing it would race a starting node). The database file's descriptor is not
        // closed: the kernel releases its lock when the process ends.
        if descriptor >= 0 { close(descriptor) }
    }

    /// Takes the lock of `database`, or says which process holds it.
    static func acquire(database: String) throws(ShoalError) -> ServeLock {
        // The database file's own lock. flock and SQLite's fcntl locks do not meet on Linux; the descriptor is never
        // closed while the process runs, since closing any descriptor of the file would drop SQLite's fcntl locks.
        let file = open(database, O_RDONLY | O_CLOEXEC)
        guard file >= 0 else {
            throw ShoalError(
                code: .databaseInUse,
                message: "cannot open \(database) to lock it: \(String(cString: strerror(errno)))"
            )
        }
        let fileLocked = flock(file, LOCK_EX | LOCK_NB) == 0
        let fileLockError = errno
        let real = realpath(database, nil).map { pointer in
            defer { free(pointer) }
            return String(cString: pointer)
        } ?? database
        let path = real + ".shoal-serve.lock"
        guard fileLocked else {
            // Left open on purpose (see above); the process is about to report the error and end.
            let holder = (try? String(contentsOfFile: path, encoding: .utf8))?
                .trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
            guard fileLockError == EWOULDBLOCK else {
                throw ShoalError(
                    code: .databaseInUse,
                    message: "cannot lock \(database): \(String(cString: strerror(fileLockError)))"
                )
            }
            throw ShoalError(
                code: .databaseInUse,
                message: "another shoal serve\(holder.isEmpty ? "" : " (pid \(holder))") already runs on \(database)"
                    + "\(real == database ? "" : " (\(real))"); stop it first (one node per database file)"
            )
        }
        // The side file only names the owner for the message above: the database file's lock is the lock.
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        if descriptor >= 0 {
            let pid = Array("\(getpid())\n".utf8)
            _ = ftruncate(descriptor, 0)
            _ = pwrite(descriptor, pid, pid.count, 0)
        }
        return ServeLock(descriptor: descriptor)
    }
}

/// The running node's status file: written until removed, never after (a write under way when the node stops
/// would otherwise bring back a file saying the node runs).
final class StatusFile: Sendable {
    private let path: String
    private let isOpen = Mutex(true)

    init(path: String) {
        self.path = path
    }

    /// Writes `status`, unless the file was removed.
    func write(_ status: LiveStatus) {
        isOpen.withLock { isOpen in
            if isOpen { try? status.write(to: path) }
        }
    }

    /// Removes the file; later writes do nothing.
    func remove() {
        isOpen.withLock { isOpen in
            isOpen = false
            try? FileManager.default.removeItem(atPath: path)
        }
    }
}

