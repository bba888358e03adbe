import Foundation

/// The repository's root, found from this file's path (tests run the scripts in `Tools/`).
public let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// What a test could not set up: a missing executable, a process that did not start.
public struct TestSetupError: Error, CustomStringConvertible {
    /// What went wrong.
    public let message: String
    /// An error saying `message`.
    public init(_ message: String) { self.message = message }
    /// The message.
    public var description: String { message }
}

/// The `shoal` executable built beside the tests (`swift build --build-tests` builds both).
public func shoalExecutable() throws -> URL {
    var directory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    // On Linux the test binary sits in the build folder; on macOS inside an .xctest bundle.
    while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("shoal").path)
        && directory.path != "/"
    {
        directory = directory.deletingLastPathComponent()
    }
    let url = directory.appendingPathComponent("shoal")
    guard FileManager.default.isExecutableFile(atPath: url.path) else {
        throw TestSetupError("the shoal executable was not built next to the tests (run swift build --build-tests)")
    }
    return url
}

/// A new, empty directory of its own under the system's temporary directory, named after `name`.
public func temporaryDirectory(_ name: String) throws -> URL {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent(
        "shoal-\(name)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    )
    try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    return url
}
