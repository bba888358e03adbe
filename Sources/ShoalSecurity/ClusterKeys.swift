import Crypto

/// Derives purpose-specific keys from a cluster secret, so that no two uses
/// ever share a key.
public enum ClusterKeys {
    /// The fixed HKDF salt of every derivation.
    public static let salt: [UInt8] = Array("shoal/cluster-keys/v1".utf8)

    /// The prefix of the HKDF info; the purpose follows it.
    public static let infoPrefix = "shoal/"

    /// The largest key HKDF-SHA-256 can produce: 255 blocks of 32 bytes.
    public static let maximumLength = 255 * 32

    /// Derives a key for one purpose with HKDF-SHA-256 (RFC 5869):
    /// input key material `secret`, salt ``salt``, info `"shoal/" + purpose`
    /// (UTF-8), output `length` bytes.
    ///
    /// Different purposes give independent keys; the same inputs always give
    /// the same key.
    ///
    /// - Parameters:
    ///   - secret: The cluster secret.
    ///   - purpose: A fixed label naming the use, e.g. `"replication/aead"`.
    ///   - length: The key length in bytes, 1 through ``maximumLength``;
    ///     a length outside that range is a programming error and traps.
    public static func derive(secret: SymmetricKey, purpose: String, length: Int = 32) -> SymmetricKey {
        precondition((1...maximumLength).contains(length), "ClusterKeys: length must be 1...\(maximumLength)")
        return HKDF<SHA256>.deriveKey(
            inputKeyMaterial: secret,
            salt: salt,
            info: Array((infoPrefix + purpose).utf8),
            outputByteCount: length)
    }
}
