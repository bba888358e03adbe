import Foundation
import ShoalProcesses

/// The relay of the relay path: `shoal relay serve` instances on one storage, each restarted on the same port after
/// it is killed.
final class RelayServer {
    let storage: [String]
    let log: String
    /// The cluster the token reaches.
    let cluster: String
    /// The token the members are given (made again when the relay lost its storage).
    private(set) var token: String
    /// On PostgreSQL: the server's URL and the run's database on it (dropped and made again when the storage is lost).
    let postgres: (server: String, name: String)?
    private var ports: [Int]
    private var processes: [RelayProcess?]
    /// Every instance's URL, in order.
    private(set) var urls: [String] = []
    /// Every instance's port, in order.
    var instancePorts: [Int] { ports }

    init(
        storage: [String],
        log: String,
        instances: Int,
        cluster: String,
        postgres: (server: String, name: String)? = nil
    ) throws {
        self.storage = storage
        self.log = log
        self.cluster = cluster
        self.postgres = postgres
        token = try RelayProcess.token(storage: storage, cluster: cluster)
        ports = Array(repeating: 0, count: instances)
        processes = Array(repeating: nil, count: instances)
        try start()
        urls = processes.compactMap { $0?.url }
    }

    /// Starts every instance that is not running.
    func start() throws {
        for index in processes.indices where processes[index]?.isRunning != true {
            let started = try RelayProcess.start(storage: storage, log: log + "\(index).log", port: ports[index])
            processes[index] = started
            ports[index] = started.port
        }
    }

    /// Stops every instance.
    func stop() {
        for process in processes { process?.stop() }
        processes = processes.map { _ in nil }
    }

    /// Whether every instance is down.
    var isDown: Bool { processes.allSatisfy { $0?.isRunning != true } }

    /// The relay's data directory, when it keeps its data in SQLite.
    var dataDirectory: String? { storage.first == "--data" ? storage.dropFirst().first : nil }
    /// The relay's files as they were at an earlier kill, to put back at a later one.
    private var image: [String: Data]?
    /// Whether an image is kept.
    var holdsImage: Bool { image != nil }

    /// With the relay down: keeps its files as they are, or, when some were kept at an earlier kill, puts those back
    /// (returns true: the relay comes back from an older copy).
    func keepOrRestoreImage() throws -> Bool {
        guard let directory = dataDirectory else { return false }
        let names = ["relay.sqlite", "relay.sqlite-wal", "relay.sqlite-shm"]
        if let image {
            for name in names {
                let path = directory + "/" + name
                try? FileManager.default.removeItem(atPath: path)
                if let data = image[name] { try data.write(to: URL(fileURLWithPath: path)) }
            }
            self.image = nil
            return true
        }
        var kept: [String: Data] = [:]
        for name in names { kept[name] = FileManager.default.contents(atPath: directory + "/" + name) }
        image = kept
        return false
    }

    /// The relay loses its storage: every instance is killed (-9), its SQLite files are deleted (or its PostgreSQL
    /// database dropped and made again), and it comes back empty. Its operator makes a new token for the cluster
    /// (``token``), which the members are restarted with. A kept image goes too: it holds the tokens of before.
    func loseStorage() throws {
        for index in processes.indices { kill(index) }
        if let directory = dataDirectory {
            try FileManager.default.removeItem(atPath: directory)
        } else if let postgres {
            try Self.createDatabase(server: postgres.server, name: postgres.name)
        }
        image = nil
        token = try RelayProcess.token(storage: storage, cluster: cluster)
        try start()
    }

    /// Kills one instance (with SIGKILL), chosen by `pick`.
    func kill(_ pick: Int) {
        let index = pick % processes.count
        processes[index]?.kill()
        processes[index] = nil
    }

    /// Makes database `name` on the PostgreSQL server `server` names (its `shoal` database's URL), dropping it first
    /// if it exists (connections still open to it are ended).
    static func createDatabase(server: String, name: String) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        process.arguments = [
            server, "-qc", "DROP DATABASE IF EXISTS \(name) WITH (FORCE)", "-c", "CREATE DATABASE \(name)",
        ]
        process.standardOutput = FileHandle.nullDevice
        process.environment = ProcessInfo.processInfo.environment.merging(["PGOPTIONS": "-c client_min_messages=warning"]) { $1 }
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw ServeError(message: "psql could not create database \(name)") }
    }
}
