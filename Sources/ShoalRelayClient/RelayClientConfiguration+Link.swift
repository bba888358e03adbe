import AsyncHTTPClient
import Foundation
import NIOSSL
import ShoalCore
import ShoalRelayProtocol

/// What a relay link derives from its configuration: its checked instances, its backoff, how its HTTP client
/// connects, and its sessions. Nothing here talks to the relay.
extension RelayClientConfiguration {
    /// The relay's instances (``url`` first, then ``otherURLs``) without trailing slashes, once each is checked to be
    /// an `https://` URL or an `http://` one to a loopback address (the token would otherwise cross the network in
    /// clear), the token is checked to be there, and ``caCertificatePath`` (when given) to hold PEM certificates (the
    /// one file this reads).
    func checkedBases() throws(ShoalError) -> [String] {
        let bases = try ([url] + otherURLs).map { url throws(ShoalError) in try Self.checked(url) }
        guard !token.isEmpty else {
            throw ShoalError(
                code: .invalidArgument,
                message: "a relay needs a token (--relay-token; `shoal relay token create` makes one)"
            )
        }
        if let ca = caCertificatePath {
            let roots: [NIOSSLCertificate]
            do {
                roots = try NIOSSLCertificate.fromPEMFile(ca)
            } catch {
                throw ShoalError(
                    code: .invalidArgument, message: "--relay-ca \(ca): cannot read it as PEM certificates (\(error))"
                )
            }
            guard !roots.isEmpty else {
                throw ShoalError(code: .invalidArgument, message: "--relay-ca \(ca) holds no PEM certificate")
            }
        }
        return bases
    }

    /// Retries after failures, between the configured bounds.
    var backoff: Backoff {
        Backoff(initialMilliseconds: initialBackoffMilliseconds, maximumMilliseconds: maximumBackoffMilliseconds)
    }

    /// The longest a site whose ranges keep failing is left aside before it is tried again.
    static let blockedSiteMilliseconds: UInt64 = 60_000

    /// The pull session of the link of this node's `site`.
    func pullSession(site: SiteID) -> RelayPullSession {
        RelayPullSession(
            site: site,
            cluster: clusterID,
            backoff: backoff,
            blockMilliseconds: Self.blockedSiteMilliseconds,
            spacingMilliseconds: minimumRequestSpacingMilliseconds
        )
    }

    /// One pass of the epoch session, with the roster as it stands now (`now`: the monotonic clock).
    func epochSession(_ pass: RelayEpochSession.Pass, now: UInt64) -> RelayEpochSession {
        RelayEpochSession(
            pass,
            identity: identity,
            cluster: clusterID,
            clusterSecret: clusterSecret,
            waitMilliseconds: waitMilliseconds,
            roster: roster?(),
            now: now
        )
    }

    /// How the link's HTTP client connects: HTTP/1.1 over TLS 1.2 or later, trusting ``caCertificatePath`` (when
    /// given) instead of the system's roots. A connection refused is retried by the client until the connect timeout:
    /// kept short, so a node whose relay instance died goes on with the next within seconds.
    var httpConfiguration: HTTPClient.Configuration {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        if let caCertificatePath { tls.trustRoots = .file(caCertificatePath) }
        var http = HTTPClient.Configuration(
            tlsConfiguration: tls,
            timeout: HTTPClient.Configuration.Timeout(connect: .seconds(3), read: .seconds(90))
        )
        http.httpVersion = .http1Only
        return http
    }

    /// `url` without trailing slashes, if it is an `https://` URL or an `http://` one to a loopback address.
    static func checked(_ url: String) throws(ShoalError) -> String {
        var url = url
        while url.hasSuffix("/") { url.removeLast() }
        let lowered = url.lowercased()
        guard lowered.hasPrefix("https://") || lowered.hasPrefix("http://"),
            let components = URLComponents(string: url), let host = components.host, !host.isEmpty
        else {
            throw ShoalError(
                code: .invalidArgument,
                message: "--relay wants an https:// (or loopback http://) URL, got \"\(url)\""
            )
        }
        guard lowered.hasPrefix("https://") || RelayAPI.isLoopback(host) else {
            throw ShoalError(
                code: .invalidArgument,
                message: "plain http:// to \(host) would send the token in clear: use https:// "
                    + "(http:// only to loopback)"
            )
        }
        return url
    }
}
