import Crypto
import Foundation
import NIOSSL
import ShoalCore
import SwiftASN1
import X509

/// A node's key and what it proves: its ``NodeID``, certificates made from it in-process, and signatures.
///
/// The key is P-256, made by `shoal init` and kept in the key file beside the database (``KeyFile``), which only its
/// owner may read. It never leaves the node: peers see the certificate (public key, name, site id) and signatures.
public struct NodeIdentity: Sendable {
    /// The private key's raw scalar (32 bytes): the key types are not `Sendable` on every platform.
    private let rawKey: [UInt8]

    /// The private key.
    public var privateKey: P256.Signing.PrivateKey {
        // Made from a valid key's bytes, so it cannot fail.
        try! P256.Signing.PrivateKey(rawRepresentation: rawKey)
    }

    /// The key the node signs with.
    public init(privateKey: P256.Signing.PrivateKey) {
        self.rawKey = Array(privateKey.rawRepresentation)
    }

    /// A new random key.
    public static func generate() -> NodeIdentity { NodeIdentity(privateKey: P256.Signing.PrivateKey()) }

    /// The public key, as DER SubjectPublicKeyInfo: what ``nodeID`` hashes, and what a roster record carries.
    public var publicKeyDER: [UInt8] { Array(privateKey.publicKey.derRepresentation) }

    /// The SHA-256 of the public key.
    public var nodeID: NodeID { Self.nodeID(ofPublicKeyDER: publicKeyDER) }

    /// The node id of a DER SubjectPublicKeyInfo.
    public static func nodeID(ofPublicKeyDER der: some Collection<UInt8>) -> NodeID {
        NodeID(bytes: Array(SHA256.hash(data: Array(der))))!
    }

    /// Signs `message` (ECDSA P-256 with SHA-256; the 64-byte raw form).
    public func sign(_ message: [UInt8]) throws(ShoalError) -> [UInt8] {
        do {
            return Array(try privateKey.signature(for: message).rawRepresentation)
        } catch {
            throw ShoalError(code: .identity, message: "cannot sign with the node key: \(error)")
        }
    }

    /// Whether `signature` (64-byte raw form) is `publicKeyDER`'s signature of `message`.
    public static func isValid(signature: [UInt8], of message: [UInt8], publicKeyDER: [UInt8]) -> Bool {
        guard let key = try? P256.Signing.PublicKey(derRepresentation: publicKeyDER),
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signature)
        else { return false }
        return key.isValidSignature(signature, for: message)
    }

    /// What a certificate says a peer comes for: to sync as a member, or to join with an invite code.
    public enum CertificatePurpose: String, Sendable {
        /// A member's certificate.
        case member = "shoal-member"
        /// A joining device's certificate: its connection gets only the join exchange.
        case join = "shoal-join"
    }

    /// A self-signed certificate for this key, made now: common name `name`, the site id and the purpose in its
    /// subject, valid from an hour ago for ten years (the node id does not depend on it: a new one can be made at any
    /// start).
    ///
    /// A member's certificate may carry its admission (``Roster/admissionProof(of:)``) in a non-critical extension
    /// (``PeerCertificate/admissionExtension``): a member admitted before it, which has not learnt of it yet, checks
    /// the signed adds and takes it as a member (TLS libraries that do not know the extension pass over it).
    public func certificate(
        name: String,
        siteID: SiteID,
        purpose: CertificatePurpose = .member,
        admission: [RosterRecord] = [],
        now: Date = Date()
    ) throws(ShoalError) -> NIOSSLCertificate {
        do {
            let subject = try DistinguishedName {
                CommonName(name.isEmpty ? "shoal" : String(name.prefix(64)))
                OrganizationName(purpose.rawValue)
                OrganizationalUnitName(siteID.hex)
            }
            let certificate = try Certificate(
                version: .v3,
                serialNumber: Certificate.SerialNumber(),
                publicKey: Certificate.PublicKey(privateKey.publicKey),
                notValidBefore: now.addingTimeInterval(-3600),
                notValidAfter: now.addingTimeInterval(10 * 365 * 86400),
                issuer: subject,
                subject: subject,
                signatureAlgorithm: .ecdsaWithSHA256,
                extensions: try Certificate.Extensions {
                    Critical(BasicConstraints.notCertificateAuthority)
                    Critical(KeyUsage(digitalSignature: true))
                    if !admission.isEmpty {
                        Certificate.Extension(
                            oid: PeerCertificate.admissionExtension,
                            critical: false,
                            value: ArraySlice(PeerCertificate.encode(admission: admission))
                        )
                    }
                },
                issuerPrivateKey: Certificate.PrivateKey(privateKey)
            )
            return try NIOSSLCertificate(bytes: Array(try certificate.serializeAsPEM().pemString.utf8), format: .pem)
        } catch {
            throw ShoalError(code: .identity, message: "cannot make the node's certificate: \(error)")
        }
    }

    /// The key in the form TLS wants.
    public func tlsPrivateKey() throws(ShoalError) -> NIOSSLPrivateKey {
        do {
            return try NIOSSLPrivateKey(bytes: Array(privateKey.pemRepresentation.utf8), format: .pem)
        } catch {
            throw ShoalError(code: .identity, message: "cannot load the node key for TLS: \(error)")
        }
    }
}

