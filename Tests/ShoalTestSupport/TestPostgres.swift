import Foundation
import Synchronization

/// The PostgreSQL server the relay's tests use: the one `SHOAL_TEST_POSTGRES_URL` names (`Tools/test.sh` sets it),
/// or else the one `Tools/start-postgres.sh` starts (idempotently). A test that needs it fails, loudly, when neither
/// works: it does not skip.
public enum TestPostgres {
    private static let server = Mutex<Result<String, TestSetupError>?>(nil)

    /// The server's URL (its `shoal` database).
    public static func serverURL() throws -> String {
        try server.withLock { server in
            if let server { return try server.get() }
            let result: Result<String, TestSetupError>
            if let url = ProcessInfo.processInfo.environment["SHOAL_TEST_POSTGRES_URL"], !url.isEmpty {
                result = .success(url)
            } else {
                let script = repositoryRoot.appendingPathComponent("Tools/start-postgres.sh")
                let started = try runProcess(URL(fileURLWithPath: "/bin/bash"), [script.path], timeout: 300)
                if started.status == 0, let line = started.stdout.split(separator: "\n").last, line.hasPrefix("postgres://") {
                    result = .success(String(line))
                } else {
                    result = .failure(
                        TestSetupError("no PostgreSQL for the relay's tests: Tools/start-postgres.sh failed: \(started.stderr)")
                    )
                }
            }
            server = result
            return try result.get()
        }
    }

    /// A new, empty database of the test's own on the server; returns its URL.
    public static func freshDatabase(_ name: String) throws -> String {
        let url = try serverURL()
        let database = "t_\(name.filter { $0.isLetter || $0.isNumber })_\(getpid())_\(UInt32.random(in: 0...UInt32.max))"
            .lowercased()
        let made = try runProcess(URL(fileURLWithPath: "/usr/bin/psql"), [url, "-qc", "CREATE DATABASE \(database)"])
        guard made.status == 0 else { throw TestSetupError("cannot create a test database: \(made.stderr)") }
        return url.replacingOccurrences(of: "/shoal?", with: "/\(database)?")
    }

    /// Runs `sql` with `psql` on the database `url` names; returns what it printed (unaligned, tuples only).
    public static func query(_ url: String, _ sql: String) throws -> String {
        let result = try runProcess(URL(fileURLWithPath: "/usr/bin/psql"), [url, "-tAc", sql])
        guard result.status == 0 else { throw TestSetupError("psql failed: \(result.stderr)") }
        return result.stdout
    }
}
