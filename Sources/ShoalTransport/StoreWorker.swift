import Logging
import ShoalCore
import ShoalStore
import ShoalWire

/// Owns the node's ``Store`` and runs every database operation, one at a time, off the event loops.
actor StoreWorker {
    private let store: Store
    private var lastDataVersion: Int64 = 0

    init(path: String, options: StoreOptions) throws(ShoalError) {
        store = try Store(path: path, options: options)
    }

    var siteID: SiteID { store.siteID }

    func hello(clusterID: String, nodeName: String?, listenPort: UInt16) throws(ShoalError) -> Hello {
        let stored = try store.nodeName()
        return Hello(
            clusterID: clusterID,
            siteID: store.siteID,
            nodeName: nodeName ?? stored ?? "shoal",
            schemaFingerprint: try store.schemaFingerprint(),
            listenPort: listenPort
        )
    }

    func versionVector() throws(ShoalError) -> VersionVector {
        try store.versionVector()
    }

    private var cursors: [Int: DeltaCursor] = [:]
    private var nextCursor = 0

    /// Starts answering a peer's request; batches then come one at a time from ``nextBatch(_:maxChanges:)``.
    func openCursor(since: VersionVector) throws(ShoalError) -> Int {
        nextCursor += 1
        cursors[nextCursor] = try store.deltaCursor(since: since)
        return nextCursor
    }

    /// The next batch of an answer and whether it is the last; the cursor is dropped after the last one.
    func nextBatch(_ cursor: Int, maxChanges: Int) throws(ShoalError) -> (batch: ChangeBatch, isLast: Bool)? {
        guard let delta = cursors[cursor], let batch = try store.nextBatch(delta, maxChanges: maxChanges) else {
            cursors[cursor] = nil
            return nil
        }
        if delta.isFinished { cursors[cursor] = nil }
        return (batch, delta.isFinished)
    }

    func closeCursor(_ cursor: Int) {
        cursors[cursor] = nil
    }

    /// Applies a batch unless it holds nothing new (an idle round writes nothing); returns the version vector.
    func apply(_ batch: ChangeBatch) throws(ShoalError) -> (applied: Int, versionVector: VersionVector) {
        let held = try store.versionVector()
        if batch.changes.isEmpty && held.dominatesOrEquals(batch.claim) { return (0, held) }
        let report = try store.apply(batch.changes, claim: batch.claim)
        return (report.applied, try store.versionVector())
    }

    func digest() throws(ShoalError) -> StateDigest {
        try store.digest()
    }

    /// Whether another connection (another process) committed since the last call.
    func changedElsewhere() throws(ShoalError) -> Bool {
        let version = try store.dataVersion()
        defer { lastDataVersion = version }
        return lastDataVersion != 0 && version != lastDataVersion
    }

    /// Runs a closure against the store (for the node's own writes).
    func withStore<T: Sendable>(_ body: (Store) throws -> T) throws -> T {
        try body(store)
    }
}
