import ArgumentParser
import Foundation
#if canImport(CMalloc)
import CMalloc
#endif
import Logging
import ServiceLifecycle
import Shoal
import ShoalMetricsEndpoint
import ShoalRelay

extension ShoalCommand {
    struct Relay: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "relay",
            abstract: "Run a relay: a blind store-and-forward endpoint nodes sync through when they cannot reach each other.",
            discussion: """
                The relay stores change sets sealed with each cluster's key: it sees clusters, sites, sequence \
                numbers, sizes and times, never tables, keys or values. Nodes use it with \
                `shoal serve --relay URL --relay-token TOKEN`.
                """,
            subcommands: [Serve.self, Token.self]
        )
    }
}

/// Where a relay keeps its data: an embedded SQLite database in a directory, or PostgreSQL.
struct RelayStorageOptions: ParsableArguments {
    @Option(help: "Directory of the relay's embedded SQLite database (made when missing).") var data: String?
    @Option(
        help: ArgumentHelp(
            "PostgreSQL instead of --data: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require].",
            discussion: "Without a password in the URL, PGPASSWORD is used. Any number of relays may share one database."
        )
    )
    var postgres: String?

    func validate() throws {
        guard (data == nil) != (postgres == nil) else {
            throw ValidationError("give the relay's storage: --data DIR (embedded SQLite) or --postgres URL, one of them")
        }
    }

    /// Opens the relay's storage; `existing`: an SQLite database must be there already (listing or revoking tokens of
    /// a mistyped directory is an error, not a new empty relay).
    func open(existing: Bool = false, logger: Logger = Logger(label: "shoal.relay")) async throws -> any RelayStorage {
        if let postgres {
            return try await PostgresRelayStorage.open(try PostgresLocation(url: postgres), logger: logger)
        }
        let data = data ?? ""
        if existing, !FileManager.default.fileExists(atPath: data + "/relay.sqlite") {
            throw ShoalError(
                code: .missingDatabase,
                message: "there is no relay database in \(data); check --data (`shoal relay serve` or `token create` makes one)"
            )
        }
        return try SQLiteRelayStorage(directory: data)
    }
}

extension ShoalCommand.Relay {
    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "serve",
            abstract: "Serve the relay until stopped (SIGINT or SIGTERM).",
            discussion: """
                Prints `relay listening on HOST:PORT` once bound (port 0 picks a free port). HTTPS with --tls-cert \
                and --tls-key; plain HTTP only on a loopback address, for tests and demos. --metrics serves \
                Prometheus metrics at /metrics on the same address, without a token: keep that path from the public \
                (a reverse proxy or firewall), since it names the clusters the relay serves and how much each stores.
                """
        )

        @OptionGroup var storage: RelayStorageOptions
        @Option(help: "Address to listen on, HOST:PORT.") var listen = "127.0.0.1:8443"
        @Option(help: "PEM certificate chain for HTTPS.") var tlsCert: String?
        @Option(help: "PEM private key for HTTPS.") var tlsKey: String?
        @Option(help: "Largest request body accepted, in bytes (413 beyond).")
        var maxRequestBytes = RelayAPI.defaultMaximumRequestBytes
        @Option(help: "Largest change set accepted, in bytes (413 beyond).")
        var maxChangesetBytes = RelayAPI.defaultMaximumEnvelopeBytes
        @Option(help: "Requests a second each token may make on average (429 beyond; bursts of twice as many).")
        var rateLimit = 1_000
        @Option(help: "Open connections at most (kept under the limit of open files, raised to its hard limit).")
        var maxConnections = 10_000
        @Option(help: "Bytes of pull answers held at once across all connections (a pull beyond gets 503).")
        var maxPagesBytes = 256 * 1024 * 1024
        @Option(help: "Hours change sets a snapshot covers are kept before they go (nodes older than that get the snapshot).")
        var retentionHours = 168.0
        @Option(help: "Bytes of change sets a snapshot covers kept per cluster at most (the oldest go first).")
        var retentionBytes: Int64 = 256 * 1024 * 1024
        @Flag(help: "Serve Prometheus metrics at /metrics, without a token (keep that path from the public).")
        var metrics = false

        func validate() throws {
            guard maxRequestBytes >= 65_536 else { throw ValidationError("--max-request-bytes must be at least 65536") }
            guard (16_384...maxRequestBytes).contains(maxChangesetBytes) else {
                throw ValidationError("--max-changeset-bytes must be at least 16384 and at most --max-request-bytes")
            }
            guard rateLimit >= 1 else { throw ValidationError("--rate-limit must be at least 1 request a second") }
            guard maxConnections >= 16 else { throw ValidationError("--max-connections must be at least 16") }
            guard maxPagesBytes >= 16 * 1024 * 1024 else {
                throw ValidationError("--max-pages-bytes must be at least 16777216 (the largest page)")
            }
            guard retentionHours >= 0, retentionHours <= 100_000 else { throw ValidationError("--retention-hours must be 0 to 100000") }
            guard retentionBytes >= 0 else { throw ValidationError("--retention-bytes must be 0 or more") }
        }

        func run() async throws {
            #if canImport(CMalloc)
            // Buffers of 128 KiB and more (pages, change sets) are mapped and unmapped, so what a page freed goes back
            // to the system: glibc's own threshold climbs to the sizes freed, and freed pages then stay resident.
            mallopt(M_MMAP_THRESHOLD, 128 * 1024)
            #endif
            guard let address = PeerAddress(parsing: listen) else {
                throw ShoalError(code: .invalidArgument, message: "--listen wants HOST:PORT, got \"\(listen)\"")
            }
            guard (tlsCert == nil) == (tlsKey == nil) else {
                throw ShoalError(code: .invalidArgument, message: "--tls-cert and --tls-key go together")
            }
            var logger = Logger(label: "shoal.relay")
            logger.logLevel = .info
            var configuration = RelayServerConfiguration(host: address.host, port: address.port, logger: logger)
            // Before the server exists: it makes its metrics' handles with it.
            if metrics { configuration.metrics = PrometheusMetrics.bootstrap() }
            configuration.tlsCertificatePath = tlsCert
            configuration.tlsKeyPath = tlsKey
            configuration.maximumRequestBytes = maxRequestBytes
            configuration.maximumEnvelopeBytes = maxChangesetBytes
            configuration.requestsPerSecond = rateLimit
            configuration.maximumConnections = maxConnections
            configuration.maximumPagesBytes = maxPagesBytes
            configuration.retention = RelayRetention(
                maximumAgeMilliseconds: Int64(retentionHours * 3_600_000),
                maximumBytes: retentionBytes
            )
            let store = try await storage.open(logger: logger)
            let server = RelayServer(configuration: configuration, storage: store)
            let scheme = tlsCert == nil ? "http" : "https"
            let host = address.host
            let service = RelayService(server: server) { port in
                FileHandle.standardOutput.write(Data("relay listening on \(scheme)://\(PeerAddress(host: host, port: port))\n".utf8))
            }
            let group = ServiceGroup(
                configuration: ServiceGroupConfiguration(
                    services: [.init(service: service)],
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: logger
                )
            )
            do {
                try await group.run()
            } catch {
                await store.close()
                throw error
            }
            await store.close()
        }
    }

    struct Token: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "token",
            abstract: "Make, list and revoke the relay's bearer tokens (one cluster each).",
            subcommands: [Create.self, List.self, Revoke.self]
        )
    }
}

