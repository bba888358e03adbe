import Foundation
import ShoalCore
import ShoalRelayProtocol

@testable import ShoalRelayClient

/// A relay's key-epoch storage, as ``RelayStorage`` keeps it: the epochs started, the grants in the mailbox (one per
/// epoch and recipient, the first kept), the upload keys (registered by uploads or set by rotations) and the tokens
/// (active, or retired by a rotation at an epoch). A value, so it can be copied and put back (a restore).
struct ModelEpochRelay {
    var epochs: Set<UInt32> = []
    var grants: [String: RelayGrant] = [:]
    var uploadKeys: [UInt32: String] = [:]
    /// Token hash → nil while active, or the epoch whose rotation retired it.
    var tokens: [String: UInt32?] = [:]

    /// An empty relay whose operator made `token`.
    init(token: String) { tokens[RelayAPI.tokenHash(token)] = .some(nil) }

    var newest: UInt32 { epochs.max() ?? 0 }

    func isActive(_ token: String) -> Bool {
        guard let state = tokens[RelayAPI.tokenHash(token)] else { return false }
        return state == nil
    }

    /// Its operator makes `token` valid again (after a restore, or an empty start).
    mutating func activate(_ token: String) { tokens[RelayAPI.tokenHash(token)] = .some(nil) }

    private func authorize(_ token: String, allowRotated: Bool = false) throws(RelayCallError) {
        guard let state = tokens[RelayAPI.tokenHash(token)] else {
            throw .unauthorized("unknown token", token: token)
        }
        if let epoch = state, !allowRotated {
            throw .rotated("retired at epoch \(epoch)", token: token)
        }
    }

    /// `GET /v1/grants` (a retired token may read them).
    func grants(after: UInt32, recipient: NodeID?, token: String) throws(RelayCallError) -> RelayGrants {
        try authorize(token, allowRotated: true)
        let name = recipient?.description
        let listed = grants.values.filter { $0.epoch > after && (name == nil || $0.recipient == name) }
            .sorted { ($0.epoch, $0.recipient) < ($1.epoch, $1.recipient) }
        return RelayGrants(grants: listed, epoch: newest)
    }

    /// `POST /v1/grants`: keeps grants of epochs that exist; returns those stored.
    mutating func post(_ posted: [RelayGrant], token: String) throws(RelayCallError) -> [RelayGrant] {
        try authorize(token)
        var stored: [RelayGrant] = []
        for grant in posted where grant.epoch >= 1 && grant.epoch <= newest && grants[key(grant)] == nil {
            grants[key(grant)] = grant
            stored.append(grant)
        }
        return stored
    }

    /// `POST /v1/rotate`: returns the grants stored.
    mutating func rotate(_ rotation: RelayRotation, token: String) throws(RelayCallError) -> [RelayGrant] {
        try authorize(token)
        guard rotation.epoch == newest + 1 else { throw .conflict(epoch: newest, "the newest epoch is \(newest)") }
        epochs.insert(rotation.epoch)
        var stored: [RelayGrant] = []
        for grant in rotation.grants where grant.epoch == rotation.epoch && grants[key(grant)] == nil {
            grants[key(grant)] = grant
            stored.append(grant)
        }
        if let uploadKey = rotation.uploadKey { uploadKeys[rotation.epoch] = uploadKey }
        for (hash, state) in tokens where state == nil { tokens[hash] = .some(rotation.epoch) }
        tokens[rotation.tokenHash] = .some(nil)
        return stored
    }

    /// An upload sealed with `epoch`, authenticated with `key` (registered when the relay holds none for it).
    mutating func upload(epoch: UInt32, key: String?, token: String) throws(RelayCallError) {
        try authorize(token)
        guard epoch >= newest else { throw .epochRetired("epoch \(epoch) retired", token: token) }
        guard let key else { throw .local(ShoalError(code: .sealBroken, message: "no upload key")) }
        if let held = uploadKeys[epoch] {
            guard held == key else { throw .epochRetired("another upload key for epoch \(epoch)", token: token) }
        } else {
            uploadKeys[epoch] = key
        }
    }

    private func key(_ grant: RelayGrant) -> String { "\(grant.epoch) \(grant.recipient)" }
}
