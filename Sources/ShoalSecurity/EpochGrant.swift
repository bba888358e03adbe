import Crypto
import ShoalCore

/// A relay key epoch handed to one member: the epoch's secret and the relay token that goes with it, sealed to the
/// member's P-256 key (ECDH with a fresh key, HKDF-SHA256, ChaCha20-Poly1305) and signed by the member who rotated.
///
/// Grants travel through the relay's mailbox, which sees only who each is for; only the recipient can open one, and
/// it counts only when its signer is a member on the recipient's roster. The node key signs and, here, agrees keys:
/// both uses are bound to their own labels (the HKDF salt and the signature's prefix).
public struct EpochGrant: Sendable, Hashable {
    /// What a grant carries.
    public struct Contents: Sendable, Hashable {
        /// The epoch's secret: its sealing key is derived from it (``ClusterKeys``, purpose `relay/seal/epoch-N`).
        public var secret: [UInt8]
        /// The relay token of the epoch (the rotation retired the ones before).
        public var token: String
        /// The nodes removed from the cluster when the epoch began: none of them was granted it.
        public var removed: [NodeID]

        /// Contents of a grant.
        public init(secret: [UInt8], token: String, removed: [NodeID]) {
            self.secret = secret
            self.token = token
            self.removed = removed
        }
    }

    /// The cluster id (hex) the epoch belongs to.
    public var cluster: String
    /// The epoch.
    public var epoch: UInt32
    /// Who may open it.
    public var recipient: NodeID
    /// The member who made it.
    public var signer: NodeID
    /// The signer's public key (DER).
    public var signerKey: [UInt8]
    /// The fresh public key of the key agreement (X9.63).
    public var ephemeralKey: [UInt8]
    /// The contents, sealed.
    public var sealed: [UInt8]
    /// The signer's signature (ECDSA P-256, raw) of everything above.
    public var signature: [UInt8]

    private static let salt = Array("shoal/epoch-grant/v1".utf8)
    private static let signingLabel = Array("shoal/epoch-grant-signature/v1".utf8)

    /// A grant of `contents` for `recipient` (whose public key is `recipientKey`), signed by `signer`.
    public static func make(
        cluster: String,
        epoch: UInt32,
        contents: Contents,
        recipient: NodeID,
        recipientKey: [UInt8],
        signer: NodeIdentity
    ) throws(ShoalError) -> EpochGrant {
        do {
            let theirs = try P256.KeyAgreement.PublicKey(derRepresentation: recipientKey)
            let ephemeral = P256.KeyAgreement.PrivateKey()
            var grant = EpochGrant(
                cluster: cluster,
                epoch: epoch,
                recipient: recipient,
                signer: signer.nodeID,
                signerKey: signer.publicKeyDER,
                ephemeralKey: Array(ephemeral.publicKey.x963Representation),
                sealed: [],
                signature: []
            )
            let key = grant.key(try ephemeral.sharedSecretFromKeyAgreement(with: theirs))
            grant.sealed = Array(try ChaChaPoly.seal(contents.encoded, using: key).combined)
            grant.signature = try signer.sign(grant.signedBytes)
            return grant
        } catch let error as ShoalError {
            throw error
        } catch {
            throw ShoalError(code: .identity, message: "cannot make a key grant for \(recipient.short): \(error)")
        }
    }

    private init(
        cluster: String,
        epoch: UInt32,
        recipient: NodeID,
        signer: NodeID,
        signerKey: [UInt8],
        ephemeralKey: [UInt8],
        sealed: [UInt8],
        signature: [UInt8]
    ) {
        self.cluster = cluster
        self.epoch = epoch
        self.recipient = recipient
        self.signer = signer
        self.signerKey = signerKey
        self.ephemeralKey = ephemeralKey
        self.sealed = sealed
        self.signature = signature
    }

    private func key(_ shared: SharedSecret) -> SymmetricKey {
        var info = Array(cluster.utf8)
        info += [UInt8(truncatingIfNeeded: epoch >> 24), UInt8(truncatingIfNeeded: epoch >> 16),
            UInt8(truncatingIfNeeded: epoch >> 8), UInt8(truncatingIfNeeded: epoch)]
        info += recipient.bytes + ephemeralKey
        return shared.hkdfDerivedSymmetricKey(using: SHA256.self, salt: Self.salt, sharedInfo: info, outputByteCount: 32)
    }

    /// Every field but the signature, in order.
    private func writeFields(to writer: inout FieldWriter) {
        writer.bytes(Array(cluster.utf8))
        writer.integer(UInt64(epoch), 4)
        writer.bytes(recipient.bytes)
        writer.bytes(signer.bytes)
        writer.bytes(signerKey)
        writer.bytes(ephemeralKey)
        writer.bytes(sealed)
    }

    /// What the signature covers: a label, then every field but the signature.
    var signedBytes: [UInt8] {
        var writer = FieldWriter()
        writer.bytes(Self.signingLabel)
        writeFields(to: &writer)
        return writer.output
    }

