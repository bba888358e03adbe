import AsyncHTTPClient
import Foundation
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOSSL
import ServiceLifecycle
import ShoalCore
import ShoalProtocol
import ShoalRelayProtocol
import ShoalSecurity
import ShoalTransport
import Synchronization

extension RelayLink {
    // MARK: Calls

    func call(
        _ client: HTTPClient,
        _ method: HTTPMethod,
        _ path: String,
        body: [UInt8]?,
        contentType: String = "application/json",
        headers extra: [(String, String)] = [],
        timeout: TimeAmount
    ) async throws(RelayCallError) -> (body: [UInt8], headers: HTTPHeaders) {
        // The instance this call goes to: a failure moves on from it, not from wherever the other loop moved since.
        let used = state.withLock { $0.instance }
        var request = HTTPClientRequest(url: bases[used] + path)
        request.method = method
        for (name, value) in extra { request.headers.add(name: name, value: value) }
        let token = state.withLock { $0.credentials.token }
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
            let response = try await client.execute(request, timeout: timeout)
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
        markReachable(used, ok: status.code < 300)
        guard status.code >= 300 else { return (answer, headers) }
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

    func decodeJSON<T: Decodable>(_ bytes: [UInt8]) throws(RelayCallError) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch {
            throw RelayCallError.malformed("the relay answered with JSON this build cannot read")
        }
    }

    func local<T>(_ body: () async throws(ShoalError) -> T) async throws(RelayCallError) -> T {
        do {
            return try await body()
        } catch {
            throw RelayCallError.local(error)
        }
    }

    func localNow<T>(_ body: () throws(ShoalError) -> T) throws(RelayCallError) -> T {
        do {
            return try body()
        } catch {
            throw RelayCallError.local(error)
        }
    }
}
