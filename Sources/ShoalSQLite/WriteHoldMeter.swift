import Synchronization

/// Measures how long a connection holds SQLite's write lock: from the statement that opened a write transaction
/// (`BEGIN IMMEDIATE`) to the one that ended it (`COMMIT`, `ROLLBACK`), for every write transaction opened and ended
/// through ``SQLiteConnection/exec(_:)``. While one connection holds the lock, every other writer of the file waits
/// in its busy handler: the longest hold bounds what an app's writer waits on this one.
///
/// Read from any thread (a status report reads it while the connection's owner is in a transaction).
package final class WriteHoldMeter: Sendable {
    /// What the meter saw so far.
    package struct Reading: Sendable, Hashable {
        /// The write transactions measured.
        package var transactions: UInt64 = 0
        /// The longest hold, in nanoseconds.
        package var longestNanoseconds: UInt64 = 0
        /// How many holds took longer than 50 ms.
        package var over50Milliseconds: UInt64 = 0
        /// All holds together, in nanoseconds.
        package var totalNanoseconds: UInt64 = 0
    }

    private let state = Mutex(Reading())

    package init() {}

    /// What was measured so far.
    package var reading: Reading { state.withLock { $0 } }

    /// Notes one write transaction that held the lock for `nanoseconds`.
    package func record(_ nanoseconds: UInt64) {
        state.withLock { reading in
            reading.transactions += 1
            reading.totalNanoseconds &+= nanoseconds
            reading.longestNanoseconds = max(reading.longestNanoseconds, nanoseconds)
            if nanoseconds > 50_000_000 { reading.over50Milliseconds += 1 }
        }
    }

    /// Starts again from nothing (a benchmark measures one phase).
    package func reset() {
        state.withLock { $0 = Reading() }
    }
}
