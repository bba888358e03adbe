import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity

/// How a node uses a relay.
public struct RelayClientConfiguration: Sendable {
    /// The relay's base URL: `https://HOST[:PORT]`, or `http://` to a loopback address.
    public var url: String
    /// Other instances of the same relay (sharing its storage), tried in turn when the one in use does not answer: a
    /// pull resumes on the next at once, from the node's version vector.
    public var otherURLs: [String] = []
    /// The bearer token (`shoal relay token create`).
    public var token: String
    /// The node's cluster id (what the token was made for).
    public var clusterID: String
    /// The cluster secret: epoch 0 of the sealing keys.
    public var clusterSecret: [UInt8]
    /// The node's identity, to open the key grants of later epochs and to sign new ones: without it the node neither
    /// rotates the key when a member is removed nor follows another member's rotation.
    public var identity: NodeIdentity?
    /// The cluster's roster as it stands (who gets grants, who was removed).
    public var roster: (@Sendable () -> Roster)?
    /// Where the epochs learnt and the newest token are kept (``RelayKeyring``); nil: in memory only.
    public var keyringPath: String?
    /// A PEM file of the CA (or the self-signed certificate) to trust instead of the system's roots.
    public var caCertificatePath: String?
    /// The byte budget asked of each pull.
    public var pageBytes = RelayAPI.defaultPageBytes
    /// The largest plaintext sealed into one envelope.
    public var pieceBytes = 1024 * 1024
    /// Whether change sets are compressed (where that pays) before they are sealed. Members of builds before
    /// compression cannot open compressed ones: turn it off while such members pull from the relay.
    public var compression = true
    /// About how many bytes each upload request carries.
    public var requestBytes = 8 * 1024 * 1024
    /// When the change sets the relay's snapshot does not cover grow beyond this many bytes (and beyond the snapshot
    /// itself), a node that holds everything the relay holds uploads a new snapshot; the relay then drops what it
    /// covers, after its retention.
    public var snapshotMinimumBytes: Int64 = 8 * 1024 * 1024
    /// While writes keep coming, uploads start at most this often, and pulls that brought change sets follow one
    /// another at most this often: what a busy moment writes goes up in one request, so a member makes at most about
    /// 100 uploads and 100 pulls a second however fast its app writes (the relay limits each cluster's token, see
    /// `shoal relay serve --rate-limit`). A write after a quiet moment goes up at once. 0: no pacing.
    public var minimumRequestSpacingMilliseconds: UInt64 = 10
    /// How long a pull waits at the relay for new change sets (long-poll).
    public var waitMilliseconds = 25_000
    /// Retries after failures: exponential with jitter between these bounds.
    public var initialBackoffMilliseconds: UInt64 = 250
    /// The longest wait between retries (before jitter).
    public var maximumBackoffMilliseconds: UInt64 = 30_000
    /// After the relay refused the token, the node waits at least this long before trying again.
    public var unauthorizedBackoffMilliseconds: UInt64 = 60_000
    /// Where the link logs.
    public var logger: Logger
    /// The wall clock, for the status's times.
    public var clock: any WallClock = SystemWallClock()

    /// A configuration with the default sizes and backoff.
    public init(url: String, token: String, clusterID: String, clusterSecret: [UInt8], logger: Logger) {
        self.url = url
        self.token = token
        self.clusterID = clusterID
        self.clusterSecret = clusterSecret
        self.logger = logger
    }
}
