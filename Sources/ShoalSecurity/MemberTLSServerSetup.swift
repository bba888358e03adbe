import NIOCore
import NIOSSL
import ShoalCore

/// TLS for a node's other servers (the dashboard's HTTPS): the node's own certificate, TLS 1.3 as on peer links
/// (``TLSChannelSetup``'s context), and a client certificate whose key the roster holds as a current member, checked
/// against ``TrustStore`` at each handshake (a member removed is refused from then on). A client without a
/// certificate, with a stranger's key or a joining device's certificate, fails the handshake before a byte of the
/// application protocol. Unlike a peer link, a refused key is not listed as a pending device: a browser or `curl` is
/// not a device asking to join.
public struct MemberTLSServerSetup: Sendable {
    private let context: NIOSSLContext
    private let trust: TrustStore

    /// A setup serving `identity`'s certificate (made now, as for peer links) and negotiating `applicationProtocols`
    /// by ALPN when the client offers any.
    public init(
        identity: NodeIdentity,
        name: String,
        siteID: SiteID,
        trust: TrustStore,
        applicationProtocols: [String] = ["http/1.1"]
    ) throws(ShoalError) {
        let certificate = try identity.certificate(name: name, siteID: siteID, purpose: .member)
        self.context = try TLSChannelSetup.context(
            certificate,
            try identity.tlsPrivateKey(),
            server: true,
            protocols: applicationProtocols
        )
        self.trust = trust
    }

    /// Adds the TLS handler, with the roster check, first in a new connection's pipeline (on its event loop).
    public func addHandler(to channel: any Channel) throws {
        let trust = self.trust
        let handler = NIOSSLServerHandler(context: context) { certificates, promise in
            promise.succeed(Self.verdict(certificates, trust: trust))
        }
        try channel.pipeline.syncOperations.addHandler(handler, position: .first)
    }

    /// Whether the client's leaf certificate is a member's.
    static func verdict(_ certificates: [NIOSSLCertificate], trust: TrustStore) -> NIOSSLVerificationResult {
        guard let leaf = certificates.first, let certificate = try? PeerCertificate(leaf),
            certificate.purpose == .member, trust.roster.isMember(certificate.nodeID)
        else { return .failed }
        return .certificateVerified
    }
}
