import CoreMetrics
import HTTPTypes
import Hummingbird
import HummingbirdCore
import ShoalCore
import ShoalRelayProtocol
import Synchronization

/// The relay's metrics, emitted through swift-metrics (the process bootstraps Prometheus; docs/metrics.md lists
/// every name). Labels stay bounded: `route` is the route's pattern (never the raw path: an unknown path is
/// `unmatched`), `method` one of the HTTP methods the API knows (else `other`), `status` the status code, `cluster`
/// a cluster the operator made a token for, `direction` `in` (uploads) or `out` (pulls).
final class RelayMetrics: Sendable {
    static let requests = "shoal_relay_requests_total"
    static let requestDuration = "shoal_relay_request_duration_seconds"
    static let changeSets = "shoal_relay_changesets_total"
    static let changeSetBytes = "shoal_relay_changeset_bytes_total"
    static let changeSetsStored = "shoal_relay_changesets_stored_total"
    static let connections = "shoal_relay_connections"
    static let storageSites = "shoal_relay_storage_sites"
    static let storageRanges = "shoal_relay_storage_ranges"
    static let storageChunks = "shoal_relay_storage_chunks"
    static let storageBytes = "shoal_relay_storage_bytes"
    static let snapshotAge = "shoal_relay_snapshot_age_seconds"

    /// Change sets received in accepted uploads, and sent in pull pages.
    let changeSetsIn = Counter(label: changeSets, dimensions: [("direction", "in")])
    let changeSetsOut = Counter(label: changeSets, dimensions: [("direction", "out")])
    /// Their encoded bytes.
    let bytesIn = Counter(label: changeSetBytes, dimensions: [("direction", "in")])
    let bytesOut = Counter(label: changeSetBytes, dimensions: [("direction", "out")])
    /// Change sets an upload added (the rest were held already: uploads are idempotent).
    let stored = Counter(label: changeSetsStored)
    /// Open connections.
    let openConnections = Meter(label: connections)

    /// How often the per-cluster storage figures are read again at most (each read is one grouped query).
    static let storageRefreshMilliseconds: Int64 = 10_000

    private struct State {
        var requests: [RequestKey: (counter: Counter, timer: CoreMetrics.Timer)] = [:]
        var storageReadAt: Int64?
        var storage: [String: RelayClusterStatistics] = [:]
        /// When each cluster's newest snapshot was made (Unix milliseconds).
        var snapshots: [String: Int64] = [:]
    }

    private struct RequestKey: Hashable {
        var method: String
        var route: String
        var status: Int
    }

    private let state = Mutex(State())

    /// Counts a request answered with `status` after `nanoseconds`.
    func request(method: HTTPRequest.Method, route: String, status: Int, nanoseconds: Int64) {
        let key = RequestKey(method: Self.methodLabel(method), route: route, status: status)
        let handles = state.withLock { state in
            if let known = state.requests[key] { return known }
            let made = (
                counter: Counter(
                    label: Self.requests,
                    dimensions: [("method", key.method), ("route", key.route), ("status", "\(key.status)")]
                ),
                timer: CoreMetrics.Timer(
                    label: Self.requestDuration,
                    dimensions: [("method", key.method), ("route", key.route)]
                )
            )
            state.requests[key] = made
            return made
        }
        handles.counter.increment()
        handles.timer.recordNanoseconds(nanoseconds)
    }

    /// The methods the API uses keep their name; anything else is `other`.
    static func methodLabel(_ method: HTTPRequest.Method) -> String {
        switch method {
        case .get, .post, .head, .put, .delete, .options, .patch: method.rawValue
        default: "other"
        }
    }

    /// Records that a snapshot of `cluster` was made at `milliseconds` (Unix).
    func snapshotMade(cluster: String, atMilliseconds milliseconds: Int64) {
        state.withLock { state in
            state.snapshots[cluster] = max(state.snapshots[cluster] ?? milliseconds, milliseconds)
        }
    }

    /// Brings the per-cluster gauges up to date before a scrape: the storage figures from `read` when the last read is
    /// older than ``storageRefreshMilliseconds``, and each snapshot's age. A failed read keeps the figures before it.
    func refresh(now: Int64, read: () async throws(ShoalError) -> [RelayClusterStatistics]) async {
        let due = state.withLock { state in
            guard let last = state.storageReadAt, now - last < Self.storageRefreshMilliseconds else {
                state.storageReadAt = now
                return true
            }
            return false
        }
        if due, let statistics = try? await read() {
            state.withLock { state in
                for cluster in statistics { state.storage[cluster.cluster] = cluster }
            }
        }
        let (storage, snapshots) = state.withLock { ($0.storage, $0.snapshots) }
        for cluster in storage.values {
            let label = [("cluster", cluster.cluster)]
            Gauge(label: Self.storageSites, dimensions: label).record(cluster.sites)
            Gauge(label: Self.storageRanges, dimensions: label).record(cluster.ranges)
            Gauge(label: Self.storageChunks, dimensions: label).record(cluster.chunks)
            Gauge(label: Self.storageBytes, dimensions: label).record(cluster.bytes)
        }
        for (cluster, made) in snapshots {
            Gauge(label: Self.snapshotAge, dimensions: [("cluster", cluster)]).record(Double(max(0, now - made)) / 1000)
        }
    }
}

/// Counts every request by method, route pattern and status, and times it.
struct RelayMetricsMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: RelayMetrics

    func handle(
        _ request: Request,
        context: Context,
        next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        let started = ContinuousClock.now
        do {
            let response = try await next(request, context)
            record(request, context: context, status: response.status.code, since: started)
            return response
        } catch {
            let status = (error as? any HTTPResponseError)?.status.code ?? HTTPResponse.Status.internalServerError.code
            record(request, context: context, status: status, since: started)
            throw error
        }
    }

    private func record(_ request: Request, context: Context, status: Int, since started: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - started
        let nanoseconds = elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000
        metrics.request(
            method: request.method,
            // A route's pattern starts with a slash; what the router answers with no route is `unmatched`.
            route: context.endpointPath.flatMap { $0.hasPrefix("/") ? $0 : nil } ?? "unmatched",
            status: status,
            nanoseconds: nanoseconds
        )
    }
}

/// Names the relay process on every answer (``RelayAPI/bootHeader``), refusals included.
struct RelayBootMiddleware<Context: RequestContext>: RouterMiddleware {
    static var field: HTTPField.Name { HTTPField.Name(RelayAPI.bootHeader)! }
    let boot: String

    func handle(
        _ request: Request,
        context: Context,
        next: (Request, Context) async throws -> Response
    ) async throws -> Response {
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        }
        response.headers[Self.field] = boot
        return response
    }
}

/// The relay's limit on open connections (Hummingbird's), counting them in the `shoal_relay_connections` gauge.
struct CountedConnections: AvailableConnectionsDelegate {
    private var limit: MaximumAvailableConnections
    private let gauge: Meter

    init(maximum: Int, gauge: Meter) {
        limit = MaximumAvailableConnections(maximum)
        self.gauge = gauge
    }

    mutating func connectionOpened() {
        limit.connectionOpened()
        gauge.increment()
    }

    mutating func connectionClosed() {
        limit.connectionClosed()
        gauge.decrement()
    }

    func isAcceptingNewConnections() -> Bool {
        limit.isAcceptingNewConnections()
    }
}
