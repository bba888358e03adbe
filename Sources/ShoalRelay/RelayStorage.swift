import ShoalCore
import ShoalRelayProtocol

/// A bearer token as the relay keeps it: only its hash, the one cluster it reaches, and whether it was revoked.
public struct RelayToken: Hashable, Sendable {
    /// SHA-256 of the token, hex: the token itself is never stored.
    public var hash: String
    /// The only cluster the token reaches.
    public var cluster: String
    /// A name the operator gave it.
    public var label: String
    /// When it was made (Unix milliseconds).
    public var created: Int64
    /// When it was revoked, if it was.
    public var revoked: Int64?
    /// The key epoch whose rotation retired it, if that is how it was revoked.
    public var rotatedAtEpoch: UInt32?
}

/// How a rotation went.
public enum RelayRotationOutcome: Sendable, Hashable {
    /// The epoch began; the cluster's earlier tokens are retired.
    case rotated
    /// Another rotation got there first: the cluster's newest epoch is this.
    case taken(current: UInt32)
}

/// What a relay holds for one cluster, for operators: counts and sizes only, never contents.
public struct RelayClusterStatistics: Hashable, Sendable {
    /// The cluster.
    public var cluster: String
    /// Sites with at least one range.
    public var sites: Int
    /// Ranges held.
    public var ranges: Int
    /// Chunks of those ranges.
    public var chunks: Int
    /// Their size in bytes.
    public var bytes: Int64
}

/// A page of a pull: the encoded envelopes, in an order the node can apply, and whether more remain.
public struct RelayPage: Sendable {
    /// Each envelope's bytes, exactly as uploaded.
    public var envelopes: [[UInt8]]
    /// Whether the relay holds more than this page carried.
    public var more: Bool
}

/// Where a relay keeps tokens and change sets. Every method is safe to call from any task; a pull's answer depends
/// only on its arguments and what is stored, never on earlier requests, so any instance of a relay sharing one
/// storage answers any request.
public protocol RelayStorage: Sendable {
    /// Makes a token for `cluster` and returns it; only its hash is kept.
    func createToken(cluster: String, label: String) async throws(ShoalError) -> String
    /// Revokes every token whose hash or token is `token`, or every token of cluster `token` when `wholeCluster`;
    /// returns how many were revoked.
    func revokeTokens(matching token: String, wholeCluster: Bool) async throws(ShoalError) -> Int
    /// Every token, revoked ones included.
    func tokens() async throws(ShoalError) -> [RelayToken]
    /// The token whose SHA-256 is `hash`, if one was made.
    func token(hash: String) async throws(ShoalError) -> RelayToken?
    /// The head per site of `cluster`.
    func heads(cluster: String) async throws(ShoalError) -> VersionVector
    /// Stores what the relay lacks of `envelopes` (all of `cluster`), in one transaction; `uploader` names the
    /// uploading process (``RelayAPI/uploaderHeader``).
    func store(
        cluster: String,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult
    /// The change sets `vector` lacks, from `resume` points on, up to about `maximumBytes`, leaving out the ranges
    /// `uploader` uploaded.
    func page(
        cluster: String,
        vector: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        maximumBytes: Int,
        uploader: String?
    ) async throws(ShoalError) -> RelayPage
    /// Drops chunks of uploads that never completed, received before `milliseconds` (Unix); returns how many.
    func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int
    /// Starts key epoch `epoch` of `cluster` if it follows the newest: stores its grants and its upload key, retires
    /// every token of the cluster and adds the one whose hash is `tokenHash`, all in one transaction.
    func rotate(cluster: String, epoch: UInt32, tokenHash: String, grants: [RelayGrant], uploadKey: [UInt8]?)
        async throws(ShoalError) -> RelayRotationOutcome
    /// The upload key of an epoch of `cluster`, if one was registered.
    func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> [UInt8]?
    /// Registers the upload key of an epoch unless one is there; `false` when another key is.
    func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool
    /// Adds grants for epochs that exist (ignoring those already held); returns how many were stored.
    func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int
    /// The grants of epochs after `epoch`, and the newest epoch.
    func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants
    /// Counts and sizes per cluster.
    func statistics() async throws(ShoalError) -> [RelayClusterStatistics]
}
