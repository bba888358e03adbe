import Foundation

/// What a finished process said.
public struct ProcessOutput: Sendable {
    /// Its exit status (or the signal that ended it).
    public var status: Int32
    /// Everything it wrote to standard output.
    public var stdout: String
    /// Everything it wrote to standard error.
    public var stderr: String
}

/// Runs `executable` with `arguments` (and `input` on stdin) to completion; a watchdog ends it after `timeout`
/// seconds, so a hang fails the test instead of stalling the suite.
@discardableResult
public func runProcess(
    _ executable: URL,
    _ arguments: [String],
    input: Data? = nil,
    environment: [String: String]? = nil,
    timeout: Double = 120
) throws -> ProcessOutput {
    // A child that exits before reading its input must not take the test runner down with SIGPIPE.
    signal(SIGPIPE, SIG_IGN)
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    if let environment { process.environment = environment }
    let stdout = Pipe()
    let stderr = Pipe()
    process.standardOutput = stdout
    process.standardError = stderr
    let stdin = input.map { _ in Pipe() }
    process.standardInput = stdin ?? FileHandle.nullDevice
    try process.run()
    if let input, let stdin {
        stdin.fileHandleForWriting.write(input)
        try stdin.fileHandleForWriting.close()
    }
    // SIGTERM, then SIGKILL for a child that does not stop on it (avahi-browse waiting on a resolution, say). The
    // watchdog holds the process weakly: a cancelled one still waits for its deadline, and must not keep the
    // process's pipes open until then (polling tests ran the test runner out of descriptors below 1024, where
    // Foundation's Process needs them).
    let watchdog = DispatchWorkItem { [weak process] in
        guard let process, process.isRunning else { return }
        process.terminate()
        DispatchQueue.global().asyncAfter(deadline: .now() + 2) { [weak process] in
            if let process, process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
    }
    DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: watchdog)
    // Both pipes are read to their end before waiting, so a large output cannot block the child.
    nonisolated(unsafe) var errorData = Data()
    let errorReader = DispatchWorkItem { errorData = stderr.fileHandleForReading.readDataToEndOfFile() }
    DispatchQueue.global().async(execute: errorReader)
    let outputData = stdout.fileHandleForReading.readDataToEndOfFile()
    errorReader.wait()
    process.waitUntilExit()
    watchdog.cancel()
    try? stdout.fileHandleForReading.close()
    try? stderr.fileHandleForReading.close()
    return ProcessOutput(
        status: process.terminationStatus,
        stdout: String(decoding: outputData, as: UTF8.self),
        stderr: String(decoding: errorData, as: UTF8.self)
    )
}

/// Runs the `shoal` executable built beside the tests.
@discardableResult
public func shoal(_ arguments: String..., input: Data? = nil) throws -> ProcessOutput {
    try runProcess(try shoalExecutable(), arguments, input: input)
}

/// Runs the `shoal` executable built beside the tests.
@discardableResult
public func shoal(arguments: [String], input: Data? = nil) throws -> ProcessOutput {
    try runProcess(try shoalExecutable(), arguments, input: input)
}

/// Runs SQL with the system's `sqlite3` shell: a writer that is not Shoal. It waits up to 10 s for a lock, as an
/// application's own driver would be set to (the shell's default is not to wait at all).
@discardableResult
public func sqlite3Shell(_ database: String, _ sql: String) throws -> ProcessOutput {
    try runProcess(URL(fileURLWithPath: "/usr/bin/sqlite3"), ["-cmd", ".timeout 10000", database, sql])
}

/// Writes `backup`'s bytes over the database file at `path` (the same file, so the same inode), as a restore tool
/// that writes in place does; its write-ahead log and shared memory files go first.
public func restoreInPlace(_ path: String, from backup: String) throws {
    for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
    try handle.truncate(atOffset: 0)
    try handle.write(contentsOf: try Data(contentsOf: URL(fileURLWithPath: backup)))
    try handle.close()
}
