import Foundation
import ShoalFuzzing
import Testing

/// Replays the committed fuzzing corpus (`Tools/Fuzz/Corpus/<target>/`: the seeds and every input a campaign kept,
/// crashes included) through the harnesses, through the same entry point the libFuzzer binary calls, so that an input
/// that once crashed a target fails the ordinary test run too. The test command runs only this replay; the
/// coverage-guided campaigns (libFuzzer with AddressSanitizer, a release build of their own) are `Tools/fuzz.sh`.
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

    /// Every target has its corpus folder and `Tools/fuzz.sh` knows it; no folder is left without a target.
    @Test func everyTargetHasACorpusAndIsInTheFuzzScript() throws {
        let targets = ShoalFuzzing.Target.allCases.map(\.rawValue).sorted()
        let folders = try FileManager.default.contentsOfDirectory(atPath: Self.corpus.path).sorted()
        #expect(folders == targets)
        let tools = Self.corpus.deletingLastPathComponent().deletingLastPathComponent()
        let script = try String(contentsOf: tools.appendingPathComponent("fuzz.sh"), encoding: .utf8)
        let line = script.split(separator: "\n").first { $0.hasPrefix("targets=(") }
        let listed = line.map { $0.dropFirst("targets=(".count).dropLast().split(separator: " ").map(String.init) }
        #expect(listed?.sorted() == targets, "\(line ?? "no targets=( line")")
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
    /// (what `Tools/fuzz.sh --seed` runs) writes it into `Tools/Fuzz/Corpus`, keeping the files of inputs found by
    /// fuzzing; in the ordinary run it writes into a temporary folder, which it then removes.
    @Test func writeSeeds() throws {
        let intoTheRepository = ProcessInfo.processInfo.environment["SHOAL_WRITE_FUZZ_CORPUS"] == "1"
        let root =
            intoTheRepository
            ? Self.corpus
            : FileManager.default.temporaryDirectory.appendingPathComponent("shoal-fuzz-seeds-\(getpid())")
        defer { if !intoTheRepository { try? FileManager.default.removeItem(at: root) } }
        for (target, seeds) in try ShoalFuzzing.seedCorpus() {
            let folder = root.appendingPathComponent(target.rawValue)
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            for seed in seeds {
                try Data(seed.bytes).write(to: folder.appendingPathComponent("seed-\(seed.name)"))
            }
        }
    }
}
