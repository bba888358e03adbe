import Crypto
import ShoalCore

/// The relay's HTTP API: paths, headers and the JSON bodies both sides exchange. Change sets travel as
/// ``RelayEnvelopeList`` bodies of type ``RelayAPI/envelopeContentType``.
public enum RelayAPI {
    /// The API version every path starts with.
    public static let prefix = "/v1"
    /// `GET`: the relay's head per site of the token's cluster (``RelayHeads``).
    public static let headsPath = "/v1/heads"
    /// `POST` an envelope list: store what the relay lacks (``RelayUploadResult``).
    public static let changeSetsPath = "/v1/changesets"
    /// `POST` a ``RelayPullRequest``: the change sets its vector lacks, as an envelope list.
    public static let pullPath = "/v1/pull"
    /// `POST` a ``RelayRotation``: start a new key epoch, retire the cluster's tokens, leave grants for members.
    public static let rotatePath = "/v1/rotate"
    /// `GET ?after=N[&recipient=NODE_ID&wait=MS]`: the key grants of epochs after N (``RelayGrants``), only those for
    /// the recipient when one is named, waiting up to `wait` ms for one to arrive; `POST` ``RelayGrants``: add grants (for
    /// members that joined after a rotation). A token retired by a rotation may still read them: each grant opens
    /// only with its recipient's key.
    public static let grantsPath = "/v1/grants"
    /// `POST` a ``RelayUploadKey``: the key uploads of an epoch are authenticated with (first one wins).
    public static let keysPath = "/v1/keys"
    /// `POST /v1/snapshots/ID` an envelope list: chunks of snapshot ID (1 to 2^63 - 1, the uploader's choice), uploaded
    /// as change sets are, with the same authentication; `POST /v1/snapshots/ID/complete` a ``RelaySnapshotCompletion``:
    /// the snapshot covers that vector, and from now on the relay serves it to nodes older than what it keeps.
    public static let snapshotsPath = "/v1/snapshots"
    /// `GET`: whether the relay answers (no token needed).
    public static let healthPath = "/v1/health"
    /// `GET`: the relay's API description, OpenAPI 3.1 JSON (no token needed).
    public static let openAPIPath = "/openapi.json"
    /// The content type of envelope lists.
    public static let envelopeContentType = "application/vnd.shoal.changesets"
    /// On a pull's answer: `1` when the relay holds more than the page carried.
    public static let moreHeader = "Shoal-More"
    /// On uploads: the key epoch the body is authenticated with.
    public static let uploadEpochHeader = "Shoal-Upload-Epoch"
    /// On uploads: HMAC-SHA256 of the body with the epoch's upload key, hex (``uploadAuthentication(_:key:)``): the
    /// relay stores nothing of an upload that does not check, so only holders of the cluster's secret can store.
    public static let uploadAuthHeader = "Shoal-Upload-Auth"
    /// On uploads and pulls: a random id of the uploading process. A pull is not sent back the ranges its own process
    /// uploaded (it holds them), so a node's long-poll is not woken by its own upload.
    public static let uploaderHeader = "Shoal-Uploader"
    /// On the relay's answers: a random id of the relay process, new at every start. A node that sees it change reads
    /// the relay's heads again: a relay restored from an older copy, or another instance, may hold less than the
    /// heads it read before (the read may even have reached the process that was stopping).
    public static let bootHeader = "Shoal-Relay-Boot"
    /// The longest a pull may wait for new change sets before answering empty, in milliseconds.
    public static let maximumWaitMilliseconds = 30_000
    /// The default byte budget of a pull's page.
    public static let defaultPageBytes = 4 * 1024 * 1024
    /// The default largest envelope a relay accepts (its sealed body and header).
    public static let defaultMaximumEnvelopeBytes = 8 * 1024 * 1024
    /// The default largest request body a relay accepts.
    public static let defaultMaximumRequestBytes = 32 * 1024 * 1024

    /// Whether `host` names a loopback address: `localhost`, `::1`, or an IPv4 address in 127.0.0.0/8 written as
    /// four decimal numbers (a name that merely starts with "127." is not one).
    public static func isLoopback(_ host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        if bare == "localhost" || bare == "::1" { return true }
        let parts = bare.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4,
            parts.allSatisfy({ !$0.isEmpty && $0.count <= 3 && $0.allSatisfy(\.isASCII) && UInt8($0) != nil })
        else { return false }
        return parts[0] == "127"
    }

    /// HMAC-SHA256 of `body` with `key`, hex.
    public static func uploadAuthentication(_ body: [UInt8], key: [UInt8]) -> String {
        hex(Array(HMAC<SHA256>.authenticationCode(for: body, using: SymmetricKey(data: key))))
    }

    /// Every bearer token starts with this.
    public static let tokenPrefix = "shoal-relay-"

