import Crypto
import Foundation
import ShoalCore

/// The cluster a node belongs to: its id (not secret: hellos carry it) and its secret, shared by members only,
/// from which keys are derived by purpose (``ClusterKeys``).
public struct ClusterCredentials: Sendable, Hashable {
    /// 16 bytes: the first half of the founding member's node id, so the roster's first record proves it.
    public var id: [UInt8]
    /// 32 random bytes, made by the founder and handed to each member when it joins.
    public var secret: [UInt8]

    /// Credentials as stored.
    public init(id: [UInt8], secret: [UInt8]) {
        self.id = id
        self.secret = secret
    }

    /// A new cluster of one, founded by `founder`.
    public static func founded(by founder: NodeID) -> ClusterCredentials {
        ClusterCredentials(id: Array(founder.bytes.prefix(16)), secret: SymmetricKey(size: .bits256).bytes)
    }

    /// The id as people and hellos see it: 32 hexadecimal digits.
    public var idHex: String { id.map { String(format: "%02x", $0) }.joined() }
}

/// The file beside a database (`PATH.shoal-key`) holding the node's private key and its cluster's credentials.
///
/// Created with mode 0600 and refused when anyone but its owner may read it, as ssh does with private keys. Two
/// PEM blocks: the key (PKCS#8, `PRIVATE KEY`), and `SHOAL CLUSTER` (a version byte, the 16-byte cluster id, the
/// 32-byte secret). Replaced whole (written beside and renamed), never edited in place.
public struct KeyFile: Sendable {
    /// The node's key.
    public var identity: NodeIdentity
    /// The cluster it belongs to.
    public var cluster: ClusterCredentials

    /// A key and the cluster it belongs to.
    public init(identity: NodeIdentity, cluster: ClusterCredentials) {
        self.identity = identity
        self.cluster = cluster
    }

    /// Where the key file of the database at `databasePath` is.
    public static func path(forDatabase databasePath: String) -> String { databasePath + ".shoal-key" }

    /// Whether the database has a key file.
    public static func exists(forDatabase databasePath: String) -> Bool {
        FileManager.default.fileExists(atPath: path(forDatabase: databasePath))
    }

    /// Reads the key file of the database at `databasePath`.
    public static func load(forDatabase databasePath: String) throws(ShoalError) -> KeyFile {
        let path = path(forDatabase: databasePath)
        var status = stat()
        guard stat(path, &status) == 0 else {
            throw ShoalError(
                code: .identity,
                message: "no node key at \(path): run `shoal init --db \(databasePath)` to make one (with "
                    + "`--new-key` if the database belongs to a cluster, a copy of a member's file: it is then another "
                    + "node, with a site of its own)"
            )
        }
        guard status.st_mode & 0o077 == 0 else {
            throw ShoalError(
                code: .identity,
                message: "the node key \(path) may be read by others (mode \(String(status.st_mode & 0o777, radix: 8))); "
                    + "run `chmod 600 \(path)`"
            )
        }
        guard status.st_uid == geteuid() else {
            throw ShoalError(code: .identity, message: "the node key \(path) belongs to another user")
        }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw ShoalError(code: .identity, message: "cannot read the node key \(path)")
        }
        return try parse(text, path: path)
    }

    static func parse(_ text: String, path: String) throws(ShoalError) -> KeyFile {
        func block(_ label: String) -> String? {
            guard let start = text.range(of: "-----BEGIN \(label)-----"),
                let end = text.range(of: "-----END \(label)-----", range: start.upperBound..<text.endIndex)
            else { return nil }
            return String(text[start.lowerBound..<end.upperBound])
        }
        guard let keyPEM = block("PRIVATE KEY"), let key = try? P256.Signing.PrivateKey(pemRepresentation: keyPEM) else {
            throw ShoalError(code: .identity, message: "\(path) holds no P-256 private key")
        }
        guard let clusterPEM = block("SHOAL CLUSTER"),
            let body = Data(
                base64Encoded: clusterPEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
            ),
            body.count == 49, body.first == 1
        else {
            throw ShoalError(code: .identity, message: "\(path) holds no readable cluster block")
        }
        let bytes = Array(body)
        return KeyFile(
            identity: NodeIdentity(privateKey: key),
            cluster: ClusterCredentials(id: Array(bytes[1..<17]), secret: Array(bytes[17..<49]))
        )
    }

    /// The file's text.
    var text: String {
        let cluster = Data([1] + cluster.id + cluster.secret).base64EncodedString()
        return """
            \(identity.privateKey.pemRepresentation)
            -----BEGIN SHOAL CLUSTER-----
            \(cluster)
            -----END SHOAL CLUSTER-----

            """
    }

    /// Writes the file for the database at `databasePath` (mode 0600), replacing any: written beside it, flushed,
    /// then renamed over it, so a crash leaves the old file or the new one.
    public func save(forDatabase databasePath: String) throws(ShoalError) {
        let path = Self.path(forDatabase: databasePath)
        let temporary = path + ".tmp-\(getpid())"
        unlink(temporary)
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw ShoalError(code: .identity, message: "cannot write \(temporary): \(String(cString: strerror(errno)))")
        }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == bytes.count, synced, rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw ShoalError(code: .identity, message: "cannot write \(path): \(reason)")
        }
    }
}

extension SymmetricKey {
    /// The key's bytes.
    var bytes: [UInt8] { withUnsafeBytes { Array($0) } }
}
