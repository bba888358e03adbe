import ShoalCore
import ShoalStore

/// What another transport (the relay client) needs from a node beside its store (``SyncNode/store``): count what the
/// relay holds as acknowledged, and hear when the node's data may have changed.
extension SyncNode {
    /// Reports what the node's relay link did among the node's events (``NodeEvent/relay(_:)``).
    public nonisolated func relayDid(_ event: RelayEvent) {
        eventSink.yield(.relay(event))
    }

    /// What a relay holds (its heads, as the relay link last read them): it acknowledges this node's writes like a
    /// peer, in ``pendingLocalChanges()`` and the queue-depth metric. A relay that lost its storage reports less.
    /// Deletes that waited for the relay to hold them are looked at again (``collectionCut(held:without:)``).
    public func relayHolds(_ heads: VersionVector) {
        let moved = heads != relayHeads
        relayHeads = heads
        relayLinked = true
        if moved, collectsAmongMembers { collectionWaker.yield() }
    }

    /// What the relay's ranges brought this node, as its link counted them (see ``relayBrought``).
    public func relayBrought(_ vector: VersionVector) {
        relayBrought = vector
    }

    /// Sets how the node reads what the relay holds, whole, to take a fresh state through the relay alone (the relay
    /// link, while it runs; nil once it stopped).
    /// The reader reads nothing unless the relay's snapshot covers the vector it is given (see ``RelayStateKeys``).
    public func readsRelayState(_ reader: (@Sendable (VersionVector) async throws -> RelayStateKeys)?) {
        relayStateReader = reader
    }

    /// A signal each time the node's data may have changed: a local write (through the node or another process),
    /// changes applied from a peer, a periodic round. Ends when the node stops.
    public func changeSignals() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        nextChangeWatcher += 1
        let id = nextChangeWatcher
        changeWatchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.dropChangeWatcher(id) } }
        return stream
    }

    private func dropChangeWatcher(_ id: Int) {
        changeWatchers[id] = nil
    }

    func signalChangeWatchers() {
        for watcher in changeWatchers.values { watcher.yield() }
    }
}
