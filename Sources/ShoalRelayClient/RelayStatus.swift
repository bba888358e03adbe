/// The relay as a node sees it, for `shoal status` and the library API.
public struct RelayStatus: Sendable, Hashable, Codable {
    /// The relay's URL.
    public var url: String
    /// Whether the relay answered the last request (`nil`: not tried yet).
    public var reachable: Bool?
    /// Since when it has (or has not) answered, Unix milliseconds.
    public var sinceMs: UInt64?
    /// When an upload last succeeded.
    public var lastPushMs: UInt64?
    /// When a pull last succeeded.
    public var lastPullMs: UInt64?
    /// Transactions this node holds that the relay lacks (its own and those it learnt from peers); nil until the
    /// relay's heads were read once.
    public var lacking: UInt64?
    /// Since when the relay has lacked some of them, without a break: the age of the oldest it lacks, at most.
    public var lackingSinceMs: UInt64?
    /// When this node last uploaded a snapshot.
    public var lastSnapshotMs: UInt64?
    /// The last failure, in words.
    public var lastError: String?
    /// When the last failure happened.
    public var lastErrorMs: UInt64?
    /// The relay refused the token (wrong, revoked, or for another cluster): the node retries only rarely.
    public var unauthorized = false
    /// Change-set chunks uploaded and received since the node started.
    public var uploaded: UInt64 = 0
    /// Change-set chunks received since the node started.
    public var received: UInt64 = 0
    /// Changes applied from the relay since the node started.
    public var applied: UInt64 = 0
    /// The bytes of the change batches this node cut into change sets for upload since it started, before compression.
    public var plaintextBytes: UInt64 = 0
    /// The bytes of the sealed bodies it cut them into (compressed before sealing, where that paid).
    public var sealedBytes: UInt64 = 0
    /// The newest key epoch this node seals with (0: the cluster secret; each removal of a member starts a new one).
    public var epoch: UInt32 = 0
    /// Why the relay cannot be used right now, by cause (nil: nothing stands in the way).
    public var problem: RelayProblem?

    /// The status of a relay not tried yet.
    public init(url: String) {
        self.url = url
    }

    private enum CodingKeys: String, CodingKey {
        case url, reachable, sinceMs, lastPushMs, lastPullMs, lacking, lackingSinceMs, lastSnapshotMs, lastError, lastErrorMs
        case unauthorized, uploaded, received, applied, epoch, problem, plaintextBytes, sealedBytes
    }

    /// Decodes what any build wrote: fields a build did not write take their defaults (a status file outlives the
    /// node that wrote it, and `shoal status` may be newer or older).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        url = try container.decodeIfPresent(String.self, forKey: .url) ?? ""
        reachable = try container.decodeIfPresent(Bool.self, forKey: .reachable)
        sinceMs = try container.decodeIfPresent(UInt64.self, forKey: .sinceMs)
        lastPushMs = try container.decodeIfPresent(UInt64.self, forKey: .lastPushMs)
        lastPullMs = try container.decodeIfPresent(UInt64.self, forKey: .lastPullMs)
        lacking = try container.decodeIfPresent(UInt64.self, forKey: .lacking)
        lackingSinceMs = try container.decodeIfPresent(UInt64.self, forKey: .lackingSinceMs)
        lastSnapshotMs = try container.decodeIfPresent(UInt64.self, forKey: .lastSnapshotMs)
        lastError = try container.decodeIfPresent(String.self, forKey: .lastError)
        lastErrorMs = try container.decodeIfPresent(UInt64.self, forKey: .lastErrorMs)
        unauthorized = try container.decodeIfPresent(Bool.self, forKey: .unauthorized) ?? false
        uploaded = try container.decodeIfPresent(UInt64.self, forKey: .uploaded) ?? 0
        received = try container.decodeIfPresent(UInt64.self, forKey: .received) ?? 0
        applied = try container.decodeIfPresent(UInt64.self, forKey: .applied) ?? 0
        epoch = try container.decodeIfPresent(UInt32.self, forKey: .epoch) ?? 0
        plaintextBytes = try container.decodeIfPresent(UInt64.self, forKey: .plaintextBytes) ?? 0
        sealedBytes = try container.decodeIfPresent(UInt64.self, forKey: .sealedBytes) ?? 0
        problem = try? container.decodeIfPresent(RelayProblem.self, forKey: .problem)
    }
}

/// Why a relay cannot be used, by cause: what a person checks first differs for each.
public enum RelayProblem: String, Sendable, Hashable, Codable {
    /// Nothing answered at its address (refused, timed out, closed).
    case unreachable
    /// It answered, but its TLS certificate is not trusted here (give its CA with `--relay-ca`).
    case untrustedCertificate = "untrusted-certificate"
    /// It answered with a certificate made for another host name.
    case wrongHost = "wrong-host"
    /// TLS failed for another reason.
    case tlsFailed = "tls-failed"
    /// It answered that its storage is down (503).
    case storageDown = "storage-down"
    /// It answered with a server error.
    case serverError = "server-error"

    /// The cause in a few words, for `shoal status`.
    public var words: String {
        switch self {
        case .unreachable: "unreachable"
        case .untrustedCertificate: "answers, but its TLS certificate is not trusted here"
        case .wrongHost: "answers, but its TLS certificate is for another host"
        case .tlsFailed: "answers, but TLS fails"
        case .storageDown: "answers, but its storage is down"
        case .serverError: "answers with server errors"
        }
    }
}

