import Testing

@testable import ShoalCore
@testable import ShoalStore

@Suite struct DeltaCursorTests {
    @Test func aLargeTransactionIsSplitAndAnInterruptedCatchUpResumes() throws {
        let source = try makeStore()
        try makeItems(source)
        try source.execute("INSERT INTO items(id, name) VALUES (10000, 'before')")
        let insert = try source.prepare("INSERT INTO items(id, name, qty) VALUES (?, ?, ?)")
        try source.transaction {
            for id in 0..<1_000 { try insert.execute([.integer(Int64(id)), .text("n\(id)"), .integer(Int64(id))]) }
        }
        try source.execute("INSERT INTO items(id, name) VALUES (20000, 'after')")
        let big = Dot(site: source.siteID, seq: 2)

        let batches = try source.changes(since: VersionVector(), maxChangesPerBatch: 100)
        #expect(batches.count > 25)
        // A batch ends once it reaches the limit, after the row in progress (items has 3 non-key columns).
        #expect(batches.allSatisfy { $0.changes.count < 100 + 3 })
        // Parts of the big transaction claim nothing for it until its last part.
        let parts = batches.filter { $0.changes.contains { $0.dot == big } }
        #expect(parts.dropLast().allSatisfy { !$0.claim.covers(big) })
        #expect(parts.last!.claim.covers(big))

        // Apply part of the catch-up, then resume from what the receiver claims.
        let target = try makeStore()
        try makeItems(target)
        for batch in batches.prefix(batches.count / 2) { try target.apply(batch.changes, claim: batch.claim) }
        #expect(!(try target.versionVector().covers(big)))
        try sync(source, target)
        #expect(try target.digest() == source.digest())
        #expect(try target.versionVector() == source.versionVector())
    }

    @Test func aCatchUpEstimatesTheChangesLeftWithinTwiceTheTruth() throws {
        // The estimate drives the ETA `shoal status` shows. It assumed 10 bytes a key; keys of one integer came to
        // take 3-4, and a catch-up's ETA fell to nothing a third of the way in.
        let source = try makeStore()
        try makeItems(source)
        let insert = try source.prepare("INSERT INTO items(id, name, qty) VALUES (?, ?, ?)")
        try source.transaction {
            for id in 0..<20_000 { try insert.execute([.integer(Int64(id)), .text("n\(id)"), .integer(Int64(id))]) }
        }
        try source.execute("UPDATE items SET name = 'x' WHERE id < 100")
        let cursor = try source.deltaCursor(since: VersionVector())
        var sent = 0
        while let batch = try source.nextBatch(cursor, maxChanges: 10_000) { sent += batch.changes.count }
        let estimated = Double(cursor.estimatedChanges)
        #expect(estimated >= Double(sent) / 2 && estimated <= Double(sent) * 2, "estimated \(estimated), sent \(sent)")
        #expect(Store.bytesPerLogKey([]) == 10)
    }

    @Test func theChangesLeftFollowTheKeysActuallyReadWhenLaterKeysAreLonger() throws {
        // The size-based estimate goes by the first list's keys: short ones here (ids under a thousand), where the rest
        // take twice the bytes. After a batch, the estimate goes by the lists' bytes left at the pace of that batch. By
        // the first list alone the ETA was 15 % (a million rows) to 2x (this) too long, and `shoal status` still showed
        // seconds left as the catch-up ended.
        let source = try makeStore()
        try makeItems(source)
        let insert = try source.prepare("INSERT INTO items(id, name, qty) VALUES (?, ?, ?)")
        try source.transaction {
            for id in 0..<1_000 { try insert.execute([.integer(Int64(id)), .text("n"), .integer(1)]) }
        }
        try source.transaction {
            for id in (1 << 28)..<((1 << 28) + 20_000) {
                try insert.execute([.integer(Int64(id)), .text("n"), .integer(1)])
            }
        }
        let cursor = try source.deltaCursor(since: VersionVector())
        let firstEstimate = cursor.estimatedRemaining
        var sizes: [Int] = []
        var estimates: [UInt64] = []
        while let batch = try source.nextBatch(cursor, maxChanges: 3_000) {
            sizes.append(batch.changes.count)
            estimates.append(cursor.estimatedRemaining)
        }
        let total = sizes.reduce(0, +)
        #expect(sizes.count > 10)
        #expect(Double(firstEstimate) > Double(total) * 1.5, "the first list's keys are the short ones")
        // The first batch read the short keys only (a thousand rows of three changes): from the second on, the
        // pace is the long keys'.
        var sent = sizes[0]
        for (size, estimate) in zip(sizes, estimates).dropFirst() {
            sent += size
            let truth = total - sent
            #expect(abs(Int(estimate) - truth) <= max(truth / 10, 3), "after \(sent) of \(total): \(estimate)")
        }
        #expect(estimates.last == 0)
    }

    @Test func anUpToDatePeerGetsOneEmptyBatch() throws {
        let source = try makeStore()
        try makeItems(source)
        try source.execute("INSERT INTO items(id, name) VALUES (1, 'a')")
        let batches = try source.changes(since: source.versionVector())
        #expect(batches.count == 1 && batches[0].changes.isEmpty)
        #expect(batches[0].claim == (try source.versionVector()))
    }
}