    /// Opens a grant made for `identity`, checking that it is for this cluster and node and that `signer` signed it.
    /// Whether the signer may grant (a member, not removed) is the caller's check, against its roster.
    public func open(with identity: NodeIdentity, cluster expected: String) throws(ShoalError) -> Contents {
        func refuse(_ why: String) -> ShoalError {
            ShoalError(code: .sealBroken, message: "a key grant for epoch \(epoch) \(why)")
        }
        guard cluster == expected else { throw refuse("is for another cluster") }
        guard recipient == identity.nodeID else { throw refuse("is for another node") }
        guard NodeIdentity.nodeID(ofPublicKeyDER: signerKey) == signer,
            NodeIdentity.isValid(signature: signature, of: signedBytes, publicKeyDER: signerKey)
        else { throw refuse("carries a signature that does not check") }
        do {
            let mine = try P256.KeyAgreement.PrivateKey(rawRepresentation: identity.privateKey.rawRepresentation)
            let ephemeral = try P256.KeyAgreement.PublicKey(x963Representation: ephemeralKey)
            let box = try ChaChaPoly.SealedBox(combined: sealed)
            let plaintext = Array(try ChaChaPoly.open(box, using: key(try mine.sharedSecretFromKeyAgreement(with: ephemeral))))
            return try Contents(decoding: plaintext)
        } catch let error as ShoalError {
            throw error
        } catch {
            throw refuse("does not open with this node's key")
        }
    }

    /// The grant's bytes, for the relay's mailbox.
    public var encoded: [UInt8] {
        var writer = FieldWriter()
        writer.integer(1, 1)
        writeFields(to: &writer)
        writer.bytes(signature)
        return writer.output
    }

    /// A grant from its bytes.
    public init(decoding bytes: [UInt8]) throws(ShoalError) {
        var reader = FieldReader(bytes)
        guard try reader.integer(1) == 1 else {
            throw ShoalError(code: .malformedMessage, message: "a key grant of a format this build does not read")
        }
        guard let cluster = String(validating: try reader.bytes(), as: UTF8.self) else {
            throw ShoalError(code: .malformedMessage, message: "a key grant's cluster is not UTF-8")
        }
        self.cluster = cluster
        epoch = UInt32(try reader.integer(4))
        guard let recipient = NodeID(bytes: try reader.bytes()), let signer = NodeID(bytes: try reader.bytes()) else {
            throw ShoalError(code: .malformedMessage, message: "a key grant names a node id of the wrong length")
        }
        self.recipient = recipient
        self.signer = signer
        signerKey = try reader.bytes()
        ephemeralKey = try reader.bytes()
        sealed = try reader.bytes()
        signature = try reader.bytes()
        guard reader.isAtEnd else { throw ShoalError(code: .malformedMessage, message: "a key grant has bytes after its end") }
    }
}

extension EpochGrant.Contents {
    var encoded: [UInt8] {
        var writer = FieldWriter()
        writer.bytes(secret)
        writer.bytes(Array(token.utf8))
        writer.integer(UInt64(removed.count), 4)
        for node in removed { writer.bytes(node.bytes) }
        return writer.output
    }

    init(decoding bytes: [UInt8]) throws(ShoalError) {
        var reader = FieldReader(bytes)
        secret = try reader.bytes()
        guard secret.count == 32, let token = String(validating: try reader.bytes(), as: UTF8.self) else {
            throw ShoalError(code: .malformedMessage, message: "a key grant's contents are malformed")
        }
        self.token = token
        let count = Int(try reader.integer(4))
        guard count <= 100_000 else { throw ShoalError(code: .malformedMessage, message: "a key grant lists too many nodes") }
        removed = []
        for _ in 0..<count {
            guard let node = NodeID(bytes: try reader.bytes()) else {
                throw ShoalError(code: .malformedMessage, message: "a key grant names a node id of the wrong length")
            }
            removed.append(node)
        }
        guard reader.isAtEnd else { throw ShoalError(code: .malformedMessage, message: "a key grant's contents run on") }
    }
}

/// Writes length-prefixed (u32) byte fields and big-endian integers.
private struct FieldWriter {
    var output: [UInt8] = []

    mutating func integer(_ value: UInt64, _ count: Int) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) {
            output.append(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
        }
    }

    mutating func bytes(_ bytes: [UInt8]) {
        integer(UInt64(bytes.count), 4)
        output += bytes
    }
}

/// Reads what ``FieldWriter`` writes, refusing to read past the end.
private struct FieldReader {
    private let input: [UInt8]
    private var position = 0

    init(_ input: [UInt8]) { self.input = input }

    var isAtEnd: Bool { position == input.count }

    mutating func integer(_ count: Int) throws(ShoalError) -> UInt64 {
        guard input.count - position >= count else {
            throw ShoalError(code: .truncatedStream, message: "a key grant ends inside a field")
        }
        var value: UInt64 = 0
        for byte in input[position..<position + count] { value = value << 8 | UInt64(byte) }
        position += count
        return value
    }

    mutating func bytes() throws(ShoalError) -> [UInt8] {
        let count = Int(try integer(4))
        guard input.count - position >= count else {
            throw ShoalError(code: .truncatedStream, message: "a key grant ends inside a field")
        }
        defer { position += count }
        return Array(input[position..<position + count])
    }
}