/// What a peer's certificate says, read in the TLS verification callback.
public struct PeerCertificate: Sendable, Hashable {
    /// The hash of its public key.
    public var nodeID: NodeID
    /// Its public key (DER SubjectPublicKeyInfo).
    public var publicKeyDER: [UInt8]
    /// Its common name: the name the peer gives itself (its claim, shown to people, never trusted).
    public var name: String
    /// The site id in its subject (its claim), if any.
    public var siteID: SiteID?
    /// What it says it comes for.
    public var purpose: NodeIdentity.CertificatePurpose
    /// The adds it shows as its admission (its claim: ``Roster/admitting(_:key:proof:)`` checks them); empty when its
    /// certificate carries none, or one that does not decode.
    public var admission: [RosterRecord] = []

    /// The OID of the extension that carries a member's admission: in the UUID arc (2.25), a number of Shoal's own.
    public static let admissionExtension: ASN1ObjectIdentifier = [2, 25, 6_283_185_307_179_586_476]

    /// The extension's value: a count, then each record's length and its stored bytes (``RosterRecord/encoded``).
    static func encode(admission: [RosterRecord]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.appendVarint(UInt64(admission.count))
        for record in admission {
            let encoded = record.encoded
            bytes.appendVarint(UInt64(encoded.count))
            bytes += encoded
        }
        return bytes
    }

    /// The records of an admission extension; empty when it is malformed or longer than a proof may be.
    static func decode(admission bytes: ArraySlice<UInt8>) -> [RosterRecord] {
        var reader = ByteReader(Array(bytes))
        guard let count = try? reader.readVarint(), count <= UInt64(Roster.maximumProofRecords) else { return [] }
        var records: [RosterRecord] = []
        for _ in 0..<count {
            guard let length = try? reader.readVarint(), length <= 4096,
                let encoded = try? reader.readBytes(Int(length)),
                let record = try? RosterRecord(decoding: Array(encoded))
            else { return [] }
            records.append(record)
        }
        return reader.isAtEnd ? records : []
    }

    /// Reads a peer's leaf certificate; throws unless it holds a P-256 key. The certificate's own signature is not
    /// checked: TLS proved that the peer holds the key's private half, and the key is what the roster names.
    public init(_ certificate: NIOSSLCertificate) throws(ShoalError) {
        do {
            let spki = try certificate.extractPublicKey().toSPKIBytes()
            _ = try P256.Signing.PublicKey(derRepresentation: spki)
            let parsed = try Certificate(derEncoded: try certificate.toDERBytes())
            publicKeyDER = spki
            nodeID = NodeIdentity.nodeID(ofPublicKeyDER: spki)
            var name = ""
            var site: SiteID?
            var purpose = NodeIdentity.CertificatePurpose.member
            for attribute in parsed.subject.flatMap({ $0 }) {
                let value = String(describing: attribute.value)
                switch attribute.type {
                case .RDNAttributeType.commonName: name = value
                case .RDNAttributeType.organizationalUnitName: site = SiteID(hex: value)
                case .RDNAttributeType.organizationName:
                    purpose = NodeIdentity.CertificatePurpose(rawValue: value) ?? .member
                default: break
                }
            }
            self.name = name.printable()
            self.siteID = site
            self.purpose = purpose
            if let proof = parsed.extensions[oid: Self.admissionExtension] {
                admission = Self.decode(admission: proof.value)
            }
        } catch let error as ShoalError {
            throw error
        } catch {
            throw ShoalError(code: .handshakeFailed, message: "the peer's certificate is not usable: \(error)")
        }
    }
}
