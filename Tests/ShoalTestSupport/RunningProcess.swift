import Foundation
import Synchronization

/// A long-running process (a `shoal serve`, a command on a test host), with its output (standard output and error)
/// collected line by line, so a test waits for the line it expects instead of sleeping.
public final class RunningProcess: Sendable {
    /// The process.
    public let process: Process
    private let lines = OutputLines()

    /// Starts `process`, collecting what it writes.
    public init(launching process: Process) throws {
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
    public var output: String {
        lines.lines.joined(separator: "\n")
    }

    /// The first line (already written or still to come) matching `matches`, or nil after `seconds`.
    public func line(within seconds: Double, _ matches: @escaping @Sendable (String) -> Bool) async -> String? {
        await lines.first(within: seconds, matches)
    }

    /// Stops the process (SIGTERM, so a node withdraws its mDNS registration and releases its database) and
    /// waits for it.
    public func stop() {
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

extension RunningProcess {
    /// Starts `executable` with `arguments`.
    public convenience init(_ executable: URL, _ arguments: [String], environment: [String: String]? = nil) throws {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        if let environment { process.environment = environment }
        try self.init(launching: process)
    }

    /// The process id.
    public var pid: Int32 { process.processIdentifier }
}
