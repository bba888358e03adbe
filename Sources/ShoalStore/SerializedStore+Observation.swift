import ShoalCore

extension SerializedStore {
    /// A live query: the result of `sql` now, then a new one after each commit that writes a table the query reads
    /// (its own writes, another connection's the node captured, changes from a peer or the relay), as SQLite reports
    /// the tables it reads. Results are coalesced: a consumer slower than the commits gets the newest result, never a
    /// stale one nor the same one twice in a row. Ends when the consumer stops iterating (or its task is cancelled);
    /// throws when the query cannot be prepared or run.
    ///
    /// Other connections' writes are seen when the node captures them (a running ``SyncNode`` looks every 20 ms).
    public nonisolated func observe(
        _ sql: String,
        _ arguments: [SQLValue] = []
    ) -> AsyncThrowingStream<QueryResult, any Error> {
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: QueryResult.self, bufferingPolicy: .bufferingNewest(1)
        )
        let producer = Task {
            do {
                // Subscribed before the first read: no commit falls between them.
                let commits = await self.commits()
                let (read, first, generation) = try await self.readObserved(sql, arguments)
                continuation.yield(first)
                var last = first
                var seen = generation
                for await commit in commits {
                    guard commit.generation > seen, commit.touches(read) else { continue }
                    let (result, at) = try await self.readResult(sql, arguments)
                    seen = at
                    guard result != last else { continue }
                    last = result
                    continuation.yield(result)
                }
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
        continuation.onTermination = { _ in producer.cancel() }
        return stream
    }

    /// The tables `sql` reads, its result now, and the generation that result holds.
    private func readObserved(_ sql: String, _ arguments: [SQLValue]) throws(ShoalError)
        -> (Set<String>, QueryResult, Int)
    {
        let read = try read { store throws(ShoalError) in try store.tablesRead(by: sql) }
        let (result, generation) = try readResult(sql, arguments)
        return (read, result, generation)
    }

    /// The result of `sql` now, and the generation it holds.
    private func readResult(_ sql: String, _ arguments: [SQLValue]) throws(ShoalError) -> (QueryResult, Int) {
        (try read { store throws(ShoalError) in try store.execute(sql, arguments) }, generation)
    }
}
