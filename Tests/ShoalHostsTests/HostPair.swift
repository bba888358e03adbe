import Foundation
import Synchronization
import Testing

/// The repository's root, found from this file's path (the tests run the scripts in Tools/).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// The `shoal` executable built beside the tests.
func shoalExecutable() -> String {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("shoal").path)
        && directory.path != "/"
    {
        directory = directory.deletingLastPathComponent()
    }
    return directory.appendingPathComponent("shoal").path
}

/// Network namespaces need root, and a kernel and container that allow them. The README's test command runs as
/// root; where the machine refuses namespaces, the suite is reported as disabled with this reason.
let canCreateNetworkNamespaces: Bool = {
    guard getuid() == 0 else { return false }
    let probe = Process()
    probe.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
    probe.arguments = ["--net", "--mount", "--uts", "true"]
    probe.standardError = FileHandle.nullDevice
    guard (try? probe.run()) != nil else { return false }
    probe.waitUntilExit()
    return probe.terminationStatus == 0
}()

/// Two hosts on this machine, made by `Tools/netns.sh`: network namespaces joined by a veth link, each with its
/// own hostname, D-Bus and Avahi daemon. Host a is 10.77.0.1, host b 10.77.0.2.
final class HostPair: Sendable {
    enum Host: String, Sendable {
        case a, b
        var address: String { self == .a ? "10.77.0.1" : "10.77.0.2" }
    }

    /// Prefixes every name the script creates, so each test has a pair of its own.
    let prefix: String
    let directory: URL

    init(_ name: String) throws {
        // At most 12 characters: interface names ("<prefix>-va") are limited to 15.
        prefix = "s\(name.prefix(4))\(UInt16.random(in: 0...UInt16.max))"
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("shoal-hosts-\(prefix)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let (status, output) = try script(["up"])
        guard status == 0 else {
            down()
            throw HostError(message: "Tools/netns.sh up failed (\(status)): \(output)")
        }
    }

    /// Stops everything on both hosts and removes them.
    func down() {
        _ = try? script(["down"])
        try? FileManager.default.removeItem(at: directory)
    }

    /// Runs a command on `host` to completion: its exit status and its output (standard output and error).
    @discardableResult
    func run(_ host: Host, _ arguments: [String]) throws -> (status: Int32, output: String) {
        try script(["run", host.rawValue] + arguments)
    }

    /// Starts a long-running command on `host`; its output lines can be waited for.
    func spawn(_ host: Host, _ arguments: [String]) throws -> HostProcess {
        try HostProcess(launching: scriptProcess(["run", host.rawValue] + arguments))
    }

    /// Starts `shoal serve` on `host`, listening on the host's address, and waits until it listens.
    func serve(_ host: Host, database: String, name: String, _ extra: [String] = []) async throws -> HostProcess {
        let node = try spawn(
            host,
            [shoalExecutable(), "serve", "--db", database, "--name", name, "--listen", "\(host.address):7400"] + extra
        )
        guard await node.line(within: 30, { $0.hasPrefix("listening on") }) != nil else {
            node.stop()
            throw HostError(message: "shoal serve did not start on host \(host):\n\(node.output)")
        }
        return node
    }

    private func scriptProcess(_ arguments: [String]) -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [repositoryRoot.appendingPathComponent("Tools/netns.sh").path] + arguments
        var environment = ProcessInfo.processInfo.environment
        environment["SHOAL_NETNS"] = prefix
        process.environment = environment
        return process
    }

    private func script(_ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = scriptProcess(arguments)
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }
}

struct HostError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// A process started on one of the hosts, with its output (standard output and error) collected line by line.
final class HostProcess: Sendable {
    let process: Process
    private let lines = OutputLines()

    init(launching process: Process) throws {
        self.process = process
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let lines = self.lines
        // A thread of its own: the read blocks until the process writes or exits.
        Thread.detachNewThread {
            var pending = Data()
            while true {
                let chunk = pipe.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                    pending.removeSubrange(pending.startIndex...newline)
                    lines.append(line)
                }
            }
            lines.append(nil)
        }
    }

    /// Every line so far.
    var output: String {
        lines.lines.joined(separator: "\n")
    }

    /// The first line (already written or still to come) matching `matches`, or nil after `seconds`.
    func line(within seconds: Double, _ matches: @escaping @Sendable (String) -> Bool) async -> String? {
        await lines.first(within: seconds, matches)
    }

    /// Stops the process (SIGTERM, so it withdraws its mDNS registration) and waits for it.
    func stop() {
        if process.isRunning { process.terminate() }
        process.waitUntilExit()
    }
}

/// Lines written by a process, with waiters for the one a test expects.
private final class OutputLines: Sendable {
    private struct State {
        var lines: [String] = []
        var ended = false
        var waiters:
            [(id: Int, matches: @Sendable (String) -> Bool, continuation: CheckedContinuation<String?, Never>)] =
                []
        var nextWaiter = 0
    }

    private let state = Mutex(State())

    var lines: [String] { state.withLock { $0.lines } }

    /// Appends a line, in the order read; nil when the output has ended (no waiter can be satisfied any more).
    func append(_ line: String?) {
        let satisfied = state.withLock { state in
            guard let line else {
                state.ended = true
                defer { state.waiters.removeAll() }
                return state.waiters.map { ($0.continuation, String?.none) }
            }
            state.lines.append(line)
            defer { state.waiters.removeAll { $0.matches(line) } }
            return state.waiters.filter { $0.matches(line) }.map { ($0.continuation, String?.some(line)) }
        }
        for (continuation, line) in satisfied { continuation.resume(returning: line) }
    }

    func first(within seconds: Double, _ matches: @escaping @Sendable (String) -> Bool) async -> String? {
        await withCheckedContinuation { continuation in
            let id: Int? = state.withLock { state in
                if let line = state.lines.first(where: matches) {
                    continuation.resume(returning: line)
                    return nil
                }
                if state.ended {
                    continuation.resume(returning: nil)
                    return nil
                }
                state.nextWaiter += 1
                state.waiters.append((state.nextWaiter, matches, continuation))
                return state.nextWaiter
            }
            guard let id else { return }
            Task {
                try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
                self.expire(id)
            }
        }
    }

    private func expire(_ id: Int) {
        let waiter = state.withLock { state in
            state.waiters.firstIndex(where: { $0.id == id }).map { state.waiters.remove(at: $0) }
        }
        waiter?.continuation.resume(returning: nil)
    }
}
