import Foundation

/// A database of its own on a PostgreSQL server, made for one run of a tool and dropped after it.
public struct PostgresDatabase: Sendable {
    /// Its URL: the server's, with this database's name.
    public let url: String
    /// The URL of the server's database psql connects to, to make and drop this one.
    public let server: String
    /// Its name.
    public let name: String

    /// Makes database `name` (dropped first if it exists) on the server `server` names (the URL of any database on it,
    /// as `Tools/start-postgres.sh` prints).
    public static func create(server: String, name: String) throws -> PostgresDatabase {
        guard var components = URLComponents(string: server), components.host != nil else {
            throw ServeError(message: "not a PostgreSQL URL: \(server)")
        }
        components.path = "/" + name
        guard let url = components.string else { throw ServeError(message: "not a PostgreSQL URL: \(server)") }
        try psql(server, ["-qc", "DROP DATABASE IF EXISTS \(name) WITH (FORCE)", "-c", "CREATE DATABASE \(name)"])
        return PostgresDatabase(url: url, server: server, name: name)
    }

    /// Drops it (connections still open to it are ended).
    public func drop() {
        try? Self.psql(server, ["-qc", "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"])
    }

    private static func psql(_ server: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/psql")
        process.arguments = [server] + arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw ServeError(message: "psql \(arguments.joined(separator: " ")) failed on \(server)")
        }
    }
}
