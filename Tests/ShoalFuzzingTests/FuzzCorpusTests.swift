import Foundation
import ShoalFuzzing
import Testing

/// Replays the committed fuzzing corpus (`Tools/Fuzz/Corpus/<target>/`) through the harnesses, so that an input
/// that once crashed a target fails the ordinary test run too.
/// Serialized: the apply harness keeps one store per process, used by one thread at a time (as libFuzzer does).
@Suite(.serialized) struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Tools/Fuzz/Corpus")

    static func files(_ target: ShoalFuzzing.Target) throws -> [URL] {
        let folder = corpus.appendingPathComponent(target.rawValue)
        return try FileManager.default.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)
            .sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    @Test(arguments: ShoalFuzzing.Target.allCases)
    func replaysTheCorpus(_ target: ShoalFuzzing.Target) throws {
        let files = try Self.files(target)
        #expect(files.count >= 10, "the \(target.rawValue) corpus is missing")
        for file in files {
            let bytes = try Data(contentsOf: file)
            #expect(bytes.count < 64 * 1024, "\(file.lastPathComponent) is too large for the corpus")
            ShoalFuzzing.run(target, [UInt8](bytes))
        }
    }

    @Test func seedsReplayAndStaySmall() throws {
        for (target, seeds) in try ShoalFuzzing.seedCorpus() {
            for seed in seeds {
                #expect(seed.bytes.count < 64 * 1024, "\(target.rawValue)/\(seed.name)")
                ShoalFuzzing.run(target, seed.bytes)
            }
        }
    }

    /// Writes the seed corpus: `SHOAL_WRITE_FUZZ_CORPUS=1 swift test --filter FuzzCorpusTests/writeSeeds`
    /// (what `Tools/fuzz.sh --seed` runs). Files of inputs found by fuzzing are kept.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["SHOAL_WRITE_FUZZ_CORPUS"] == "1"))
    func writeSeeds() throws {
        for (target, seeds) in try ShoalFuzzing.seedCorpus() {
            let folder = Self.corpus.appendingPathComponent(target.rawValue)
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            for seed in seeds {
                try Data(seed.bytes).write(to: folder.appendingPathComponent("seed-\(seed.name)"))
            }
        }
    }
}
