import ShoalCore
import ShoalRelayProtocol

/// A storage whose rules are ``RelayRules``: SQLite and PostgreSQL differ only in the database the rules run on.
protocol RulesRelayStorage: RelayStorage {
    associatedtype Database: RelayDatabase
    /// The rules, over this storage's database.
    var rules: RelayRules<Database> { get }
}

/// Every request of a ``RulesRelayStorage`` is handed to its rules.
extension RulesRelayStorage {
    /// See ``RelayStorage``.
    public func createToken(cluster: String, label: String) async throws(ShoalError) -> String {
        try await rules.createToken(cluster: cluster, label: label)
    }

    /// See ``RelayStorage``.
    public func revokeTokens(matching token: String, wholeCluster: Bool) async throws(ShoalError) -> Int {
        try await rules.revokeTokens(matching: token, wholeCluster: wholeCluster)
    }

    /// See ``RelayStorage``.
    public func tokens() async throws(ShoalError) -> [RelayToken] { try await rules.tokens() }

    /// See ``RelayStorage``.
    public func token(hash: String) async throws(ShoalError) -> RelayToken? { try await rules.token(hash: hash) }

    /// See ``RelayStorage``.
    public func heads(cluster: String) async throws(ShoalError) -> VersionVector {
        try await rules.heads(cluster: cluster)
    }

    /// See ``RelayStorage``.
    public func store(
        cluster: String,
        snapshot: UInt64,
        envelopes: [(envelope: RelayEnvelope, encoded: [UInt8])],
        uploader: String?
    ) async throws(ShoalError) -> RelayUploadResult {
        try await rules.store(cluster: cluster, snapshot: snapshot, envelopes: envelopes, uploader: uploader)
    }

    /// See ``RelayStorage``.
    public func completeSnapshot(
        cluster: String,
        snapshot: UInt64,
        vector: VersionVector,
        retention: RelayRetention
    )
        async throws(ShoalError) -> RelaySnapshotOutcome
    {
        try await rules.completeSnapshot(cluster: cluster, snapshot: snapshot, vector: vector, retention: retention)
    }

    /// See ``RelayStorage``.
    public func snapshotState(
        cluster: String
    ) async throws(ShoalError) -> (snapshot: RelaySnapshot?, uncoveredBytes: Int64) {
        let state = try await rules.snapshotState(cluster: cluster)
        return (state.snapshot, state.uncoveredBytes)
    }

    /// See ``RelayStorage``.
    public func retain(_ retention: RelayRetention) async throws(ShoalError) -> Int {
        try await rules.retain(retention)
    }

    /// See ``RelayStorage``.
    public func page(
        cluster: String,
        vector: VersionVector,
        resume: [SiteID: (from: UInt64, index: UInt32)],
        snapshotSites: Set<SiteID>,
        maximumBytes: Int,
        uploader: String?
    ) async throws(ShoalError) -> RelayPage {
        try await rules.page(
            cluster: cluster,
            vector: vector,
            resume: resume,
            snapshotSites: snapshotSites,
            maximumBytes: maximumBytes,
            uploader: uploader
        )
    }

    /// See ``RelayStorage``.
    public func sweep(before milliseconds: Int64) async throws(ShoalError) -> Int {
        try await rules.sweep(before: milliseconds)
    }

    /// See ``RelayStorage``.
    public func rotate(
        cluster: String,
        epoch: UInt32,
        tokenHash: String,
        grants: [RelayGrant],
        uploadKey: [UInt8]?
    )
        async throws(ShoalError) -> RelayRotationOutcome
    {
        try await rules.rotate(
            cluster: cluster,
            epoch: epoch,
            tokenHash: tokenHash,
            grants: grants,
            uploadKey: uploadKey
        )
    }

    /// See ``RelayStorage``.
    public func uploadKey(cluster: String, epoch: UInt32) async throws(ShoalError) -> (key: [UInt8]?, newest: UInt32) {
        let state = try await rules.uploadKey(cluster: cluster, epoch: epoch)
        return (state.key, state.newest)
    }

    /// See ``RelayStorage``.
    public func registerUploadKey(cluster: String, epoch: UInt32, key: [UInt8]) async throws(ShoalError) -> Bool {
        try await rules.registerUploadKey(cluster: cluster, epoch: epoch, key: key)
    }

    /// See ``RelayStorage``.
    public func addGrants(cluster: String, grants: [RelayGrant]) async throws(ShoalError) -> Int {
        try await rules.addGrants(cluster: cluster, grants: grants)
    }

    /// See ``RelayStorage``.
    public func grants(cluster: String, after epoch: UInt32) async throws(ShoalError) -> RelayGrants {
        try await rules.grants(cluster: cluster, after: epoch)
    }

    /// See ``RelayStorage``.
    public func ping() async throws(ShoalError) { try await rules.ping() }

    /// See ``RelayStorage``.
    public func statistics() async throws(ShoalError) -> [RelayClusterStatistics] { try await rules.statistics() }
}
