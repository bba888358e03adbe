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
    /// `GET`: whether the relay answers (no token needed).
    public static let healthPath = "/v1/health"
    /// The content type of envelope lists.
    public static let envelopeContentType = "application/vnd.shoal.changesets"
    /// On a pull's answer: `1` when the relay holds more than the page carried.
    public static let moreHeader = "Shoal-More"
    /// The longest a pull may wait for new change sets before answering empty, in milliseconds.
    public static let maximumWaitMilliseconds = 30_000
    /// The default byte budget of a pull's page.
    public static let defaultPageBytes = 4 * 1024 * 1024
    /// The default largest envelope a relay accepts (its sealed body and header).
    public static let defaultMaximumEnvelopeBytes = 8 * 1024 * 1024
    /// The default largest request body a relay accepts.
    public static let defaultMaximumRequestBytes = 32 * 1024 * 1024

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

    /// Heads as the JSON body writes them.
    public init(heads: [String: UInt64]) { self.heads = heads }
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

    /// A pull for what `vector` lacks.
    public init(vector: [String: UInt64], resume: [Resume]? = nil, waitMilliseconds: Int? = nil, maximumBytes: Int? = nil) {
        self.vector = vector
        self.resume = resume
        self.waitMilliseconds = waitMilliseconds
        self.maximumBytes = maximumBytes
    }
}

/// The body of every refusal: a code for programs, a message for people, and the limit that was hit.
public struct RelayErrorBody: Codable, Hashable, Sendable {
    /// `unauthorized`, `wrong_cluster`, `malformed`, `too_large`, `rate_limited`, `not_found` or `internal`.
    public var error: String
    /// For a person.
    public var message: String
    /// The limit that was exceeded (bytes for `too_large`, requests per second for `rate_limited`).
    public var limit: Int?
    /// When to try again, in seconds (also in the `Retry-After` header).
    public var retryAfterSeconds: Int?

    /// A refusal's body.
    public init(error: String, message: String, limit: Int? = nil, retryAfterSeconds: Int? = nil) {
        self.error = error
        self.message = message
        self.limit = limit
        self.retryAfterSeconds = retryAfterSeconds
    }
}
