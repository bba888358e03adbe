// swift-tools-version: 6.1
// The libFuzzer binary: built only by Tools/fuzz.sh, with `--sanitize=fuzzer` (and address), never by the root
// package's build. The harnesses themselves are the root package's `ShoalFuzzing` library.
import PackageDescription

let package = Package(
    name: "ShoalFuzzRunner",
    platforms: [.macOS(.v15)],
    dependencies: [.package(name: "Shoal", path: "../../..")],
    targets: [
        .executableTarget(
            name: "shoal-fuzz",
            dependencies: [.product(name: "ShoalFuzzing", package: "Shoal")],
            path: "Sources/ShoalFuzzRunner",
            swiftSettings: [.swiftLanguageMode(.v6), .unsafeFlags(["-parse-as-library"])]
        )
    ]
)
