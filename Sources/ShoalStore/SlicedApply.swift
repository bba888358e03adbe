import ShoalCore

/// Applies one batch of remote changes as a run of short write transactions, each sized to hold SQLite's write lock
/// for about ``targetMilliseconds``, so that an app writing the same file beside a catch-up waits on its busy handler
/// for one slice at most, never for a whole batch.
///
/// Each slice is an ordinary ``Store/apply(_:claim:since:received:)`` with no claim: what it merges is committed, but
/// the version vector does not move. The batch's claim is taken last, in a transaction of its own, as far as every
/// slice together proves it (the slices' ``ApplyReport/acceptedHighest`` carried, as batches of one answer carry
/// theirs). Between slices, or after a crash there, the database holds some changes it does not claim: merging is
/// idempotent, so the next pull sends them again and they change nothing. The vector never claims what is not
/// committed.
///
/// A batch that carries roster or schema records is applied whole, in one transaction: a removal fences the changes
/// that travel with it, and a schema change must be made before the values it brings are merged. So is a batch no
/// larger than the first slice (live sync's few changes): one commit, as before slicing.
package struct SlicedApply {
    /// What each slice aims to hold the write lock for; the busy timeout an app sets must exceed the longest hold.
    package static let targetMilliseconds = 20.0
    /// The fewest and the most changes in one slice.
    package static let sliceBounds = 64...5_000
    /// The pause between slices while another connection writes the file: an app's busy handler then takes the lock
    /// within a few of its polls (p99 wait 34 ms against 630 without, measured), at the cost of the app's own writes,
    /// which the node captures and sends as they come.
    package static let gapMilliseconds = 4
    /// How long after another connection's last commit the pauses go on.
    package static let otherWriterWindowMilliseconds: UInt64 = 1_000

    private let changes: [Change]
    private let claim: VersionVector
    /// What earlier batches of the answer applied, and then what this batch's slices applied.
    private(set) var carried: [SiteID: UInt64]
    private var position = 0
    private var sliceSize: Int
    private let whole: Bool
    /// Sites a slice refused for a clock too far ahead: their later changes in the batch are left out too (a site's
    /// clocks grow with its seq), so that no later slice proves a claim over the refused ones.
    private var refusedSites: Set<SiteID> = []
    /// The schema version the whole batch was checked at, before its first slice.
    private var validatedAt: Int64?
    private(set) var finished = false
    /// The slices' reports added up.
    package private(set) var report = ApplyReport()
    /// The slices committed so far (the claim's transaction not counted).
    package private(set) var slicesCommitted = 0

    /// Whether the batch ends a whole answer whose earlier batches withheld nothing (see
    /// ``Store/apply(_:claim:since:received:completing:)``).
    private let completing: Bool

    /// `received`: what earlier batches of the same answer applied (see ``Store/apply(_:claim:since:received:)``).
    /// `completing`: the batch is the last of its answer and nothing was withheld before it.
    /// `firstSlice`: the changes the first slice takes, before any is timed.
    package init(_ batch: ChangeBatch, received: [SiteID: UInt64], completing: Bool = false, firstSlice: Int = 256) {
        changes = batch.changes
        claim = batch.claim
        carried = received
        self.completing = completing
        sliceSize = min(max(firstSlice, Self.sliceBounds.lowerBound), Self.sliceBounds.upperBound)
        // A batch no larger than the first slice is one slice: applied with its claim in one transaction, as before
        // slicing (live sync's batches of a few changes pay no second commit, and wake peers once).
        whole = batch.changes.count <= sliceSize
            || batch.changes.contains { $0.table == Store.rosterTable || $0.table == Store.schemaTable }
    }

    /// Commits the next slice, or takes the claim after the last; returns whether the batch is done.
    package mutating func step(_ store: Store) throws(ShoalError) -> Bool {
        guard !finished else { return true }
        if whole {
            add(try store.apply(changes, claim: claim, received: carried, completing: completing))
            finished = true
            return true
        }
        if position == 0, slicesCommitted == 0, !changes.isEmpty {
            // Refused whole, before anything is written, as one transaction would be.
            validatedAt = try store.validateBeforeSlices(changes, claim: claim)
        }
        guard position < changes.count else {
            add(try store.apply([], claim: claim, received: carried, completing: completing && !report.withheldAny))
            finished = true
            return true
        }
        let end = Self.cut(changes, from: position, size: sliceSize)
        var slice = Array(changes[position..<end])
        if !refusedSites.isEmpty { slice.removeAll { refusedSites.contains($0.stamp.site) } }
        let started = ContinuousClock.now
        let sliceReport = try store.apply(slice, claim: VersionVector(), received: [:], validatedAt: validatedAt)
        let elapsed = (ContinuousClock.now - started).components
        let milliseconds = Double(elapsed.seconds) * 1_000 + Double(elapsed.attoseconds) / 1e15
        add(sliceReport)
        refusedSites.formUnion(sliceReport.clockRefusals.keys)
        slicesCommitted += 1
        position = end
        sliceSize = Self.nextSize(after: slice.count, taking: milliseconds, previous: sliceSize)
        return false
    }

    private mutating func add(_ sliceReport: ApplyReport) {
        report.add(sliceReport)
        carried.merge(sliceReport.acceptedHighest) { max($0, $1) }
    }

    /// Where a slice of about `size` changes from `start` ends: at the last transaction boundary in its second half
    /// when there is one (a transaction's changes commit together), else after `size` changes (a transaction larger
    /// than a slice spans several, as one larger than a batch spans batches).
    static func cut(_ changes: [Change], from start: Int, size: Int) -> Int {
        let end = min(changes.count, start + size)
        guard end < changes.count else { return end }
        var boundary = end
        while boundary > start + size / 2 {
            if changes[boundary].stamp.dot != changes[boundary - 1].stamp.dot { return boundary }
            boundary -= 1
        }
        return end
    }

    /// The next slice's size: as many changes as the last slice's pace fits in the target, growing at most twofold.
    static func nextSize(after count: Int, taking milliseconds: Double, previous: Int) -> Int {
        guard count > 0, milliseconds > 0 else { return min(previous * 2, sliceBounds.upperBound) }
        let fitting = Int(targetMilliseconds / milliseconds * Double(count))
        return min(max(min(fitting, previous * 2), sliceBounds.lowerBound), sliceBounds.upperBound)
    }
}
