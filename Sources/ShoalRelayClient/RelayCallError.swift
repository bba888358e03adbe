import ShoalCore

/// Why a call to the relay failed.
enum RelayCallError: Error {
    case cancelled
    /// The instance at `instance` did not answer (or not in time, or TLS failed), with the cause.
    case unreachable(String, instance: Int, problem: RelayProblem)
    /// The instance at `instance` answered with a server error (its storage down, or another).
    case server(String, instance: Int, problem: RelayProblem)
    /// The relay refused `token` (nil: not a token the relay saw, but a check of this node's).
    case unauthorized(String, token: String?)
    case rateLimited(retryAfterSeconds: Int, String)
    case tooLarge(limit: Int?, String)
    case refused(String)
    case malformed(String)
    case local(ShoalError)
    /// The token was retired by a key rotation: the node's grant holds the new one.
    case rotated(String, token: String)
    /// An upload was sealed with an epoch older than the cluster's newest: the node's grant holds the new key.
    case epochRetired(String, token: String)
    /// The token was retired by a rotation and no grant for this node is there (yet, or ever: a removed node).
    case ungranted(String)
    /// The relay holds no upload key for the epoch (registered on the spot, then the upload is sent again).
    case noUploadKey(String)
    /// Another member started the key epoch first.
    case conflict(epoch: UInt32?, String)
}
