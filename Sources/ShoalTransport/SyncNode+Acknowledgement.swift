import ShoalCore

/// "Has peer X got my write?": what each peer (and the relay) acknowledged holding, and waiting for it.
extension SyncNode {
    /// Who acknowledges holding a node's changes.
    public enum Acknowledger: Sendable, Hashable, CustomStringConvertible {
        /// A LAN peer, by its site id (its hello's).
        case peer(SiteID)
        /// The relay (its heads, as the relay link last read them).
        case relay
        /// Any peer or the relay: one copy beyond this node.
        case anyone

        /// Who, in words.
        public var description: String {
            switch self {
            case .peer(let site): "peer \(site.hex.prefix(8))"
            case .relay: "the relay"
            case .anyone: "any peer or the relay"
            }
        }
    }

    /// What `who` acknowledged holding (for ``Acknowledger/anyone``: per site, the most any of them holds).
    public func acknowledged(by who: Acknowledger) -> VersionVector {
        switch who {
        case .peer(let site):
            return directory.acknowledgedVectors().first { $0.site == site }?.vector ?? VersionVector()
        case .relay:
            return relayHeads
        case .anyone:
            var merged = relayHeads
            for peer in directory.acknowledgedVectors() { merged.merge(peer.vector) }
            return merged
        }
    }

    /// Whether `who` holds `dot` (one of this node's writes, or any other transaction).
    public func holds(_ dot: Dot, by who: Acknowledger) -> Bool {
        acknowledged(by: who)[dot.site] >= dot.seq
    }

    /// How many of this node's own transactions `who` lacks.
    public func lacking(by who: Acknowledger) -> UInt64 {
        let own = worker.latestVersionVector.withLock { $0 }[siteID]
        let held = acknowledged(by: who)[siteID]
        return own > held ? own - held : 0
    }

    /// Waits until `who` acknowledges holding everything in `vector` (nil: every write this node made up to now), or
    /// `timeoutMilliseconds` pass; returns whether it did. Woken by each acknowledgement, not by polling.
    public func waitUntilAcknowledged(
        _ vector: VersionVector? = nil,
        by who: Acknowledger,
        timeoutMilliseconds: UInt64
    ) async throws(ShoalError) -> Bool {
        let target: VersionVector
        if let vector {
            target = vector
        } else {
            target = VersionVector([siteID: try await worker.versionVector()[siteID]])
        }
        func satisfied() -> Bool { acknowledged(by: who).dominatesOrEquals(target) }
        if satisfied() { return true }
        let id = nextAcknowledgementWaiter
        nextAcknowledgementWaiter += 1
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        acknowledgementWaiters[id] = continuation
        defer { acknowledgementWaiters[id] = nil }
        let deadline = Task {
            try? await Task.sleep(for: .milliseconds(timeoutMilliseconds))
            continuation.finish()
        }
        defer { deadline.cancel() }
        for await _ in stream {
            if satisfied() { return true }
        }
        return satisfied()
    }

    /// Wakes every waiter of ``waitUntilAcknowledged(_:by:timeoutMilliseconds:)`` (an acknowledgement arrived).
    func wakeAcknowledgementWaiters() {
        for waiter in acknowledgementWaiters.values { waiter.yield() }
    }
}
