import ShoalCore
import ShoalStore

/// What the node does on its own, besides connections: noticing commits, periodic rounds, log compaction.
extension SyncNode {
    /// Notices other processes' commits: at each write to the database's files (``DatabaseFileWatcher``), asks
    /// whether another connection committed, and captures what it wrote. An idle database costs nothing but one look
    /// a second.
    func watchLocalChanges() async throws {
        // A failed first capture is retried with backoff by the worker, like any later one.
        _ = try? await worker.changedElsewhere()
        let watcher = DatabaseFileWatcher(
            path: configuration.databasePath,
            safetyMilliseconds: Int32(clamping: configuration.commitSafetyLookMilliseconds),
            fallbackMilliseconds: Int32(clamping: configuration.localChangePollMilliseconds)
        )
        for await _ in watcher.changes() {
            guard !Task.isCancelled else { return }
            do {
                _ = try await worker.changedElsewhere()  // a capture is a commit: followCommits starts rounds
            } catch {
                // Retried with backoff by the worker; other writers' changes wait, nothing is lost.
                configuration.logger.warning(
                    "capturing other connections' writes failed",
                    metadata: ["error": "\(error)"]
                )
            }
        }
    }

    /// Acts on every commit to the database, whatever made it (a local write through the node or another
    /// connection's, captured; changes from a peer or from the relay): rounds start with every connected peer at
    /// once, and the node's change watchers (the relay uploader) wake. So a change applied from one peer is pushed on
    /// to the others at once, not at their next periodic round: each hop of a chain costs a round trip or two. The
    /// peer it came from answers that round with nothing (one small exchange), and a round that brings nothing new
    /// commits nothing, so this never loops.
    func followCommits() async {
        for await _ in await worker.commits() { broadcast(.localChange) }
    }

    /// The safety net under the rounds commits start: each link runs a round every interval, unless it is settled
    /// (the last exchange both ways brought nothing and nothing committed since), and then at least every few
    /// intervals, so digests are still compared and a change nobody announced is still found.
    func periodicRounds() async throws {
        while !Task.isCancelled {
            let interval = Double(configuration.roundIntervalMilliseconds) * Double.random(in: 0.8...1.2)
            try await Task.sleep(for: .milliseconds(UInt64(interval)))
            broadcast(.periodic)
        }
    }


    /// Keeps the change log from growing with overwritten entries, a slice at a time so writers and rounds
    /// never wait long.
    func compactPeriodically() async throws {
        while !Task.isCancelled {
            try await Task.sleep(for: .milliseconds(configuration.compactionIntervalMilliseconds))
            var pass = CompactionReport()
            repeat {
                do {
                    pass = try await worker.compactLog(maxEntries: 5_000)
                } catch {
                    configuration.logger.warning("change-log compaction failed", metadata: ["error": "\(error)"])
                    break
                }
                if pass.removed > 0 || pass.keysDropped > 0 {
                    configuration.logger.debug(
                        "compacted the change log",
                        metadata: ["removed": "\(pass.removed)", "keysDropped": "\(pass.keysDropped)"]
                    )
                }
                if !pass.reachedEnd { try await Task.sleep(for: .seconds(1)) }
            } while !pass.reachedEnd && !Task.isCancelled
        }
    }
}
