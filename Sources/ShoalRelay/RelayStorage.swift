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

/// A complete snapshot of a cluster as the relay keeps it: a sealed change stream from the empty vector, cut in
/// ranges per site like any upload, covering `vector`.
public struct RelaySnapshot: Hashable, Sendable {
    /// Its id (1 to 2^63 - 1, chosen by the uploader).
    public var id: UInt64
    /// What it covers.
    public var vector: VersionVector
    /// Its sealed size.
    public var bytes: Int64
    /// When it was completed (Unix milliseconds).
    public var created: Int64

    /// A snapshot's description.
    public init(id: UInt64, vector: VersionVector, bytes: Int64, created: Int64) {
        self.id = id
        self.vector = vector
        self.bytes = bytes
        self.created = created
    }
}

/// How long change sets the newest snapshot covers are kept: a node whose vector is older than what is kept gets the
/// snapshot and what follows it. Change sets the snapshot does not cover are never dropped.
public struct RelayRetention: Hashable, Sendable {
    /// Covered change sets older than this go.
    public var maximumAgeMilliseconds: Int64
    /// Covered change sets beyond this many bytes per cluster go, oldest first.
    public var maximumBytes: Int64

    /// A retention of `maximumAgeMilliseconds` and `maximumBytes`.
    public init(maximumAgeMilliseconds: Int64, maximumBytes: Int64) {
        self.maximumAgeMilliseconds = maximumAgeMilliseconds
        self.maximumBytes = maximumBytes
    }
}

/// How completing a snapshot went.
public enum RelaySnapshotOutcome: Hashable, Sendable {
    /// It is the cluster's snapshot now; `dropped` ranges it covers went under the retention.
    case completed(dropped: Int)
    /// Some of it is missing (the reason says what): nothing changed.
    case incomplete(String)
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
    /// Stores what the relay lacks of `envelopes` (all of `cluster`), in one transaction: into the change log when
    /// `snapshot` is 0, into that snapshot otherwise; `uploader` names the uploading process
    /// (``RelayAPI/uploaderHeader``).
    func store(
        cluster: String,
        snapshot: UInt64,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult
    /// Makes snapshot `snapshot` the cluster's, if its ranges run from 0 to `vector` for every site; then drops older
    /// snapshots and the change sets it covers that `retention` lets go.
    func completeSnapshot(cluster: String, snapshot: UInt64, vector: VersionVector, retention: RelayRetention)
        async throws(ShoalError) -> RelaySnapshotOutcome
    /// The cluster's newest complete snapshot, and the bytes of change sets it does not cover.
    func snapshotState(cluster: String) async throws(ShoalError) -> (snapshot: RelaySnapshot?, uncoveredBytes: Int64)
    /// Drops, in every cluster, the change sets its snapshot covers that `retention` lets go; returns how many ranges.
    func retain(_ retention: RelayRetention) async throws(ShoalError) -> Int
    /// The change sets `vector` lacks, from `resume` points on, up to about `maximumBytes`, leaving out the ranges
    /// `uploader` uploaded. Where the relay no longer keeps what a site lacks (dropped under the retention), or the
    /// site is one of `snapshotSites`, the snapshot's ranges of that site come first, then the change log's after it.
    func page(
        cluster: String,
        vector: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        snapshotSites: Set<SiteID>,
        maximumBytes: Int,
        uploader: String?
    ) async throws(ShoalError) -> RelayPage
    /// Drops chunks of uploads that never completed, received before `milliseconds` (Unix); returns how many.
    func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int
    /// Starts key epoch `epoch` of `cluster` if it follows the newest: stores its grants and its upload key, retires
    /// every token of the cluster and adds the one whose hash is `tokenHash`, all in one transaction.
    func rotate(cluster: String, epoch: UInt32, tokenHash: String, grants: [RelayGrant], uploadKey: [UInt8]?)
        async throws(ShoalError) -> RelayRotationOutcome
    /// The upload key of an epoch of `cluster`, if one was registered, and the cluster's newest epoch (0 before any
    /// rotation): an upload under an older epoch than the newest is refused (a removed member holds the old keys).
    func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> (key: [UInt8]?, newest: UInt32)
    /// Registers the upload key of an epoch unless one is there; `false` when another key is.
    func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool
    /// Adds grants for epochs that exist (ignoring those already held); returns how many were stored.
    func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int
    /// The grants of epochs after `epoch`, and the newest epoch.
    func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants
    /// Reads nothing but proves the storage answers (the relay's health probe).
    func ping() async throws(ShoalError)
    /// Counts and sizes per cluster.
    func statistics() async throws(ShoalError) -> [RelayClusterStatistics]
    /// Calls `changed` with a cluster each time any process sharing this storage stored change sets, grants or a
    /// rotation in it, and with `nil` when some such news may have been missed (every cluster may have changed); runs
    /// until cancelled. A storage no other process shares returns at once: the server wakes its own pulls.
    func watch(_ changed: @escaping @Sendable (String?) async -> Void) async
    /// Releases connections and threads; the storage is not used afterwards.
    func close() async
}

extension RelayStorage {
    /// Stores into the change log (see ``store(cluster:snapshot:envelopes:uploader:)``).
    public func store(
        cluster: String,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult {
        try await store(cluster: cluster, snapshot: 0, envelopes: envelopes, uploader: uploader)
    }
}
