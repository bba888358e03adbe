import Foundation
import ShoalTestSupport
import Testing

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
    func spawn(_ host: Host, _ arguments: [String]) throws -> RunningProcess {
        try RunningProcess(launching: scriptProcess(["run", host.rawValue] + arguments))
    }

    /// Starts `shoal serve` on `host`, listening on the host's address, and waits until it listens.
    func serve(_ host: Host, database: String, name: String, _ extra: [String] = []) async throws -> RunningProcess {
        let node = try spawn(
            host,
            [shoalExecutable().path, "serve", "--db", database, "--name", name, "--listen", "\(host.address):7400"] + extra
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

