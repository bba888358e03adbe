import Foundation
import Synchronization

/// One Server-Sent Event: its id (increasing from 1), its name and its data (one line of JSON).
public struct DashboardEvent: Sendable, Equatable {
    /// Its id, which a browser sends back as `Last-Event-ID` when it reconnects.
    public var id: UInt64
    /// The event's name (`state`).
    public var name: String
    /// Its data.
    public var data: String

    /// The event as it goes on the wire (`text/event-stream`).
    public var wire: String { "id: \(id)\nevent: \(name)\ndata: \(data)\n\n" }
}

/// Where the dashboard's states are published and its browsers subscribe: it numbers each state that differs from the
/// last, keeps the latest ones, and hands each subscriber those after the id it already has, then every new one.
///
/// Every event carries a whole state, so a subscriber that resumes with an id older than those kept (or one it never
/// had) gets the latest state at once: it never misses what the page shows.
public final class DashboardHub: Sendable {
    private struct Inner {
        var nextID: UInt64 = 1
        var kept: [DashboardEvent] = []
        var subscribers: [UInt64: AsyncStream<DashboardEvent>.Continuation] = [:]
        var nextSubscriber: UInt64 = 0
        var last: DashboardState?
    }

    private let inner = Mutex(Inner())
    /// Events kept for browsers that resume.
    static let keptEvents = 64

    /// An empty hub.
    public init() {}

    /// Whether a browser follows the events now (the feeds read the nodes more often while one does).
    public var isWatched: Bool { inner.withLock { !$0.subscribers.isEmpty } }

    /// The latest state published, if any.
    public var latest: DashboardState? { inner.withLock { $0.last } }

    /// Publishes `state` as the next event, unless it equals the last one.
    public func publish(_ state: DashboardState) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let data = try? encoder.encode(state) else { return }
        let text = String(decoding: data, as: UTF8.self)
        inner.withLock { inner in
            guard inner.last != state else { return }
            inner.last = state
            let event = DashboardEvent(id: inner.nextID, name: "state", data: text)
            inner.nextID += 1
            inner.kept.append(event)
            if inner.kept.count > Self.keptEvents { inner.kept.removeFirst(inner.kept.count - Self.keptEvents) }
            for continuation in inner.subscribers.values { continuation.yield(event) }
        }
    }

    /// The events after `lastEventID` (all kept ones when nil, or only the latest when the id is older than those
    /// kept or unknown), then each new one, until the consumer stops iterating.
    public func subscribe(after lastEventID: UInt64?) -> AsyncStream<DashboardEvent> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: DashboardEvent.self,
            bufferingPolicy: .bufferingNewest(Self.keptEvents)
        )
        let key = inner.withLock { inner in
            let backlog: [DashboardEvent]
            // (The bound first: an id as large as UInt64 allows must not overflow the next comparison.)
            if let lastEventID, lastEventID < inner.nextID, let first = inner.kept.first, lastEventID + 1 >= first.id {
                backlog = inner.kept.filter { $0.id > lastEventID }
            } else {
                backlog = inner.kept.last.map { [$0] } ?? []
            }
            for event in backlog { continuation.yield(event) }
            let key = inner.nextSubscriber
            inner.nextSubscriber += 1
            inner.subscribers[key] = continuation
            return key
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.inner.withLock { $0.subscribers.removeValue(forKey: key) }
        }
        return stream
    }

    /// Ends every subscription (at shutdown).
    public func finish() {
        let continuations = inner.withLock { inner in
            defer { inner.subscribers.removeAll() }
            return Array(inner.subscribers.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
