// swift-tools-version: 6.1
import PackageDescription

let strict: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "Shoal",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Shoal", targets: ["Shoal"]),
        // GRDB interop: a GRDB ValueObservation on the node's file sees every change Shoal applies. The node library
        // itself does not depend on GRDB.
        .library(name: "ShoalGRDB", targets: ["ShoalGRDB"]),
        .executable(name: "shoal", targets: ["shoal"]),
        .executable(name: "shoal-bench", targets: ["ShoalBench"]),
        .executable(name: "shoal-chaos", targets: ["ShoalChaos"]),
        // The fuzzing harnesses, for the libFuzzer binary Tools/fuzz.sh builds (Tools/Fuzz/Runner).
        .library(name: "ShoalFuzzing", targets: ["ShoalFuzzing"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1", traits: []),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.3"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
    ],
    targets: [
        // Pure logic, no I/O: identities, clocks, version vectors, change records, merge rules, digest.
        .target(
            name: "ShoalCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        // The system SQLite, with the pre-update hook declarations exposed.
        .systemLibrary(
            name: "CSQLite",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        // The system zlib (deflate), for compressing change batches on the wire and before sealing for the relay.
        .systemLibrary(
            name: "CZlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        // glibc's malloc.h (mallopt), for the relay process's allocator settings.
        .systemLibrary(name: "CMalloc"),
        // Avahi's dns_sd.h (Bonjour-compatible API).
        .systemLibrary(
            name: "CDNSSD",
            providers: [.apt(["libavahi-compat-libdnssd-dev"])]
        ),
        // mDNS/DNS-SD: register, browse and resolve `_shoal._tcp`; a peer source for the node.
        .target(
            name: "ShoalDiscovery",
            dependencies: [
                "ShoalCore", "ShoalProtocol", "ShoalTransport", "CDNSSD",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // The one SQLite wrapper (a connection, its prepared statements, typed errors) the node's store and the relay's
        // embedded storage share.
        .target(
            name: "ShoalSQLite",
            dependencies: ["ShoalCore", "CSQLite"],
            swiftSettings: strict
        ),
        // SQLite: metadata tables, change capture, apply, delta queries, digest.
        .target(
            name: "ShoalStore",
            dependencies: [
                "ShoalCore", "ShoalSQLite", "CSQLite",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // The wire protocol without I/O: message types, their binary codec, and the anti-entropy session.
        .target(
            name: "ShoalProtocol",
            dependencies: ["ShoalCore", "CZlib"],
            swiftSettings: strict
        ),
        // SwiftNIO TCP server and client driving sync sessions.
        .target(
            name: "ShoalTransport",
            dependencies: [
                "ShoalCore", "ShoalStore", "ShoalProtocol",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // Who a peer is: node identity (P-256 key, self-signed certificate), mutual TLS 1.3 with a custom check
        // against the roster, the signed roster itself, invite codes and the join exchange (CPace).
        .target(
            name: "ShoalSecurity",
            dependencies: [
                "ShoalCore", "ShoalStore", "ShoalProtocol", "ShoalTransport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // What the relay and the nodes say to each other: sealed change-set envelopes and the API's JSON bodies.
        .target(
            name: "ShoalRelayProtocol",
            dependencies: ["ShoalCore", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strict
        ),
        // The relay server (Hummingbird 2) and its storage (embedded SQLite or PostgreSQL); never linked into the node
        // library.
        .target(
            name: "ShoalRelay",
            dependencies: [
                "ShoalCore", "ShoalRelayProtocol", "ShoalSQLite", "CSQLite",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict
        ),
        // The node's side of the relay: seals, uploads and pulls change sets, with backoff, beside the LAN.
        .target(
            name: "ShoalRelayClient",
            dependencies: [
                "ShoalCore", "ShoalRelayProtocol", "ShoalProtocol", "ShoalStore", "ShoalTransport", "ShoalSecurity",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // The public facade.
        .target(
            name: "Shoal",
            dependencies: [
                "ShoalCore", "ShoalStore", "ShoalProtocol", "ShoalTransport", "ShoalSecurity", "ShoalDiscovery",
                "ShoalRelayClient", "ShoalRelayProtocol",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "ShoalGRDB",
            dependencies: ["Shoal", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        // The processes' side of metrics: the Prometheus registry they bootstrap swift-metrics with, and a small
        // HTTP/1 endpoint (NIO only, no Hummingbird) that serves it to Prometheus.
        .target(
            name: "ShoalMetricsEndpoint",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // The live web dashboard (`shoal demo --dashboard`, `shoal serve --dashboard`): its page, its Server-Sent Events
        // and its controls, on a small HTTP/1 server (NIO only, no Hummingbird). The node library never links it.
        .target(
            name: "ShoalDashboard",
            dependencies: [
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // Child processes of `shoal` (serve, relay serve) and a scratch PostgreSQL database: what the CLI's demo, the
        // chaos harness, the benchmarks and the tests start. Foundation only.
        .target(
            name: "ShoalProcesses",
            swiftSettings: strict
        ),
        // The CLI: parses arguments and calls Shoal.
        .executableTarget(
            name: "shoal",
            dependencies: [
                "Shoal", "ShoalProcesses", "ShoalRelay", "ShoalMetricsEndpoint", "ShoalDashboard",
                .target(name: "CMalloc", condition: .when(platforms: [.linux])),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                // The demo dashboard's links, which it cuts and mends (a partition).
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "ShoalBench",
            dependencies: [
                "Shoal", "ShoalStore", "ShoalProtocol", "ShoalCore", "ShoalProcesses", "CSQLite",
                // The JSON documents the compression tests measure, for the text catch-up.
                "ShoalTestSupport",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Tools/ShoalBench",
            swiftSettings: strict
        ),
        // The README's embedding example, built and run by EmbeddingExampleTests.
        .executableTarget(
            name: "EmbeddingExample",
            dependencies: [
                "Shoal",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Tools/EmbeddingExample",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "ShoalChaos",
            dependencies: [
                "Shoal", "ShoalProcesses", "CSQLite",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Tools/ShoalChaos",
            swiftSettings: strict
        ),
        // What the test targets share: locating the built `shoal`, temporary directories, running a process and
        // capturing its output, waiting on a condition with a deadline. Tests run `shoal` as a process; no test target
        // depends on (and links in) the executable: `swift build --build-tests` and `swift test` build it beside them.
        .target(
            name: "ShoalTestSupport",
            path: "Tests/ShoalTestSupport",
            swiftSettings: strict
        ),
        // Fuzzing harnesses (Tools/fuzz.sh): plain library code, so the corpus replays in the ordinary tests.
        .target(
            name: "ShoalFuzzing",
            dependencies: [
                "ShoalCore", "ShoalProtocol", "ShoalStore", "ShoalTransport", "ShoalSecurity",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            path: "Tools/Fuzz/ShoalFuzzing",
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalFuzzingTests",
            dependencies: ["ShoalFuzzing", "ShoalCore", "ShoalProtocol", "ShoalStore"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalCoreTests",
            dependencies: ["ShoalCore", "ShoalTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalProtocolTests",
            dependencies: ["ShoalProtocol", "ShoalCore", "ShoalTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalTransportTests",
            dependencies: [
                "ShoalTransport", "ShoalStore", "ShoalProtocol", "ShoalCore", "ShoalDiscovery", "ShoalProcesses",
                "ShoalTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOTestUtils", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalGRDBTests",
            dependencies: ["ShoalGRDB", "ShoalTestSupport", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalHostsTests",
            dependencies: ["ShoalTestSupport"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalDiscoveryTests",
            dependencies: [
                "ShoalDiscovery", "ShoalCore",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalSecurityTests",
            dependencies: [
                "ShoalSecurity", "ShoalTransport", "ShoalStore", "ShoalProtocol", "ShoalCore", "ShoalTestSupport",
                // The dashboard over HTTPS with a node's identity (DashboardTLSTests).
                "ShoalDashboard", .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalRelayTests",
            dependencies: [
                "ShoalRelay", "ShoalRelayClient", "ShoalRelayProtocol", "ShoalCore", "ShoalProtocol", "ShoalStore",
                "ShoalSecurity", "ShoalTestSupport", "Shoal",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalDashboardTests",
            dependencies: [
                "ShoalDashboard", "ShoalTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ShoalStoreTests",
            dependencies: [
                "ShoalStore", "ShoalCore", "ShoalProtocol", "ShoalTestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: strict
        ),
    ]
)
