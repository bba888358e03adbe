import ShoalCore

/// Where a change feed stands: the transactions it has delivered, per site. An app persists ``text`` and resumes
/// from it after a restart; a feed resumed from a cursor delivers every change set the cursor does not hold.
public struct ChangeFeedCursor: Hashable, Sendable, CustomStringConvertible {
    /// The transactions delivered, per site.
    public var versionVector: VersionVector

    /// A cursor at `versionVector` (empty: from the beginning).
    public init(_ versionVector: VersionVector = VersionVector()) {
        self.versionVector = versionVector
    }

    /// The cursor as text to persist: `site-hex:seq` entries separated by commas (empty: from the beginning).
    public var text: String {
        versionVector.entries.sorted { $0.key < $1.key }.map { "\($0.key.hex):\($0.value)" }.joined(separator: ",")
    }

    /// A cursor read back from ``text``; nil when `text` is not one.
    public init?(text: String) {
        var entries: [SiteID: UInt64] = [:]
        for entry in text.split(separator: ",") {
            let parts = entry.split(separator: ":")
            guard parts.count == 2, let site = SiteID(hex: parts[0]), let seq = UInt64(parts[1]) else { return nil }
            entries[site] = seq
        }
        self.init(VersionVector(entries))
    }

    /// The cursor as text (``text``), to store and pass back.
    public var description: String { text }
}

/// One committed change set, as a change feed delivers it.
public struct FeedChangeSet: Sendable, Hashable {
    /// A row the change set wrote.
    public struct Row: Sendable, Hashable {
        /// Its table.
        public var table: String
        /// Its primary key values, in the key's column order.
        public var primaryKey: [SQLValue]
        /// Whether the change set deleted it.
        public var deleted: Bool
        /// The last-writer-wins columns it set, with their values (counter columns are not listed).
        public var columns: [String: SQLValue]
    }

    /// The transaction.
    public var dot: Dot
    /// Whether this node wrote it (through its own connection, or another connection it captured), or it came from
    /// another node (a peer or the relay).
    public var isLocal: Bool
    /// When it was written (its hybrid logical clock, milliseconds since the Unix epoch in the high bits).
    public var hlc: HLC
    /// The rows it wrote, in the tables the feed follows.
    public var rows: [Row]
    /// The feed's cursor once this change set is delivered: persist it to resume after this change set.
    public var cursor: ChangeFeedCursor
}

/// The committed change sets of a database, in the order each site made them, from a cursor on: a pull-based
/// `AsyncSequence` (``SerializedStore/changes(in:after:)``). It reads only as fast as its consumer asks, so it never
/// buffers and never drops: a consumer that falls behind gets what it missed from the database when it asks.
///
/// Change sets are read from the database's change log: a row overwritten since the cursor is delivered with the
/// change set that last wrote it (earlier change sets of it are not repeated), as a peer catching up receives it.
public struct ChangeFeed: AsyncSequence, Sendable {
    /// Each element is one change set.
    public typealias Element = FeedChangeSet

    let store: SerializedStore
    let tables: Set<String>?
    let cursor: ChangeFeedCursor

    /// An iterator that delivers the change sets after the cursor, then each new one as it commits.
    public func makeAsyncIterator() -> Iterator {
        Iterator(store: store, tables: tables, cursor: cursor)
    }

    /// Reads change sets as they are asked for; waits for the next commit when it has delivered everything.
    public struct Iterator: AsyncIteratorProtocol {
        let store: SerializedStore
        let tables: Set<String>?
        var cursor: ChangeFeedCursor
        var pending: [FeedChangeSet] = []
        var commits: AsyncStream<StoreCommit>.Iterator?
        var seen = -1

        init(store: SerializedStore, tables: Set<String>?, cursor: ChangeFeedCursor) {
            self.store = store
            self.tables = tables
            self.cursor = cursor
        }

        /// The next change set, waiting for one to commit when none is left.
        public mutating func next() async throws -> FeedChangeSet? {
            if commits == nil { commits = await store.commits().makeAsyncIterator() }
            while pending.isEmpty {
                try Task.checkCancellation()
                let generation = await store.generation
                let (sets, end) = try await read()
                pending = sets
                guard pending.isEmpty else { break }
                // Change sets only of tables the feed does not follow: on past them, without delivering them.
                if end != cursor {
                    cursor = end
                    continue
                }
                // Everything is delivered: wait for a commit after what was read (ends when the task is cancelled).
                while true {
                    guard let commit = await commits?.next() else { return nil }
                    if commit.generation > generation, tables.map({ commit.touches($0) }) ?? true { break }
                }
            }
            let next = pending.removeFirst()
            cursor = next.cursor
            return next
        }

        /// The change sets of the next batch after the cursor, and the cursor past that batch.
        private func read() async throws -> ([FeedChangeSet], ChangeFeedCursor) {
            let own = try await store.read { store throws(ShoalError) in
                Set([store.siteID] + [try store.identityChange()?.previousSite].compactMap { $0 })
            }
            let handle = try await store.openCursor(since: cursor.versionVector)
            let batch = try await store.nextBatch(handle, maxChanges: 5_000, maxBytes: 4 << 20)?.batch
            await store.closeCursor(handle)
            guard let batch else { return ([], cursor) }
            var sets: [FeedChangeSet] = []
            var position = cursor.versionVector
            var index: [Dot: Int] = [:]
            for change in batch.changes {
                let dot = change.stamp.dot
                if index[dot] == nil {
                    position.advance(dot.site, to: dot.seq)
                    index[dot] = sets.count
                    sets.append(
                        FeedChangeSet(
                            dot: dot, isLocal: own.contains(dot.site), hlc: change.stamp.hlc, rows: [],
                            cursor: ChangeFeedCursor(position)
                        )
                    )
                }
                guard tables?.contains(change.table) ?? true else { continue }
                let at = index[dot]!
                let row: Int
                if let found = sets[at].rows.lastIndex(where: {
                    $0.table == change.table && $0.primaryKey == change.primaryKey
                }) {
                    row = found
                } else {
                    sets[at].rows.append(
                        FeedChangeSet.Row(table: change.table, primaryKey: change.primaryKey, deleted: false, columns: [:])
                    )
                    row = sets[at].rows.count - 1
                }
                sets[at].rows[row].deleted = change.causalLength % 2 == 0
                if case .column(let name, let value) = change.payload { sets[at].rows[row].columns[name] = value }
            }
            return (sets.filter { !$0.rows.isEmpty }, ChangeFeedCursor(position))
        }
    }
}

extension SerializedStore {
    /// The committed change sets of `tables` (nil: every replicated table) after `cursor`, as a pull-based sequence
    /// that waits for new commits once it has delivered everything (see ``ChangeFeed``). Ends when the consuming task is
    /// cancelled.
    public nonisolated func changes(in tables: Set<String>? = nil, after cursor: ChangeFeedCursor = ChangeFeedCursor())
        -> ChangeFeed
    {
        ChangeFeed(store: self, tables: tables, cursor: cursor)
    }
}
