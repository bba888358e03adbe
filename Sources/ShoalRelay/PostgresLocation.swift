import Foundation
import NIOSSL
import ShoalCore

/// Where a relay's PostgreSQL database is, parsed from a URL:
/// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=MODE][&sslrootcert=PEM]`, or a Unix socket with
/// `?host=/path/to/socket/directory` and no host in the authority. The TLS modes mean what they mean to libpq:
/// `disable`, `prefer` (the default) and `require` check no certificate, `verify-ca` checks the chain, `verify-full`
/// the chain and the host name, against `sslrootcert` when given, else the system's roots. Without a password in the
/// URL, `PGPASSWORD` is used when set. The password is never shown: ``description`` leaves it out.
public struct PostgresLocation: Sendable, Hashable, CustomStringConvertible {
    /// How the connection uses TLS.
    public enum TLSMode: String, Sendable, Hashable {
        /// Plain TCP: for loopback and private networks only.
        case disable
        /// TLS when the server offers it, plain otherwise; no certificate check.
        case prefer
        /// TLS, with no certificate check (encryption against a passive listener only, as libpq's `require`).
        case require
        /// TLS, with the server's certificate chain checked.
        case verifyCA = "verify-ca"
        /// TLS, with the server's certificate chain and host name checked.
        case verifyFull = "verify-full"
    }

    /// The server's host name or address (empty with ``socketPath``).
    public var host: String
    /// The server's port.
    public var port: Int
    /// A Unix socket to connect through instead of TCP: the socket file itself.
    public var socketPath: String?
    /// The role to connect as.
    public var username: String
    /// Its password, if it needs one.
    public var password: String?
    /// The database.
    public var database: String
    /// TLS on the connection.
    public var tls: TLSMode
    /// A PEM file of the certificate authorities to check the server's certificate against (`verify-ca`,
    /// `verify-full`), instead of the system's roots.
    public var rootCertificatePath: String?

    /// Parses `url`; `environment` supplies `PGPASSWORD` when the URL has no password.
    public init(url: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws(ShoalError) {
        func refuse(_ why: String) -> ShoalError {
            ShoalError(
                code: .invalidArgument,
                message: "--postgres wants postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=MODE][&sslrootcert=PEM]: \(why)"
            )
        }
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            scheme == "postgres" || scheme == "postgresql"
        else { throw refuse("the URL does not start with postgres://") }
        let query = Dictionary((components.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        for name in query.keys where !["sslmode", "host", "sslrootcert"].contains(name) {
            throw refuse("unknown parameter \"\(name.prefix(40))\"")
        }
        if let directory = query["host"], directory.hasPrefix("/") {
            socketPath = (directory.hasSuffix("/") ? directory : directory + "/") + ".s.PGSQL.\(components.port ?? 5432)"
            host = ""
        } else {
            guard let host = components.host, !host.isEmpty else { throw refuse("no host") }
            self.host = host
            socketPath = nil
        }
        port = components.port ?? 5432
        guard (1...65_535).contains(port) else { throw refuse("port \(port) is out of range") }
        guard let user = components.user, !user.isEmpty else { throw refuse("no user") }
        username = user
        password = components.password ?? environment["PGPASSWORD"]
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        guard !path.isEmpty, !path.contains("/") else { throw refuse("no database name") }
        database = path
        switch query["sslmode"] ?? "prefer" {
        case "disable": tls = .disable
        case "prefer", "allow": tls = .prefer
        case "require": tls = .require
        case "verify-ca": tls = .verifyCA
        case "verify-full": tls = .verifyFull
        case let other:
            throw refuse("sslmode \"\(other.prefix(20))\" is not one of disable, prefer, require, verify-ca, verify-full")
        }
        rootCertificatePath = query["sslrootcert"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The location without its password.
    public var description: String {
        let place = socketPath ?? "\(host.contains(":") ? "[\(host)]" : host):\(port)"
        return "postgres://\(username)@\(place)/\(database)"
    }
}

extension PostgresLocation {
    /// The TLS configuration the mode asks for (nil: plain TCP).
    var tlsConfiguration: TLSConfiguration? {
        guard tls != .disable else { return nil }
        var configuration = TLSConfiguration.makeClientConfiguration()
        switch tls {
        case .disable, .prefer, .require: configuration.certificateVerification = .none
        case .verifyCA: configuration.certificateVerification = .noHostnameVerification
        case .verifyFull: configuration.certificateVerification = .fullVerification
        }
        if let rootCertificatePath { configuration.trustRoots = .file(rootCertificatePath) }
        return configuration
    }
}
