import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL
import ShoalCore
import ShoalRelayProtocol

/// The relay's HTTP API, one typed method per endpoint: it builds each request, authenticates it, and turns every
/// answer into a value or a ``RelayCallError`` that names the cause. It decides nothing about syncing (the sessions
/// do, and ``RelayLink`` carries their decisions out through it).
struct RelayAPIClient: Sendable {
    /// Where a call goes and with which token (the link's current instance and credentials), read per call.
    typealias Route = @Sendable () -> (instance: Int, token: String)

    let http: HTTPClient
    /// The relay's instances, without trailing slashes.
    let bases: [String]
    /// This process's uploader id (``RelayAPI/uploaderHeader``).
    let uploaderID: String
    let route: Route
    /// Told of every answer: the instance, whether it was a success, and the relay process that gave it
    /// (``RelayAPI/bootHeader``).
    let answered: @Sendable (Int, Bool, String?) -> Void

    // MARK: Endpoints

    /// The relay's heads (`GET /v1/heads`), checked to be of this node's `cluster`.
    func heads(cluster: String) async throws(RelayCallError) -> (heads: RelayHeads, vector: VersionVector) {
        let heads: RelayHeads = try Self.decode(try await call(.GET, RelayAPI.headsPath, body: nil, timeout: .seconds(30)))
        if let other = heads.cluster, other != cluster {
            throw RelayCallError.unauthorized(
                "the token is for cluster \(other.prefix(64)), and this node belongs to \(cluster)", token: nil
            )
        }
        do {
            return (heads, try RelayAPI.vector(heads.heads))
        } catch {
            throw RelayCallError.malformed("the relay's heads: \(error.message)")
        }
    }

    /// One page of what `request` asks for (a long-poll of up to `waitMilliseconds`).
    func pull(_ request: RelayPullRequest, waitMilliseconds: Int) async throws(RelayCallError) -> [RelayEnvelopeList.Entry] {
        let answer = try await call(
            .POST,
            RelayAPI.pullPath,
            body: Self.json(request),
            timeout: .milliseconds(Int64(waitMilliseconds) + 60_000)
        )
        do {
            return try RelayEnvelopeList.decodeEntries(answer, maximumEnvelopeBytes: 64 * 1024 * 1024)
        } catch {
            throw RelayCallError.malformed("a page from the relay: \(error.message)")
        }
    }

    /// Sends `envelopes` to the change log, or to snapshot `snapshot`, authenticated with their epoch's upload key.
    /// Returns the relay's answer and the size of what was sent.
    func upload(
        _ envelopes: [RelayEnvelope],
        snapshot: UInt64?,
        seal: RelaySeal
    ) async throws(RelayCallError) -> (result: RelayUploadResult, heads: VersionVector, bytes: Int) {
        let body = RelayEnvelopeList.encode(envelopes)
        let path = snapshot.map { "\(RelayAPI.snapshotsPath)/\($0)" } ?? RelayAPI.changeSetsPath
        let answer = try await postAuthenticated(
            path, body: body, contentType: RelayAPI.envelopeContentType, epoch: envelopes.first?.epoch ?? 0, seal: seal
        )
        let result: RelayUploadResult = try Self.decode(answer)
        do {
            return (result, try RelayAPI.vector(result.heads), body.count)
        } catch {
            throw RelayCallError.malformed("the relay's heads: \(error.message)")
        }
    }

    /// Tells the relay snapshot `id` is whole and covers `covered`.
    func completeSnapshot(_ id: UInt64, covered: VersionVector, seal: RelaySeal) async throws(RelayCallError) {
        _ = try await postAuthenticated(
            "\(RelayAPI.snapshotsPath)/\(id)/complete",
            body: Self.json(RelaySnapshotCompletion(vector: RelayAPI.json(covered))),
            contentType: "application/json",
            epoch: seal.epoch,
            seal: seal
        )
    }

    /// The grants of epochs after `after` (for `recipient` only, if given), waiting up to `waitMilliseconds` for one.
    func grants(after: UInt32, recipient: NodeID? = nil, waitMilliseconds: UInt64 = 0) async throws(RelayCallError)
        -> RelayGrants
    {
        var path = RelayAPI.grantsPath + "?after=\(after)"
        if let recipient {
            let encoded = recipient.description.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            path += "&recipient=\(encoded)&wait=\(waitMilliseconds)"
        }
        return try Self.decode(
            try await call(.GET, path, body: nil, timeout: .milliseconds(Int64(waitMilliseconds) + 30_000))
        )
    }

    /// Leaves `grants` in the relay's mailbox.
    func post(_ grants: [RelayGrant]) async throws(RelayCallError) {
        _ = try await call(.POST, RelayAPI.grantsPath, body: Self.json(RelayGrants(grants: grants)), timeout: .seconds(30))
    }

    /// Starts an epoch at the relay (``RelayCallError/conflict(epoch:_:)`` when another member started it first).
    func rotate(_ rotation: RelayRotation) async throws(RelayCallError) {
        _ = try await call(.POST, RelayAPI.rotatePath, body: Self.json(rotation), timeout: .seconds(30))
    }

    // MARK: Requests

