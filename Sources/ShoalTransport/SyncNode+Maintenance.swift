import ShoalCore
import ShoalStore

/// What the node does on its own, besides connections: noticing commits, periodic rounds, log compaction.
extension SyncNode {
    func watchLocalChanges() async throws {
        // A failed first capture is retried with backoff by the worker, like any later one.
        _ = try? await worker.changedElsewhere()
        while !Task.isCancelled {
            try await Task.sleep(for: .milliseconds(configuration.localChangePollMilliseconds))
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

    /// Acts on every commit to the database, whatever made it: a local write (through the node, or another
    /// connection's, captured) or changes from the relay start rounds with every connected peer at once; changes
    /// from a peer wake the node's change watchers (the relay uploader).
    func followCommits() async {
        for await commit in await worker.commits() {
            switch commit.origin {
            case .local, .otherConnection, .relay: broadcast(.localChange)
            case .peer: signalChangeWatchers()
            }
        }
    }

    func periodicRounds() async throws {
        while !Task.isCancelled {
            let interval = Double(configuration.roundIntervalMilliseconds) * Double.random(in: 0.8...1.2)
            try await Task.sleep(for: .milliseconds(UInt64(interval)))
            broadcast(.localChange)
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
