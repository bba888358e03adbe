import Foundation
import ShoalCore

/// What a node learnt of the relay's key epochs: each epoch's secret, the nodes removed when it began, and the relay
/// token of the newest. Kept beside the database (`PATH.shoal-relay-keys`, mode 600), replaced whole.
public struct RelayKeyring: Codable, Sendable, Hashable {
    /// One epoch.
    public struct Epoch: Codable, Sendable, Hashable {
        /// The epoch's number, from 1 (epoch 0 is the cluster secret itself).
        public var epoch: UInt32
        /// Its secret, base64.
        public var secret: String
        /// The nodes removed from the cluster when it began (node ids as people write them).
        public var removed: [String]
    }

    /// The epochs, oldest first.
    public var epochs: [Epoch] = []
    /// The relay token of the newest epoch, once a rotation replaced the configured one.
    public var token: String?

    /// An empty keyring.
    public init() {}

    /// The keyring file of the database at `databasePath`.
    public static func path(forDatabase databasePath: String) -> String { databasePath + ".shoal-relay-keys" }

    /// The keyring at `path`, or an empty one when there is none.
    public static func load(_ path: String) throws(ShoalError) -> RelayKeyring {
        guard FileManager.default.fileExists(atPath: path) else { return RelayKeyring() }
        do {
            return try JSONDecoder().decode(RelayKeyring.self, from: Data(contentsOf: URL(fileURLWithPath: path)))
        } catch {
            throw ShoalError(code: .corruptMetadata, message: "the relay keyring \(path) cannot be read: \(error)")
        }
    }

    /// Writes the keyring to `path` (mode 600), beside and renamed, so a crash leaves the old one or the new one.
    public func save(_ path: String) throws(ShoalError) {
        let temporary = path + ".new"
        do {
            let data = try JSONEncoder().encode(self)
            guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600])
            else { throw ShoalError(code: .invalidArgument, message: "cannot write \(temporary)") }
            guard rename(temporary, path) == 0 else {
                throw ShoalError(code: .invalidArgument, message: "cannot replace \(path): \(String(cString: strerror(errno)))")
            }
        } catch let error as ShoalError {
            throw error
        } catch {
            throw ShoalError(code: .invalidArgument, message: "cannot write the relay keyring \(path): \(error)")
        }
    }

    /// Each epoch's secret by number, with the cluster secret as epoch 0.
    public func secrets(clusterSecret: [UInt8]) -> [UInt32: [UInt8]] {
        var secrets: [UInt32: [UInt8]] = [0: clusterSecret]
        for epoch in epochs {
            if let data = Data(base64Encoded: epoch.secret) { secrets[epoch.epoch] = Array(data) }
        }
        return secrets
    }

    /// The newest epoch held (0: none beyond the cluster secret).
    public var newest: UInt32 { epochs.map(\.epoch).max() ?? 0 }

    /// Every node removed when some epoch held began.
    public var removed: Set<String> { Set(epochs.flatMap(\.removed)) }

    /// The nodes removed when the newest epoch held began: those it is sealed without. An older epoch may exclude more
    /// (a member that never held the newer ones started it afresh at a relay that lost them, and the newer ones were
    /// started again on top of it), and that does not keep them from the newest.
    public var removedFromNewest: Set<String> { Set(epochs.max { $0.epoch < $1.epoch }?.removed ?? []) }
}
