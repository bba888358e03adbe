import Logging
import ShoalCore
import Synchronization

/// The database's one door: owns a ``Store`` and runs every operation on it, one at a time, on a thread of its own.
///
/// Everything that reaches a node's database goes through it: the sync engine, the relay link, membership and the
/// app. Its jobs run on a ``StoreExecutor``, not on the cooperative pool: a SQLite call that blocks (a long apply, a
/// wait on another process's lock) holds the store's thread only, never one the rest of the process needs (as GRDB's
/// `DatabaseQueue` runs its accesses on a serial queue of its own).
public actor SerializedStore {
    private let store: Store
    private let executor: StoreExecutor
    /// The store's write-lock meter, read without waiting for the store's thread.
    private nonisolated let writeHolds: WriteHoldMeter
    /// The node's clock (the store's): when the data changed, when a failed capture is retried.
    private let clock: any WallClock

    /// The actor runs on its own thread.
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
    private var lastDataVersion: Int64 = 0
    /// `PRAGMA data_version` at the start of a batch or after its last slice, and when another connection last
    /// committed (seen between slices, or by ``changedElsewhere()``).
    private var sliceDataVersion: Int64?
    private var otherWriterCommittedAt: UInt64?
    /// How many times a batch's slices paused for another connection's writes.
    package private(set) var slicePauses = 0
    /// Bumped whenever the data may have changed; the cached digest is valid for one value of it.
    private var stateVersion = 0
    private var cachedDigest: (version: Int, digest: StateDigest, holdsChanges: Bool)?
    private var digestComputedAt: UInt64 = 0
    /// When the data last changed (wall milliseconds); the digest is only recomputed once it is quiet.
    private var lastChangeAt: UInt64 = 0

    /// The version vector as last read or written, readable without waiting for the worker (for status reports
    /// while a long apply runs).
    public nonisolated let latestVersionVector = Mutex(VersionVector())
    /// How far this machine's clock ran ahead of its peers' at their latest reading, beyond the drift bound (see
    /// ``Store/clockAheadOfPeersMilliseconds``); readable at once, like ``latestVersionVector``.
    public nonisolated let latestClockAhead = Mutex<UInt64?>(nil)

    /// Counts the commits (``StoreCommit/generation``): what was read now holds every commit up to it.
    var generation: Int { stateVersion }

    /// Who is told of each commit (``commits()``).
    private var commitWatchers: [Int: AsyncStream<StoreCommit>.Continuation] = [:]
    private var nextCommitWatcher = 0

    /// Notes that the data may have changed (the cached digest is stale), and tells ``commits()`` watchers.
    private func changed(_ origin: StoreCommit.Origin) {
        markChanged()
        publish(origin)
    }

    /// A write of Shoal's own tables by this node: counted, and announced like the app's.
    /// Publishes a write of the store's own; with `tablesKnown`, with the tables it wrote (otherwise observers look
    /// again whatever it was).
    private func wroteLocally(tablesKnown: Bool = false) {
        markChanged()
        _ = try? versionVector()
        publish(.local, tablesKnown: tablesKnown)
    }

    private func markChanged() {
        stateVersion += 1
        lastChangeAt = clock.nowMilliseconds()
    }

    private func publish(_ origin: StoreCommit.Origin) {
        // What the store wrote through its door may be any table: observers look again whatever it was.
        publish(origin, tablesKnown: origin != .local)
    }

    private func publish(_ origin: StoreCommit.Origin, tablesKnown: Bool) {
        let (tables, dots) = store.takeCommitted()
        guard !commitWatchers.isEmpty else { return }
        let commit = StoreCommit(origin: origin, tables: tablesKnown ? tables : nil, dots: dots, generation: stateVersion)
        for watcher in commitWatchers.values { watcher.yield(commit) }
    }

    /// Every commit that may have changed the data from now on, whatever made it: this door's writes, another
    /// connection's (seen when ``changedElsewhere()`` captures them) and applied changes, with where they came from.
    /// A watcher that falls behind keeps the newest 64. Ends when the watcher's task is cancelled.
    public func commits() -> AsyncStream<StoreCommit> {
        let (stream, continuation) = AsyncStream.makeStream(of: StoreCommit.self, bufferingPolicy: .bufferingNewest(64))
        nextCommitWatcher += 1
        let id = nextCommitWatcher
        commitWatchers[id] = continuation
        continuation.onTermination = { _ in Task { await self.dropCommitWatcher(id) } }
        return stream
    }

    private func dropCommitWatcher(_ id: Int) {
        commitWatchers[id] = nil
    }

    /// Ends every watcher's stream (the node is stopping).
    public func finishCommits() {
        for watcher in commitWatchers.values { watcher.finish() }
        commitWatchers.removeAll()
    }

    /// Opens the database at `path` (see ``Store/init(path:options:)``) behind one serial executor.
    public init(path: String, options: StoreOptions) throws(ShoalError) {
        store = try Store(path: path, options: options)
        writeHolds = store.writeHolds
        clock = options.clock
        executor = StoreExecutor()
    }

    deinit {
        executor.shutdown()
    }

    /// The site this database writes as.
    public var siteID: SiteID { store.siteID }
    /// The site peers know this node by (its hello and membership name it).
    public var identitySiteID: SiteID { store.identitySiteID }

    /// The wall clock the store stamps writes with, read now.
    package func wallClockMilliseconds() -> UInt64 { store.wallClockMilliseconds() }

    /// Notes a peer's wall clock reading (see ``Store/notePeerClock(_:from:)``); returns how far this node's clock is
    /// ahead of it, in milliseconds (negative: behind).
    package func notePeerClock(_ wallMilliseconds: UInt64, from peer: SiteID) -> Int64 {
        let ahead = store.notePeerClock(wallMilliseconds, from: peer)
        latestClockAhead.withLock { $0 = store.clockAheadOfPeersMilliseconds }
        return ahead
    }

    /// The site the store writes as now.
    public func writingSite() -> SiteID { store.siteID }

    /// See ``Store/loggedHead(of:)``.
    package func loggedHead(of site: SiteID) throws(ShoalError) -> Stamp? { try store.loggedHead(of: site) }

    /// See ``Store/checkHead(_:)``.
    package func checkHead(_ head: Stamp) throws(ShoalError) { try store.checkHead(head) }

    /// What the database can send (see ``Store/servableVector()``).
    public func servableVector() throws(ShoalError) -> VersionVector { try store.servableVector() }

    /// The database's version vector (see ``Store/versionVector()``).
    public func versionVector() throws(ShoalError) -> VersionVector {
        let vector = try store.versionVector()
        latestVersionVector.withLock { $0 = vector }
        return vector
    }

    private var cursors: [Int: DeltaCursor] = [:]
    private var nextCursor = 0

    /// Starts answering a peer's request; batches then come one at a time from ``nextBatch(_:maxChanges:maxBytes:)``.
    public func openCursor(since: VersionVector) throws(ShoalError) -> Int {
        nextCursor += 1
        cursors[nextCursor] = try store.deltaCursor(since: since)
        return nextCursor
    }

    /// The next batch of an answer and whether it is the last; the cursor is dropped after the last one.
    public func nextBatch(
        _ cursor: Int,
        maxChanges: Int,
        maxBytes: Int
    ) throws(ShoalError) -> (batch: ChangeBatch, isLast: Bool, remaining: UInt64)? {
        guard let delta = cursors[cursor],
            let batch = try store.nextBatch(delta, maxChanges: maxChanges, maxBytes: maxBytes)
        else {
            cursors[cursor] = nil
            return nil
        }
        if delta.isFinished { cursors[cursor] = nil }
        return (batch, delta.isFinished, delta.isFinished ? 0 : delta.estimatedRemaining)
    }

    /// Forgets an answer's cursor (its peer went away or the answer ended).
    public func closeCursor(_ cursor: Int) {
        cursors[cursor] = nil
    }

    /// Applies a batch unless it holds nothing new (an idle round writes nothing); returns the version vector. The
    /// conflicts it met are counted by table (from a peer and from the relay alike: both apply here).
    ///
    /// `clockRefusals` names the sites whose changes were left out for a clock too far ahead (everything else was
    /// applied; see ``Store/apply(_:claim:since:)``).
    ///
    /// `received` holds the highest seq per site applied from earlier batches of the same answer; the result's
    /// `received` adds this batch's (see ``Store/apply(_:claim:since:received:)``). `completing` says the batch is the
    /// last of an answer whose earlier batches withheld nothing (the result's `withheld`: fenced or refused changes);
    /// the claim is then taken whole (see ``Store/apply(_:claim:since:received:completing:)``). `origin` is what
    /// ``commits()`` says of it.
    ///
    /// The batch is applied in slices (``SlicedApply``), each a write transaction of its own that holds SQLite's
    /// write lock for about 20 ms, and the claim last: an app writing the file waits for one slice at most. Between
    /// slices the store's other jobs run (a status report, the app's write through this door, another peer's slice).
    public func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64] = [:],
        completing: Bool = false,
        origin: StoreCommit.Origin = .peer
    ) async throws(ShoalError) -> (
        applied: Int, versionVector: VersionVector, clockRefusals: [SiteID: HLC], received: [SiteID: UInt64],
        conflictsByTable: [String: Int], withheld: Bool, fenced: Set<SiteID>
    ) {
        let held = try store.versionVector()
        if batch.changes.isEmpty && held.dominatesOrEquals(batch.claim) { return (0, held, [:], received, [:], false, []) }
        var slices = SlicedApply(batch, received: received, completing: completing)
        // Commits before this batch are the change watcher's to notice (``changedElsewhere()``); between its slices,
        // each slice boundary looks.
        sliceDataVersion = try? store.dataVersion()
        var appliedSoFar = 0
        while try !slices.step(store) {
            if slices.report.applied > appliedSoFar {
                appliedSoFar = slices.report.applied
                changed(origin)
            }
            await giveWayBetweenSlices()
        }
        let report = slices.report
        if report.applied > appliedSoFar { changed(origin) }
        return (
            report.applied, try versionVector(), report.clockRefusals,
            received.merging(report.acceptedHighest) { max($0, $1) }, report.conflictsByTable, report.withheldAny,
            Set(report.fenced.keys)
        )
    }

    /// Between two slices of a batch: a pause of ``SlicedApply/gapMilliseconds`` while another connection committed
    /// in the last second (an app writing beside a catch-up), so that its busy handler, which polls with growing
    /// sleeps, finds the lock free; otherwise a yield to the store's other jobs. Taking the lock again at once, the
    /// node let an app writing every 5 ms in 430 times in 18 s, with waits of 0.6 s at p99 and 1.9 s at most.
    private func giveWayBetweenSlices() async {
        let version = try? store.dataVersion()
        let now = clock.nowMilliseconds()
        if let version, let seen = sliceDataVersion, seen != version { otherWriterCommittedAt = now }
        sliceDataVersion = version
        if let at = otherWriterCommittedAt, now >= at, now - at < SlicedApply.otherWriterWindowMilliseconds {
            slicePauses += 1
            try? await Task.sleep(for: .milliseconds(SlicedApply.gapMilliseconds))
        } else {
            await Task.yield()
        }
    }

    /// How long this store held SQLite's write lock so far (see ``WriteLockHolds``); readable at once, also while a
    /// transaction is open.
    public nonisolated var writeLockHolds: WriteLockHolds { WriteLockHolds(writeHolds.reading) }

    /// Forgets the write-lock holds measured so far.
    public nonisolated func resetWriteLockHolds() { writeHolds.reset() }

    /// The state digest (see ``Store/digest()``).
    public func digest() throws(ShoalError) -> StateDigest {
        try store.digest()
    }

    /// Whether another connection (another process) committed since the last call. Writes other SQLite
    /// clients made to replicated tables are captured (given clocks and a dot) here, and at the first call.
    /// A capture that failed (the file busy beyond SQLite's timeout, say) is retried with backoff, and the
    /// error is thrown to the caller once per failure.
    package func changedElsewhere() throws(ShoalError) -> Bool {
        let version = try store.dataVersion()
        let changed = lastDataVersion != 0 && version != lastDataVersion
        let now = clock.nowMilliseconds()
        var captured = false
        if lastDataVersion == 0 || changed || (captureFailing && now >= captureRetryAt) {
            do {
                captured = try store.captureForeignWrites()
                captureFailing = false
                captureBackoff.reset()
            } catch {
                captureFailing = true
                captureRetryAt = now + captureBackoff.next()
                lastDataVersion = version
                throw error
            }
        }
        lastDataVersion = version
        if changed { otherWriterCommittedAt = now }
        if changed || captured {
            markChanged()
            // Another connection committed: which tables it wrote is known only for what this store captured from
            // the outbox (another Shoal process stamps its own writes, and a node's applies write directly).
            publish(.otherConnection, tablesKnown: !changed)
        }
        return changed || captured
    }

    /// Whether the last capture of other writers' changes failed; it is retried at `captureRetryAt`.
    private var captureFailing = false
    private var captureRetryAt: UInt64 = 0
    private var captureBackoff = Backoff(initialMilliseconds: 200, maximumMilliseconds: 30_000)

    /// One slice of change-log compaction (replicated data is untouched: the digest stays valid).
    package func compactLog(maxEntries: Int) throws(ShoalError) -> CompactionReport {
        try store.compactLog(maxEntries: maxEntries)
    }

    /// See ``Store/awaitsFreshState()``.
    package func awaitsFreshState() throws(ShoalError) -> Bool { try store.awaitsFreshState() }

    /// See ``Store/freshStateFloor()``.
    package func freshStateFloor() throws(ShoalError) -> VersionVector { try store.freshStateFloor() }

    /// See ``Store/knowsOfCollection()``.
    package func knowsOfCollection() throws(ShoalError) -> Bool { try store.knowsOfCollection() }
    package func unsettledSuspensions() throws(ShoalError) -> [Suspension] { try store.unsettledSuspensions() }

    /// See ``Store/memberWritingSites``.
    package func setMemberWritingSites(_ sites: [SiteID: Set<SiteID>]) { store.memberWritingSites = sites }

    /// See ``Store/freshStateTaken(covering:)``; then settles the suspensions it covers.
    package func freshStateTaken(covering covers: VersionVector) throws(ShoalError) {
        try store.freshStateTaken(covering: covers)
        if try store.settleSuspensions() > 0 { wroteLocally() }
    }

    /// See ``Store/freshStateCovers()``.
    package func freshStateCovers() throws(ShoalError) -> VersionVector { try store.freshStateCovers() }

    /// See ``Store/suspend(_:cut:)``.
    @discardableResult
    package func suspend(_ sites: Set<SiteID>, cut: VersionVector) throws(ShoalError) -> [SiteID] {
        let written = try store.suspend(sites, cut: cut)
        if !written.isEmpty { wroteLocally() }
        return written
    }

    /// See ``Store/movesBeyondInternalWrites(from:to:)``.
    package func movesBeyondInternalWrites(from: VersionVector, to: VersionVector) throws(ShoalError) -> Bool {
        try store.movesBeyondInternalWrites(from: from, to: to)
    }

    /// See ``Store/suspensions()``, with this node's own record (``Store/ownSuspensions()``) and the members' records
    /// of their fresh states (``Store/freshStatesTaken()``).
    package func suspensions() throws(ShoalError) -> (
        rows: [Suspension], own: [SiteID: VersionVector], taken: [SiteID: VersionVector]
    ) {
        (try store.suspensions(), try store.ownSuspensions(), try store.freshStatesTaken())
    }

    /// See ``Store/writeMemberReport(site:name:holds:atMs:)``.
    package func writeMemberReport(
        site: SiteID,
        name: String?,
        holds vector: VersionVector,
        atMs: UInt64
    ) throws(ShoalError) -> Bool {
        guard try store.writeMemberReport(site: site, name: name, holds: vector, atMs: atMs) else { return false }
        // Which table it wrote is known: a node's report watcher tells its own reports from other commits by it.
        wroteLocally(tablesKnown: true)
        return true
    }

    /// See ``Store/memberReports()``.
    package func memberReports() throws(ShoalError) -> [MemberReport] { try store.memberReports() }

    /// See ``Store/readmit(_:covering:)``.
    package func readmit(_ site: SiteID, covering covers: VersionVector) throws(ShoalError) -> Bool {
        try store.readmit(site, covering: covers)
    }

    /// See ``Store/dropSettledNotices()``.
    @discardableResult
    package func dropSettledNotices() throws(ShoalError) -> Int {
        let dropped = try store.dropSettledNotices()
        if dropped > 0 { wroteLocally() }
        return dropped
    }

    /// See ``Store/settleSuspensions()``.
    @discardableResult
    package func settleSuspensions() throws(ShoalError) -> Int {
        let settled = try store.settleSuspensions()
        if settled > 0 { wroteLocally() }
        return settled
    }

    /// See ``Store/awaitFreshStateIfSuspended()``.
    package func awaitFreshStateIfSuspended() throws(ShoalError) -> Bool { try store.awaitFreshStateIfSuspended() }

    /// See ``Store/takeFreshState(table:keys:peerVector:)``.
    package func takeFreshState(table: String, keys: [[UInt8]], peerVector: VersionVector) throws(ShoalError)
        -> FreshStateReport
    {
        let report = try store.takeFreshState(table: table, keys: keys, peerVector: peerVector)
        if report.removed + report.orphaned > 0 {
            markChanged()
            publish(.local)
        }
        return report
    }

    /// See ``Store/collectTombstones(upTo:maxRows:)``. A pass that collected something raised the tables' floors (a
    /// change of this node, which peers are told of); the rows it left are the same, so the digest is too.
    package func collectTombstones(upTo cut: VersionVector, maxRows: Int) throws(ShoalError) -> CollectionReport {
        let report = try store.collectTombstones(upTo: cut, maxRows: maxRows)
        if report.collected > 0 {
            markChanged()
            _ = try? versionVector()
            publish(.local)
            // The pages the tombstones held go back to the file system, a bounded number at a time.
            _ = try? store.reclaimFreePages()
        }
        return report
    }

    /// Runs `body` on the store without counting it as a change of the data (reads, and Shoal's local tables).
    public func read<T: Sendable>(_ body: (Store) throws(ShoalError) -> T) throws(ShoalError) -> T {
        try body(store)
    }

    /// Runs `body` on the store as a write that may change replicated data.
    public func withStore<T: Sendable>(_ body: (Store) throws(ShoalError) -> T) throws(ShoalError) -> T {
        markChanged()
        defer {
            _ = try? versionVector()
            publish(.local)
        }
        return try body(store)
    }

    /// Remembers a peer's address (not replicated data: the digest stays valid).
    package func rememberPeer(_ site: SiteID, host: String, port: Int) throws(ShoalError) {
        try store.rememberPeer(site, host: host, port: port)
    }

    package func forgetPeer(_ site: SiteID) throws(ShoalError) {
        try store.forgetPeer(site)
    }

    package func knownPeers() throws(ShoalError) -> [KnownPeer] {
        try store.knownPeers()
    }

    /// The digest, if the cached one is still current (cheap: for acknowledgements).
    package func currentDigest() -> StateDigest? {
        guard let cachedDigest, cachedDigest.version == stateVersion else { return nil }
        return cachedDigest.digest
    }

    /// The current digest, if it can be compared with a peer's: not while this database holds changes it cannot
    /// apply yet (for a column or table it lacks, see ``Store/heldChanges()``), since its rows then differ from a
    /// peer's that applied them, by design, until it makes the schema change.
    package func comparableDigest() -> StateDigest? {
        guard let cachedDigest, cachedDigest.version == stateVersion, !cachedDigest.holdsChanges else { return nil }
        return cachedDigest.digest
    }

    /// What a call to ``refreshDigest(minimumIntervalMilliseconds:quietMilliseconds:now:)`` got to.
    package enum DigestRefresh {
        /// The digest, current.
        case ready(StateDigest)
        /// Not now: the data is not quiet yet, or the last refresh is too recent.
        case notDue
        /// A slice of the changed rows was folded in; call again (whatever waits for the store runs first).
        case inProgress
    }

    /// How many changed rows one refresh call folds into the digest at most: each call is one write transaction, and
    /// 2,000 rows fold in well under 50 ms, so an app writing the file beside a catch-up waits that long at most.
    package static let digestSliceRows = 2_000

    /// Brings the digest up to date if it is stale, the last refresh is at least `interval` ms old, and the data
    /// has been quiet for `quiet` ms, folding in changed rows a slice at a time. Not while an answer to a peer is
    /// being read (an open delta cursor): folding a bulk import's rows would halve what a catching-up peer gets; the
    /// fold goes on once the answer is sent.
    package func refreshDigest(
        minimumIntervalMilliseconds interval: UInt64,
        quietMilliseconds quiet: UInt64,
        now: UInt64
    ) throws(ShoalError) -> DigestRefresh {
        if let current = currentDigest() { return .ready(current) }
        guard now >= digestComputedAt + interval, now >= lastChangeAt + quiet, store.openCursors.count == 0 else {
            return .notDue
        }
        let version = stateVersion
        guard try store.settleDigest(maxRows: Self.digestSliceRows) else { return .inProgress }
        let digest = try store.digest()
        cachedDigest = (version, digest, try store.holdsChanges())
        digestComputedAt = now
        return .ready(digest)
    }
}
