import Crypto
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity

/// Seals change sets for the relay and opens them: ChaCha20-Poly1305 with a key derived from the cluster secret
/// (``ClusterKeys``, purpose `relay/seal/epoch-N`), a random nonce per envelope, and the envelope's header as the
/// authenticated data, so a body cannot be moved to another cluster, site, range or place without failing.
public struct RelaySeal: Sendable {
    /// The epoch new envelopes are sealed with.
    public let epoch: UInt32
    /// Each epoch's key bytes (a `SymmetricKey` is made for each use).
    private let keys: [UInt32: [UInt8]]
    /// Each epoch's upload key: the relay holds it to check that an upload comes from a holder of the epoch's secret
    /// (it cannot open anything with it: sealing uses the other key).
    private let uploadKeys: [UInt32: [UInt8]]

    /// A seal over the keys of `secrets` (epoch → that epoch's secret); new envelopes use `epoch`.
    public init(secrets: [UInt32: [UInt8]], epoch: UInt32) {
        self.epoch = epoch
        keys = Dictionary(
            uniqueKeysWithValues: secrets.map { epoch, secret in
                let key = ClusterKeys.derive(secret: SymmetricKey(data: secret), purpose: "relay/seal/epoch-\(epoch)")
                return (epoch, key.withUnsafeBytes { Array($0) })
            }
        )
        uploadKeys = Dictionary(
            uniqueKeysWithValues: secrets.map { epoch, secret in
                let key = ClusterKeys.derive(secret: SymmetricKey(data: secret), purpose: "relay/upload/epoch-\(epoch)")
                return (epoch, key.withUnsafeBytes { Array($0) })
            }
        )
    }

    /// A seal with the cluster secret as epoch 0.
    public init(clusterSecret: [UInt8]) {
        self.init(secrets: [0: clusterSecret], epoch: 0)
    }

    /// The upload key of `epoch`, if held.
    public func uploadKey(_ epoch: UInt32) -> [UInt8]? { uploadKeys[epoch] }

    /// The authentication of an upload's body with the upload key of `epoch` (HMAC-SHA256, hex), for
    /// ``RelayAPI/uploadAuthHeader``.
    public func authenticate(_ body: [UInt8], epoch: UInt32) -> String? {
        uploadKeys[epoch].map { RelayAPI.uploadAuthentication(body, key: $0) }
    }

    /// Whether this seal holds the key of `epoch`.
    public func holds(_ epoch: UInt32) -> Bool { keys[epoch] != nil }

    /// `envelope` with `plaintext` sealed into its body (its `epoch` set to ``epoch``).
    public func seal(_ plaintext: [UInt8], into envelope: RelayEnvelope) throws(ShoalError) -> RelayEnvelope {
        var envelope = envelope
        envelope.epoch = epoch
        envelope.sealed = []
        guard let key = keys[epoch].map(SymmetricKey.init(data:)) else {
            throw ShoalError(code: .sealBroken, message: "no key for epoch \(epoch)")
        }
        do {
            let box = try ChaChaPoly.seal(plaintext, using: key, nonce: ChaChaPoly.Nonce(), authenticating: envelope.header)
            envelope.sealed = Array(box.combined)
        } catch {
            throw ShoalError(code: .sealBroken, message: "could not seal a change set: \(error)")
        }
        return envelope
    }

    /// The plaintext of `envelope`'s body; a body that fails its seal is refused.
    public func open(_ envelope: RelayEnvelope) throws(ShoalError) -> [UInt8] {
        guard let key = keys[envelope.epoch].map(SymmetricKey.init(data:)) else {
            throw ShoalError(
                code: .sealBroken,
                message: "a change set of site \(envelope.site.hex.prefix(8)) is sealed with epoch \(envelope.epoch), "
                    + "whose key this node does not hold"
            )
        }
        do {
            let box = try ChaChaPoly.SealedBox(combined: envelope.sealed)
            return Array(try ChaChaPoly.open(box, using: key, authenticating: envelope.header))
        } catch {
            throw ShoalError(
                code: .sealBroken,
                message: "a change set of site \(envelope.site.hex.prefix(8)) (after seq \(envelope.from), chunk "
                    + "\(envelope.index)) fails its seal: not sealed with this cluster's key, or altered; nothing of it "
                    + "was applied"
            )
        }
    }
}
