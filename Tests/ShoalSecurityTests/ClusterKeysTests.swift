import Crypto
import Testing
@testable import ShoalSecurity

private func bytes(of key: SymmetricKey) -> [UInt8] {
    key.withUnsafeBytes { Array($0) }
}

@Suite("ClusterKeys")
struct ClusterKeysTests {
    let secret = SymmetricKey(data: (0..<32).map(UInt8.init))

    @Test("different purposes give different keys; the same purpose the same key")
    func purposes() {
        let purposes = ["replication/aead", "replication/mac", "invite/seal", "", "replication/aead "]
        let keys = purposes.map { bytes(of: ClusterKeys.derive(secret: secret, purpose: $0)) }
        #expect(Set(keys).count == purposes.count)
        #expect(keys[0] == bytes(of: ClusterKeys.derive(secret: secret, purpose: "replication/aead")))
        #expect(keys.allSatisfy { $0.count == 32 })
    }

    @Test("different secrets give different keys")
    func secrets() {
        let other = SymmetricKey(data: [UInt8](repeating: 1, count: 32))
        #expect(bytes(of: ClusterKeys.derive(secret: secret, purpose: "x"))
            != bytes(of: ClusterKeys.derive(secret: other, purpose: "x")))
    }

    @Test("lengths are honoured; a longer key extends the shorter one (HKDF-Expand)")
    func lengths() {
        let short = bytes(of: ClusterKeys.derive(secret: secret, purpose: "p", length: 16))
        let long = bytes(of: ClusterKeys.derive(secret: secret, purpose: "p", length: 64))
        #expect(short.count == 16 && long.count == 64)
        #expect(Array(long.prefix(16)) == short)
        #expect(bytes(of: ClusterKeys.derive(secret: secret, purpose: "p", length: ClusterKeys.maximumLength)).count == 8160)
    }

    @Test("is HKDF-SHA-256 with the documented salt and info")
    func construction() {
        // RFC 5869 by hand: PRK = HMAC(salt, IKM); T(1) = HMAC(PRK, info ‖ 0x01).
        let prk = HMAC<SHA256>.authenticationCode(for: secret.withUnsafeBytes { Array($0) },
                                                  using: SymmetricKey(data: Array("shoal/cluster-keys/v1".utf8)))
        let t1 = HMAC<SHA256>.authenticationCode(for: Array("shoal/replication".utf8) + [0x01],
                                                 using: SymmetricKey(data: Array(prk)))
        #expect(bytes(of: ClusterKeys.derive(secret: secret, purpose: "replication")) == Array(t1))
    }
}