/// The relay server as a service of a group.
struct RelayService: Service {
    let server: RelayServer
    let onListening: @Sendable (Int) async -> Void

    func run() async throws {
        try await server.run(onListening: onListening)
    }
}

extension ShoalCommand.Relay.Token {
    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "create",
            abstract: "Make a token for one cluster and print it (last line). Only its hash is kept: save it now.",
            discussion: "The cluster id is the one `shoal status` shows (`cluster_id` in `shoal status --json`)."
        )
        @OptionGroup var storage: RelayStorageOptions
        @Option(help: "The cluster the token reaches (and no other).") var cluster: String
        @Option(help: "A name for the token, shown by `token list`.") var label = ""

        func run() async throws {
            let trimmed = cluster.trimmingCharacters(in: .whitespaces)
            guard (1...RelayEnvelope.maximumClusterBytes).contains(trimmed.utf8.count),
                trimmed.unicodeScalars.allSatisfy({ $0.isASCII && !$0.properties.isWhitespace && $0.value >= 0x21 })
            else {
                throw ShoalError(
                    code: .invalidArgument,
                    message: "--cluster wants a cluster id (1 to \(RelayEnvelope.maximumClusterBytes) printable characters), got \"\(cluster.prefix(80))\""
                )
            }
            let store = try await storage.open()
            let token = try await store.createToken(cluster: trimmed, label: label)
            await store.close()
            FileHandle.standardError.write(Data("shoal: a token for cluster \(trimmed); it is shown once\n".utf8))
            print(token)
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list",
            abstract: "List tokens: the SHA-256 of each (what `token revoke` takes), its cluster, state and label."
        )
        @OptionGroup var storage: RelayStorageOptions

        func run() async throws {
            let store = try await storage.open(existing: true)
            let tokens = try await store.tokens()
            await store.close()
            for token in tokens {
                let state =
                    token.revoked == nil
                    ? "active" : token.rotatedAtEpoch.map { "retired (key epoch \($0))" } ?? "revoked"
                print("\(token.hash)  \(token.cluster)  \(state)  \(token.label)")
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "revoke",
            abstract: "Revoke a token (the token, or its hash as `token list` shows it in full), or every token of a cluster."
        )
        @OptionGroup var storage: RelayStorageOptions
        @Argument(help: "The token or its hash; with --cluster, the cluster id.") var token: String
        @Flag(help: "Revoke every token of the cluster named.") var cluster = false

        func run() async throws {
            let store = try await storage.open(existing: true)
            let count = try await store.revokeTokens(matching: token, wholeCluster: cluster)
            await store.close()
            guard count > 0 else {
                throw ShoalError(code: .invalidArgument, message: "no active token matches")
            }
            print("revoked \(count) token\(count == 1 ? "" : "s")")
        }
    }
}
