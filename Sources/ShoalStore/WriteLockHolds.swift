import ShoalSQLite

/// How long a store held SQLite's write lock, transaction by transaction: from the `BEGIN IMMEDIATE` of each of its
/// write transactions (applies, captures of other connections' writes, digest and log maintenance) to its `COMMIT`
/// or `ROLLBACK`. Every other writer of the file (an app's own connection) waits at most about that long for the lock.
public struct WriteLockHolds: Sendable, Hashable, Codable {
    /// The write transactions measured since the store opened (or the meter was reset).
    public var transactions: UInt64
    /// The longest hold, in milliseconds.
    public var longestMilliseconds: Double
    /// How many holds took longer than 50 ms.
    public var over50Milliseconds: UInt64
    /// All holds together, in milliseconds.
    public var totalMilliseconds: Double

    init(_ reading: WriteHoldMeter.Reading) {
        transactions = reading.transactions
        longestMilliseconds = Double(reading.longestNanoseconds) / 1_000_000
        over50Milliseconds = reading.over50Milliseconds
        totalMilliseconds = Double(reading.totalNanoseconds) / 1_000_000
    }
}

extension Store {
    /// How long this store held SQLite's write lock so far (see ``WriteLockHolds``).
    public var writeLockHolds: WriteLockHolds { WriteLockHolds(writeHolds.reading) }

    /// Forgets the write-lock holds measured so far.
    public func resetWriteLockHolds() { writeHolds.reset() }
}