    /// A new random bearer token: 32 random bytes, written ``tokenPrefix`` and 64 hex digits.
    public static func makeToken() -> String {
        var generator = SystemRandomNumberGenerator()
        return tokenPrefix + hex((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// The SHA-256 of a token, hex: what the relay keeps and looks tokens up by.
    public static func tokenHash(_ token: String) -> String {
        hex(Array(SHA256.hash(data: Array(token.utf8))))
    }

    /// Lowercase hexadecimal.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 15)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// Whether `authentication` (hex) is `body`'s HMAC-SHA256 with `key`, compared in constant time.
    public static func checkUploadAuthentication(_ authentication: String, body: [UInt8], key: [UInt8]) -> Bool {
        let bytes = Array(authentication.utf8)
        guard bytes.count == 64 else { return false }
        var code: [UInt8] = []
        for index in stride(from: 0, to: 64, by: 2) {
            guard let byte = UInt8(String(decoding: bytes[index..<index + 2], as: UTF8.self), radix: 16) else { return false }
            code.append(byte)
        }
        return HMAC<SHA256>.isValidAuthenticationCode(code, authenticating: body, using: SymmetricKey(data: key))
    }

    /// A site id as the JSON bodies write it (32 hex digits).
    public static func key(_ site: SiteID) -> String { site.hex }

    /// A version vector as the JSON bodies write it.
    public static func json(_ vector: VersionVector) -> [String: UInt64] {
        Dictionary(uniqueKeysWithValues: vector.entries.map { (key($0.key), $0.value) })
    }

    /// A version vector from a JSON body; a key that is not a site id is refused.
    public static func vector(_ json: [String: UInt64]) throws(ShoalError) -> VersionVector {
        var vector = VersionVector()
        for (key, seq) in json {
            guard let site = SiteID(hex: key) else {
                throw ShoalError(code: .malformedMessage, message: "\"\(key.prefix(40))\" is not a site id (32 hex digits)")
            }
            vector.advance(site, to: seq)
        }
        return vector
    }
}

/// The relay's head per site: the last sequence number of the last range it holds.
public struct RelayHeads: Codable, Hashable, Sendable {
    /// Site id (hex) → head.
    public var heads: [String: UInt64]
    /// The cluster the token reaches, so a node given another cluster's token can say so.
    public var cluster: String?
    /// The cluster's newest complete snapshot, if it has one.
    public var snapshot: RelaySnapshotInfo?
    /// Bytes of change sets the snapshot does not cover (all of them without a snapshot): when they outgrow the
    /// snapshot, a node that holds everything uploads a new one.
    public var uncoveredBytes: Int64?

    /// Heads as the JSON body writes them.
    public init(heads: [String: UInt64], cluster: String? = nil, snapshot: RelaySnapshotInfo? = nil, uncoveredBytes: Int64? = nil) {
        self.heads = heads
        self.cluster = cluster
        self.snapshot = snapshot
        self.uncoveredBytes = uncoveredBytes
    }
}

/// A complete snapshot as the relay describes it: which, what it covers, its size and age.
public struct RelaySnapshotInfo: Codable, Hashable, Sendable {
    /// Its id (decimal).
    public var id: String
    /// The version vector it covers (site id hex → seq).
    public var vector: [String: UInt64]
    /// Its sealed size in bytes.
    public var bytes: Int64
    /// When it was completed, Unix milliseconds.
    public var createdMs: Int64

    /// A snapshot's description.
    public init(id: String, vector: [String: UInt64], bytes: Int64, createdMs: Int64) {
        self.id = id
        self.vector = vector
        self.bytes = bytes
        self.createdMs = createdMs
    }
}

/// "Snapshot ID is whole, and covers this vector": every site's chain of ranges in it runs from 0 to the vector's seq.
public struct RelaySnapshotCompletion: Codable, Hashable, Sendable {
    /// The version vector the snapshot covers (site id hex → seq).
    public var vector: [String: UInt64]

    /// A completion for a snapshot covering `vector`.
    public init(vector: [String: UInt64]) {
        self.vector = vector
    }
}

/// What an upload did.
public struct RelayUploadResult: Codable, Hashable, Sendable {
    /// Chunks stored now.
    public var stored: Int
    /// Chunks of ranges the relay already held (ignored: uploads are idempotent).
    public var alreadyHeld: Int
    /// Chunks refused because their range does not start at the relay's head for their site: the uploader
    /// cuts again from ``heads``.
    public var gaps: Int
    /// The relay's heads after the upload.
    public var heads: [String: UInt64]

    /// What an upload did.
    public init(stored: Int, alreadyHeld: Int, gaps: Int, heads: [String: UInt64]) {
        self.stored = stored
        self.alreadyHeld = alreadyHeld
        self.gaps = gaps
        self.heads = heads
    }
}

/// "Send me the change sets this vector lacks": the vector is the whole cursor, so any relay instance answers it,
/// after any restart.
public struct RelayPullRequest: Codable, Hashable, Sendable {
    /// Where to carry on inside a range a previous page ended in.
    public struct Resume: Codable, Hashable, Sendable {
        /// The site (hex).
        public var site: String
        /// The range's start.
        public var from: UInt64
        /// The first chunk not received yet.
        public var index: UInt32

    /// Resume at chunk `index` of the range of `site` after `from`.
        public init(site: String, from: UInt64, index: UInt32) {
            self.site = site
            self.from = from
            self.index = index
        }
    }

    /// What the node holds (site id hex → seq).
    public var vector: [String: UInt64]
    /// Ranges a previous page ended inside.
    public var resume: [Resume]?
    /// With nothing new to send, wait up to this long for an upload before answering empty (long-poll).
    public var waitMilliseconds: Int?
    /// The page's byte budget (at least one chunk is always sent).
    public var maximumBytes: Int?
    /// Sites (hex) to serve from the snapshot first, where it holds more of them than `vector`, as when the change log
    /// no longer keeps what the node lacks: a removed member's site the node does not hold up to its fence (the log's
    /// ranges of it may run past the fence, and what they overwrote within it no member can take from them).
    public var snapshotSites: [String]?

    /// The most sites a pull may ask from the snapshot.
    public static let maximumSnapshotSites = 1_024

    /// A pull for what `vector` lacks.
    public init(
        vector: [String: UInt64],
        resume: [Resume]? = nil,
        waitMilliseconds: Int? = nil,
        maximumBytes: Int? = nil,
        snapshotSites: [String]? = nil
    ) {
        self.vector = vector
        self.resume = resume
        self.waitMilliseconds = waitMilliseconds
        self.maximumBytes = maximumBytes
        self.snapshotSites = snapshotSites
    }
}

/// One key grant as the relay keeps it: the epoch, who it is for, and its sealed bytes (base64).
public struct RelayGrant: Codable, Hashable, Sendable {
    /// The key epoch.
    public var epoch: UInt32
    /// The recipient's node id, as a person writes it.
    public var recipient: String
    /// The grant (``EpochGrant`` bytes), base64.
    public var body: String

    /// A grant for `recipient`.
    public init(epoch: UInt32, recipient: String, body: String) {
        self.epoch = epoch
        self.recipient = recipient
        self.body = body
    }
}

/// Key grants, to post or as listed.
public struct RelayGrants: Codable, Hashable, Sendable {
    /// The grants.
    public var grants: [RelayGrant]
    /// The newest epoch of the cluster (in answers).
    public var epoch: UInt32?

    /// A list of grants.
    public init(grants: [RelayGrant], epoch: UInt32? = nil) {
        self.grants = grants
        self.epoch = epoch
    }
}

/// A new key epoch: its number (the relay's newest plus one), the SHA-256 (hex) of the token that replaces the
/// cluster's tokens, and grants for the members.
public struct RelayRotation: Codable, Hashable, Sendable {
    /// The new epoch.
    public var epoch: UInt32
    /// The new token's SHA-256, hex (the token itself travels only inside the grants).
    public var tokenHash: String
    /// The grants of the new epoch.
    public var grants: [RelayGrant]
    /// The new epoch's upload key, base64.
    public var uploadKey: String?

    /// A rotation to `epoch`.
    public init(epoch: UInt32, tokenHash: String, grants: [RelayGrant], uploadKey: String? = nil) {
        self.epoch = epoch
        self.tokenHash = tokenHash
        self.grants = grants
        self.uploadKey = uploadKey
    }
}

/// The key uploads of an epoch are authenticated with, base64.
public struct RelayUploadKey: Codable, Hashable, Sendable {
    /// The key epoch.
    public var epoch: UInt32
    /// The key (32 bytes), base64.
    public var key: String

    /// An epoch's upload key.
    public init(epoch: UInt32, key: String) {
        self.epoch = epoch
        self.key = key
    }
}

/// The body of every refusal: a code for programs, a message for people, and the limit that was hit.
public struct RelayErrorBody: Codable, Hashable, Sendable {
    /// `unauthorized`, `token_rotated` (retired by a key rotation: fetch the grants), `wrong_cluster`, `malformed`,
    /// `no_upload_key` (register it: ``RelayAPI/keysPath``), `epoch_retired` (seal with the newest epoch, from the
    /// grants; ``epoch`` names it), `bad_upload_auth`, `key_conflict`, `too_large`,
    /// `rate_limited`, `epoch_taken`, `snapshot_incomplete`, `not_found`, `internal`, `busy` or
    /// `storage_unavailable` (its storage does not answer: try again after Retry-After).
    public var error: String
    /// For a person.
    public var message: String
    /// The limit that was exceeded (bytes for `too_large`, requests per second for `rate_limited`).
    public var limit: Int?
    /// When to try again, in seconds (also in the `Retry-After` header).
    public var retryAfterSeconds: Int?
    /// The cluster's newest key epoch (on `epoch_taken`).
    public var epoch: UInt32?

    /// A refusal's body.
    public init(error: String, message: String, limit: Int? = nil, retryAfterSeconds: Int? = nil) {
        self.error = error
        self.message = message
        self.limit = limit
        self.retryAfterSeconds = retryAfterSeconds
    }
}
