import ArgumentParser
import Dispatch
import Foundation
import Logging
import ServiceLifecycle
import Shoal
import ShoalMetricsEndpoint
import Synchronization

extension ShoalCommand {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
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
                HOST:PORT` once bound.
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

        func run() async throws {
            guard let address = PeerAddress(parsing: listen) else {
                throw ShoalError(code: .invalidArgument, message: "--listen wants HOST:PORT, got \"\(listen)\"")
            }
            let metricsAddress = try metrics.map { text throws(ShoalError) in
                guard let parsed = PeerAddress(parsing: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--metrics wants HOST:PORT, got \"\(text)\"")
                }
                return parsed
            }
            try database.requireExisting()
            let lock = try ServeLock.acquire(database: database.db)
            defer { withExtendedLifetime(lock) {} }
            var configuration = NodeConfiguration(databasePath: database.db)
            configuration.listenHost = address.host
            configuration.listenPort = address.port
            configuration.nodeName = name
            configuration.roundIntervalMilliseconds = roundInterval
            configuration.compactionIntervalMilliseconds = compactionInterval
            configuration.mdns = !noMdns
            configuration.rememberPeers = !noRemembered
            configuration.staticPeers = try peers.map { text in
                guard let peer = PeerAddress(parsing: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--peer wants HOST:PORT, got \"\(text)\"")
                }
                return peer
            }
            var security: NodeSecurity?
            if insecurePlaintext {
                configuration.insecurePlaintext = true
                configuration.clusterID = cluster ?? "default"
                log("WARNING: --insecure-plaintext: peer links are neither authenticated nor encrypted; anyone who can reach \(listen) can read and write this database")
            } else {
                guard cluster == nil else {
                    throw ShoalError(
                        code: .invalidArgument,
                        message: "--cluster goes with --insecure-plaintext only: with TLS the cluster is the one in the node key (shoal invite / shoal join)"
                    )
                }
                // A connection of its own for the set-up only, closed before the node opens its store.
                var store: Store? = try database.open()
                defer { store = nil }
                if !KeyFile.exists(forDatabase: database.db) {
                    // A database made before nodes had keys, or by an app through the library: it gets one now.
                    let keyFile = try Membership.initialize(
                        databasePath: database.db,
                        store: store!,
                        now: SystemWallClock().nowMilliseconds()
                    )
                    log("made a node key (\(KeyFile.path(forDatabase: database.db))): node \(keyFile.identity.nodeID.short), a cluster of one; add devices with `shoal invite`")
                }
                let secured = try NodeSecurity(databasePath: database.db, store: store!, name: name)
                store = nil
                try secured.configure(&configuration)
                security = secured
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
            let node = try await SyncNode(configuration: configuration)
            security?.attach(node)
            let relayLink = try makeRelayLink(node: node, security: security)
            let secured = security
            let rosterWatcher = Task { await secured?.watchRoster() }
            defer { rosterWatcher.cancel() }
            // SIGINT and SIGTERM shut the node down gracefully: connections close, the database is left clean.
            let services = ServiceGroup(
                configuration: ServiceGroupConfiguration(
                    services: [.init(service: node)] + (relayLink.map { [.init(service: $0)] } ?? [])
                        + (metricsEndpoint.map { [.init(service: $0)] } ?? []),
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: Logger(label: "shoal.serve")
                )
            )
            let running = Task { try await services.run() }
            let statusFile = StatusFile(path: LiveStatus.path(forDatabase: database.db))
            let plaintextCluster = insecurePlaintext ? configuration.clusterID : nil
            let statusWriter = Task {
                while !Task.isCancelled {
                    var status = LiveStatus(
                        node: node.siteID,
                        pendingLocalChanges: await node.pendingLocalChanges(),
                        digest: try? await node.refreshDigest(waiting: false),
                        peers: await node.peerStatuses(),
                        unreached: await node.unreachedPeers()
                    )
                    status.clockAheadOfPeersMs = await node.clockAheadOfPeers()
                    status.security = security == nil ? "insecure-plaintext" : "tls"
                    status.cluster = plaintextCluster
                    status.relay = relayLink?.status
                    status.nodeID = security?.keyFile.identity.nodeID.description
                    status.pending = security?.trust.pendingDevices.map { device in
                        LiveStatus.PendingDevice(
                            node: device.nodeID.description,
                            name: device.name,
                            site: device.siteID?.hex,
                            address: device.address,
                            attempts: device.attempts,
                            lastSeenMs: device.lastSeenMilliseconds,
                            publicKey: Data(device.publicKeyDER).base64EncodedString()
                        )
                    }
                    statusFile.write(status)
                    try? await Task.sleep(for: .milliseconds(250))
                }
            }
            defer {
                statusWriter.cancel()
                statusFile.remove()
            }
            let relayReporter = Task {
                guard let relayLink else { return }
                for await event in relayLink.events {
                    switch event {
                    case .reachable: log("relay \(relayLink.status.url) reachable")
                    case .failed(let reason): log(reason)
                    case .unauthorized(let reason):
                        let hint = reason.contains("unknown token") || reason.contains("was revoked")
                            ? ": give the node a token of its cluster (shoal relay token create) and restart it" : ""
                        log(reason + hint)
                    case .applied(let changes): log("synced \(changes) changes from the relay")
                    case .uploaded: break
                    case .snapshotted: log("uploaded a snapshot to the relay")
                    case .epoch(let epoch, let rotatedHere):
                        log(
                            rotatedHere
                                ? "rotated the relay key to epoch \(epoch): removed nodes can no longer read what is sealed from now on, nor use the relay"
                                : "the relay key moved to epoch \(epoch) (another member rotated it after a removal)"
                        )
                    }
                }
            }
            defer { relayReporter.cancel() }
            let listened = ListeningFlag()
            let plaintextOption = insecurePlaintext ? " --insecure-plaintext --cluster \(configuration.clusterID)" : ""
            let reporter = Task {
                let terminal = isatty(STDERR_FILENO) != 0
                var lastProgressLine = Date.distantPast
                for await event in node.events {
                    switch event {
                    case .catchUpProgress(let peer, let changes, let remaining, let milliseconds):
                        let rate = milliseconds > 0 ? Double(changes) * 1000 / Double(milliseconds) : 0
                        let eta = rate > 0 ? " ETA \(Int((Double(remaining) / rate).rounded(.up))) s" : ""
                        let line =
                            "catching up from \(peer.hex.prefix(8)): \(changes) changes, \(Int(rate)) changes/s,"
                            + " about \(remaining) to go\(eta)"
                        if terminal {
                            FileHandle.standardError.write(Data("\r\u{1B}[2K\(line)".utf8))
                        } else if Date().timeIntervalSince(lastProgressLine) >= 5 {
                            lastProgressLine = Date()
                            log(line)
                        }
                    case .listening(let port):
                        listened.value.store(true, ordering: .relaxed)
                        // Written in one call, unbuffered, so a script reading the pipe sees it at once.
                        FileHandle.standardOutput.write(
                            Data("listening on \(PeerAddress(host: address.host, port: port))\n".utf8)
                        )
                    case .peerConnected(let site, let name, let peerAddress):
                        log("peer connected: \(name.printable()) \(site.hex.prefix(8)) at \(peerAddress)")
                    case .peerDisconnected(let site, let reason):
                        log("peer disconnected: \(site.hex.prefix(8)): \(reason)")
                    case .roundFinished(let peer, let applied) where applied > 0:
                        if terminal { FileHandle.standardError.write(Data("\r\u{1B}[2K".utf8)) }
                        log("synced \(applied) changes from \(peer.hex.prefix(8))")
                    case .connectionFailed(let peerAddress, let reason):
                        log("connection to \(peerAddress) failed: \(reason)")
                    case .inboundConnectionFailed(let peerAddress, let reason):
                        log("connection from \(peerAddress) failed: \(reason)")
                    case .roundFinished:
                        break
                    case .peerDiscovered(let site, let peerAddress):
                        log("found \(site.hex.prefix(8)) at \(peerAddress) by mDNS")
                    case .discoveryUnavailable(let reason):
                        log("mDNS discovery is off: \(reason).")
                    case .discoveryAvailable(let interface):
                        log("mDNS discovery is on (announced and browsing on \(interface ?? "every interface"))")
                    case .peerDiverged(let site, let name, let peerAddress, _):
                        let peer = "\(name.isEmpty ? "" : name.printable() + " ")\(site.hex.prefix(8))"
                        log(
                            "ERROR: diverged from \(peer): it holds the same changes as this node but different rows "
                                + "(different digests at the same version), and syncing between these two will not mend it; run `shoal "
                                + "verify --db \(database.db) --peer \(peerAddress ?? "HOST:PORT")"
                                + "\(plaintextOption)` to list the rows that differ"
                        )
                    case .peerConverged(let site, let name):
                        let peer = "\(name.isEmpty ? "" : name.printable() + " ")\(site.hex.prefix(8))"
                        log("converged again with \(peer): equal digests at the same version")
                    }
                }
            }
            do {
                try await running.value
            } catch is CancellationError {
                // Stopped by a signal.
            } catch let error as ShoalError {
                reporter.cancel()
                throw error
            } catch let error as MetricsEndpointError {
                reporter.cancel()
                throw ShoalError(code: .invalidArgument, message: "--metrics: \(Output.failure(error.underlying, while: "could not listen on \(error.host):\(error.port)"))")
            } catch {
                reporter.cancel()
                // The listening socket is bound first: a failure before the node said where it listens is that.
                let started = listened.value.load(ordering: .relaxed)
                throw ShoalError(
                    code: .invalidArgument,
                    message: started
                        ? "the node stopped: \(Output.failure(error, while: nil))"
                        : "could not start listening on \(listen): \(Output.failure(error, while: nil))"
                )
            }
            reporter.cancel()
            log("stopped")
        }

        /// The relay link `--relay` asks for, if any.
        private func makeRelayLink(node: SyncNode, security: NodeSecurity?) throws -> RelayLink? {
            guard let url = relay.first else {
                guard relayToken == nil, relayTokenFile == nil, relayCa == nil else {
                    throw ShoalError(code: .invalidArgument, message: "--relay-token, --relay-token-file and --relay-ca go with --relay URL")
                }
                return nil
            }
            guard let security else {
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
            var logger = Logger(label: "shoal.relay")
            logger.logLevel = .critical
            var configuration = RelayClientConfiguration(
                url: url,
                token: token,
                clusterID: security.keyFile.cluster.idHex,
                clusterSecret: security.keyFile.cluster.secret,
                logger: logger
            )
            configuration.identity = security.keyFile.identity
            let trust = security.trust
            configuration.roster = { trust.roster }
            configuration.keyringPath = RelayKeyring.path(forDatabase: database.db)
            configuration.caCertificatePath = relayCa
            configuration.otherURLs = Array(relay.dropFirst())
            configuration.snapshotMinimumBytes = relaySnapshotBytes
            return try RelayLink(node: node, configuration: configuration)
        }

        private func log(_ line: String) {
            FileHandle.standardError.write(Data("shoal: \(line)\n".utf8))
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

/// A flag set by one task and read by another.
final class ListeningFlag: Sendable {
    let value = Atomic<Bool>(false)
}
