import Foundation

/// A `shoal serve` child process, for `shoal demo`, the chaos harness, the benchmarks and the tests.
public struct ServeProcess: ChildProcess {
    /// The running `shoal serve`.
    public let process: Process
    /// The port it listens on.
    public let port: Int

    /// The `shoal` executable beside the running one.
    /// (`SHOAL_EXECUTABLE` when set: the `shoal` command sets it to itself, whatever its file is named.)
    public static func executable() -> URL {
        if let path = ProcessInfo.processInfo.environment[executableVariable], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return me.lastPathComponent == "shoal" ? me : me.deletingLastPathComponent().appendingPathComponent("shoal")
    }

    /// The environment variable naming the `shoal` executable children are started from.
    public static let executableVariable = "SHOAL_EXECUTABLE"
    /// The environment variable by which a child `shoal serve` learns its parent's pid: it stops (as on SIGTERM)
    /// when that parent is gone, so a demo, harness or test that dies leaves no node running.
    public static let parentVariable = "SHOAL_STOP_WITH_PARENT"

    /// Starts `shoal serve` on `database` and returns once it prints the port it listens on. Its log is
    /// appended to `database.log`.
    public static func start(database: String, name: String, peers: [Int], extra: [String] = []) throws -> ServeProcess
    {
        let (process, said) = try launch(
            ["serve", "--db", database, "--name", name, "--listen", "127.0.0.1:0"] + extra
                + peers.flatMap { ["--peer", "127.0.0.1:\($0)"] },
            log: database + ".log"
        )
        let logPath = database + ".log"
        guard said.hasPrefix("listening on"),
            let port = Int(said.split(separator: ":").last?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "")
        else {
            process.terminate()
            throw ServeError(message: "\(name) did not start (see \(logPath)): \(said)")
        }
        return ServeProcess(process: process, port: port)
    }

    /// Starts `shoal ARGUMENTS`, its standard error appended to `log`, and returns it with the first line it prints
    /// on standard output (empty if it ended first).
    static func launch(_ arguments: [String], log logPath: String) throws -> (Process, String) {
        let process = Process()
        process.executableURL = executable()
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment[parentVariable] = String(getpid())
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        if !FileManager.default.fileExists(atPath: logPath) {
            _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        }
        let log = FileHandle(forWritingAtPath: logPath)
        log?.seekToEndOfFile()
        process.standardError = log ?? FileHandle.nullDevice
        try process.run()
        var said = ""
        while !said.contains("\n") {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            said += String(decoding: chunk, as: UTF8.self)
        }
        return (process, said)
    }

    /// Starts a node that talks only to the peers it is given: no mDNS, no peers remembered from earlier runs.
    public static func startIsolated(
        database: String,
        name: String,
        peers: [Int],
        extra: [String] = []
    ) throws -> ServeProcess {
        try start(database: database, name: name, peers: peers, extra: extra + ["--no-mdns", "--no-remembered"])
    }


    /// Peak resident memory so far, in MiB (from /proc).
    public var peakResidentMiB: Double? {
        Self.peakResidentMiB(pid: process.processIdentifier)
    }

    /// Peak resident memory so far of process `pid`, in MiB (from /proc).
    public static func peakResidentMiB(pid: Int32) -> Double? {
        statusMiB(pid: pid, field: "VmHWM:")
    }

    /// Resident memory now, in MiB (VmRSS, from /proc).
    public static func residentMiB(pid: Int32) -> Double? {
        statusMiB(pid: pid, field: "VmRSS:")
    }

    private static func statusMiB(pid: Int32, field: String) -> Double? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field) }),
            let kib = Double(line.split(whereSeparator: { $0 == " " || $0 == "\t" })[1])
        else { return nil }
        return kib / 1024
    }
}

/// A child process that did not start, or a helper command that failed.
public struct ServeError: Error, CustomStringConvertible {
    /// What went wrong, for a person.
    public let message: String
    /// An error saying `message`.
    public init(message: String) { self.message = message }
    /// The message.
    public var description: String { message }
}

/// SplitMix64: seeded, so runs replay from the seed they print.
public struct SeededRandom: RandomNumberGenerator {
    /// The generator's state (its seed, at first).
    public var state: UInt64
    /// A generator seeded with `state`.
    public init(state: UInt64) { self.state = state }
    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A generator seeded from `SHOAL_TEST_SEED` when it is set, else from a random seed; the seed is printed
    /// with `test`'s name, so a failure replays with `SHOAL_TEST_SEED=<seed>`.
    public static func fromEnvironment(test: String) -> SeededRandom {
        let given = ProcessInfo.processInfo.environment["SHOAL_TEST_SEED"].flatMap { UInt64($0) }
        let seed = given ?? UInt64.random(in: 0...UInt64.max)
        print("\(test): seed \(seed) (replay with SHOAL_TEST_SEED=\(seed))")
        return SeededRandom(state: seed)
    }
}

/// A `shoal relay serve` child process on loopback, for the demo, the chaos harness and the benchmarks.
public struct RelayProcess: ChildProcess {
    /// The running `shoal relay serve`.
    public let process: Process
    /// Its base URL (`http://127.0.0.1:PORT`).
    public let url: String
    /// The port it listens on.
    public let port: Int

    /// Starts a relay on `data` (at `port`, 0 for any) and returns once it prints where it listens. Its log is appended
    /// to `data.log`.
    public static func start(data: String, port: Int = 0, extra: [String] = []) throws -> RelayProcess {
        try start(storage: ["--data", data], log: data + ".log", port: port, extra: extra)
    }

    /// Starts a relay on `storage` (`--data DIR` or `--postgres URL`) logging to `logPath` (at `port`, 0 for any) and
    /// returns once it prints where it listens.
    public static func start(storage: [String], log logPath: String, port: Int = 0, extra: [String] = []) throws -> RelayProcess {
        let (process, said) = try ServeProcess.launch(
            ["relay", "serve"] + storage + ["--listen", "127.0.0.1:\(port)"] + extra,
            log: logPath
        )
        let prefix = "relay listening on "
        guard said.hasPrefix(prefix) else {
            process.terminate()
            throw ServeError(message: "the relay did not start (see \(logPath)): \(said)")
        }
        let url = String(said.dropFirst(prefix.count)).trimmingCharacters(in: .whitespacesAndNewlines)
        guard let port = Int(url.split(separator: ":").last ?? "") else {
            process.terminate()
            throw ServeError(message: "the relay said \(said)")
        }
        return RelayProcess(process: process, url: url, port: port)
    }

    /// Makes a token for `cluster` in the relay's data directory `data`.
    public static func token(data: String, cluster: String) throws -> String {
        try token(storage: ["--data", data], cluster: cluster)
    }

    /// Makes a token for `cluster` in the relay's storage (`--data DIR` or `--postgres URL`).
    public static func token(storage: [String], cluster: String) throws -> String {
        let process = Process()
        process.executableURL = ServeProcess.executable()
        process.arguments = ["relay", "token", "create"] + storage + ["--cluster", cluster]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0, let token = said.split(separator: "\n").last else {
            throw ServeError(message: "relay token create failed")
        }
        return String(token)
    }

}

/// A child process the tools start, stop and kill.
public protocol ChildProcess {
    /// The process.
    var process: Process { get }
}

extension ChildProcess {
    /// Whether it still runs.
    public var isRunning: Bool { process.isRunning }

    /// SIGKILL, and wait.
    public func kill() {
        guard process.isRunning else { return }
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// SIGTERM, and wait.
    public func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}