    /// Posts `body` to `path` authenticated with `epoch`'s upload key, so the relay stores only what a holder of the
    /// secret sent; registers the key first when the relay does not know it yet.
    private func postAuthenticated(
        _ path: String,
        body: [UInt8],
        contentType: String,
        epoch: UInt32,
        seal: RelaySeal
    ) async throws(RelayCallError) -> [UInt8] {
        guard let authentication = seal.authenticate(body, epoch: epoch), let uploadKey = seal.uploadKey(epoch) else {
            throw RelayCallError.local(ShoalError(code: .sealBroken, message: "no upload key for epoch \(epoch)"))
        }
        let headers = [(RelayAPI.uploadEpochHeader, "\(epoch)"), (RelayAPI.uploadAuthHeader, authentication)]
        do {
            return try await call(.POST, path, body: body, contentType: contentType, headers: headers, timeout: .seconds(120))
        } catch {
            guard case .noUploadKey = error else { throw error }
            // The relay does not know this epoch's upload key yet (a new relay, or the cluster's first upload).
            let key = RelayUploadKey(epoch: epoch, key: Data(uploadKey).base64EncodedString())
            do {
                _ = try await call(.POST, RelayAPI.keysPath, body: Self.json(key), timeout: .seconds(30))
            } catch {
                guard case .conflict(_, let why) = error else { throw error }
                // The relay holds another key for this epoch: see the 403 in `call`.
                throw RelayCallError.epochRetired(why, token: route().token)
            }
            return try await call(.POST, path, body: body, contentType: contentType, headers: headers, timeout: .seconds(120))
        }
    }

    /// Sends one request to the current instance with the current token; returns the body of a success and throws the
    /// relay's refusal, typed, for anything else.
    private func call(
        _ method: HTTPMethod,
        _ path: String,
        body: [UInt8]?,
        contentType: String = "application/json",
        headers extra: [(String, String)] = [],
        timeout: TimeAmount
    ) async throws(RelayCallError) -> [UInt8] {
        // The instance this call goes to: a failure moves on from it, not from wherever the other loop moved since.
        let (used, token) = route()
        var request = HTTPClientRequest(url: bases[used] + path)
        request.method = method
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        request.headers.add(name: RelayAPI.uploaderHeader, value: uploaderID)
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
            request.body = .bytes(ByteBuffer(bytes: body))
        }
        let status: HTTPResponseStatus
        let headers: HTTPHeaders
        let answer: [UInt8]
        do {
            let response = try await http.execute(request, timeout: timeout)
            status = response.status
            headers = response.headers
            answer = Array(try await response.body.collect(upTo: 80 * 1024 * 1024).readableBytesView)
        } catch is CancellationError {
            throw RelayCallError.cancelled
        } catch {
            if Task.isCancelled { throw RelayCallError.cancelled }
            let (why, problem) = Self.describe(error)
            throw RelayCallError.unreachable(why, instance: used, problem: problem)
        }
        answered(used, status.code < 300, headers.first(name: RelayAPI.bootHeader))
        guard status.code >= 300 else { return answer }
        let refusal = try? JSONDecoder().decode(RelayErrorBody.self, from: Data(answer))
        let reason = refusal.map { "\($0.message) (\(status.code) \($0.error))" } ?? "HTTP \(status.code)"
        switch status.code {
        case 401 where refusal?.error == "token_rotated":
            throw RelayCallError.rotated(reason, token: token)
        case 403 where refusal?.error == "no_upload_key":
            throw RelayCallError.noUploadKey(reason)
        case 403 where refusal?.error == "epoch_retired" || refusal?.error == "bad_upload_auth":
            // Sealed under an epoch the relay retired, or under a key it does not hold for that epoch (it lost its state
            // and a member started the epoch afresh): the relay's current epoch is in this node's grants.
            throw RelayCallError.epochRetired(reason, token: token)
        case 401, 403:
            throw RelayCallError.unauthorized(reason, token: token)
        case 409:
            throw RelayCallError.conflict(epoch: refusal?.epoch, reason)
        case 413:
            throw RelayCallError.tooLarge(limit: refusal?.limit, reason)
        case 429:
            let retry = headers.first(name: "Retry-After").flatMap { Int($0) } ?? refusal?.retryAfterSeconds ?? 1
            throw RelayCallError.rateLimited(retryAfterSeconds: retry, reason)
        case 400..<500:
            throw RelayCallError.refused(reason)
        case 503 where refusal?.error == "storage_unavailable":
            throw RelayCallError.server(reason, instance: used, problem: .storageDown)
        default:
            throw RelayCallError.server(reason, instance: used, problem: .serverError)
        }
    }

    /// A failed request's cause, in words and by kind.
    static func describe(_ error: any Error) -> (String, RelayProblem) {
        if let error = error as? HTTPClientError {
            switch error {
            case .connectTimeout, .getConnectionFromPoolTimeout: return ("the connection timed out", .unreachable)
            case .readTimeout, .deadlineExceeded: return ("the relay did not answer in time", .unreachable)
            case .remoteConnectionClosed: return ("the relay closed the connection", .unreachable)
            default: break
            }
        }
        if let error = error as? NIOSSLExtraError, error == .failedToValidateHostname {
            return (
                "TLS failed: the relay's certificate is for another host name than the one in --relay (\(error))",
                .wrongHost
            )
        }
        if error is NIOSSLError || error is BoringSSLError || error is NIOSSLExtraError {
            let text = "\(error)"
            if text.contains("CERTIFICATE_VERIFY_FAILED") || text.contains("certificate") {
                return (
                    "TLS failed: the relay's certificate is not trusted (give its CA, or the certificate itself, "
                        + "with --relay-ca)",
                    .untrustedCertificate
                )
            }
            return ("TLS failed: \(text.prefix(200))", .tlsFailed)
        }
        if error is ChannelError { return ("the connection was closed", .unreachable) }
        let text = "\(error)"
        if text.contains("connectionRefused") || text.contains("Connection refused") { return ("connection refused", .unreachable) }
        return (text, .unreachable)
    }

    private static func json(_ value: some Encodable) -> [UInt8] {
        Array((try? JSONEncoder().encode(value)) ?? Data())
    }

    private static func decode<T: Decodable>(_ bytes: [UInt8]) throws(RelayCallError) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch {
            throw RelayCallError.malformed("the relay answered with JSON this build cannot read")
        }
    }
}
