import ShoalCore

/// What a node learned of a peer's wall clock: its latest reading, and where the monotonic clock stood when it came,
/// so that it can be carried forward without trusting the local wall clock.
struct PeerClockEvidence {
    var wall: UInt64
    var steady: UInt64

    /// The peer's wall clock now, by the time elapsed since its reading.
    func estimate(steadyNow: UInt64) -> UInt64 { wall &+ (steadyNow &- steady) }
}

extension Store {
    /// The wall clock this store stamps writes with, read now (milliseconds since the Unix epoch).
    public func wallClockMilliseconds() -> UInt64 { options.clock.nowMilliseconds() }

    /// Notes peer `peer`'s wall clock reading (milliseconds since the Unix epoch; it travels in each request a peer
    /// sends), and returns how far this machine's clock is ahead of it (negative: behind).
    ///
    /// A machine can start with its clock far ahead (a real-time clock reset, a wrong time zone setting, a manual
    /// change), and with no earlier reading to compare with, the jump check of local stamps cannot see it; peers would
    /// then refuse every write stamped ahead. So the store keeps its peers' latest readings, carried forward by its own
    /// monotonic clock. When at least two peers were heard in the last hour and this machine's clock runs ahead of even
    /// the most advanced of them by more than the drift bound, it is the one that is wrong: local writes are stamped
    /// with that peer's time instead, and writes made ahead and never sent are stamped again
    /// (``restampUnsentWrites(aheadOf:)``), with an error logged and ``clockAheadOfPeersMilliseconds`` set for status.
    /// A single peer is no such evidence (of two clocks a day apart, either may be wrong: the peer behind refuses the
    /// changes stamped ahead, and both say so), and a peer whose clock is behind never holds this node back.
    @discardableResult
    public func notePeerClock(_ wallMilliseconds: UInt64, from peer: SiteID) -> Int64 {
        peerClocks[peer] = PeerClockEvidence(wall: wallMilliseconds, steady: options.clock.monotonicMilliseconds())
        if let peerNow = peerClockNow(), options.clock.nowMilliseconds() > peerNow + options.maximumClockDriftMilliseconds {
            do {
                try restampUnsentWrites(aheadOf: peerNow)
            } catch {
                options.logger.error(
                    "cannot stamp again the writes made while this machine's clock ran ahead",
                    metadata: ["error": "\(error.message)"]
                )
            }
        }
        return Int64(bitPattern: options.clock.nowMilliseconds() &- wallMilliseconds)
    }

    /// Stamps again, with the peers' time, this database's own transactions that carry a clock ahead of `peerNow` by
    /// more than the drift bound and were never sent (beyond what `PATH.shoal-sent` records: no answer, upload or
    /// stream ever carried them, so no other node holds them). Written while the machine's clock ran ahead (it started
    /// that way, before it heard any peer), they would hold back every later write of this site, and peers would
    /// refuse them until time caught up.
    ///
    /// Each keeps its number and its order; its new clock follows every clock this database observed from peers and
    /// every transaction of its own already sent, so it still wins over everything it overwrote here.
    func restampUnsentWrites(aheadOf peerNow: UInt64) throws(ShoalError) {
        guard Self.isOnDisk(path), connection.isAutocommit, !capture.hasUncommittedWork else { return }
        let sent = Self.readSent(path)[siteID] ?? 0
        guard sent != Self.forkedMarker else { return }
        let limit = HLC(milliseconds: peerNow + options.maximumClockDriftMilliseconds, logical: .max)
        try beginWriting()
        do throws(ShoalError) {
            try refreshSchema()
            // The first unsent transaction stamped ahead, and every later one (a site's clock only goes forward).
            let first = try connection.scalar(
                "SELECT min(seq) FROM shoal_log WHERE site = ? AND seq > ? AND hlc > ?",
                [.integer(ownSiteIndex), .integer(Int64(bitPattern: sent)), .integer(Int64(bitPattern: limit.rawValue))]
            ).integerValue
            guard let first else {
                try connection.exec("COMMIT")
                return
            }
            // After every clock observed from peers and every own transaction before the first one restamped.
            var floor = HLC(milliseconds: peerNow, logical: 0)
            let observed = try connection.scalar(
                "SELECT max((SELECT value FROM shoal_meta WHERE key = 'hlc_high'), "
                    + "coalesce((SELECT max(hlc) FROM shoal_log WHERE site = ? AND seq < ?), 0))",
                [.integer(ownSiteIndex), .integer(first)]
            ).integerValue ?? 0
            if HLC(rawValue: UInt64(bitPattern: observed)) >= floor { floor = HLC(rawValue: UInt64(bitPattern: observed) + 1) }
            var rows: [(seq: Int64, table: Int64, keys: [UInt8])] = []
            for row in try connection.rows(
                "SELECT seq, tbl, keys FROM shoal_log WHERE site = ? AND seq >= ? ORDER BY seq, tbl",
                [.integer(ownSiteIndex), .integer(first)]
            ) {
                guard case .integer(let seq) = row[0], case .integer(let table) = row[1], case .blob(let keys) = row[2]
                else { continue }
                rows.append((seq, table, keys))
            }
            var clocks: [Int64: HLC] = [:]
            var next = floor
            for seq in Set(rows.map(\.seq)).sorted() {
                clocks[seq] = next
                next = HLC(rawValue: next.rawValue + 1)
            }
            let tablesByID = Dictionary(uniqueKeysWithValues: capture.tables.map { ($0.id, $0) })
            for (seq, tableID, keys) in rows {
                let hlc = clocks[seq]!
                try connection.rows(
                    "UPDATE shoal_log SET hlc = ? WHERE site = ? AND seq = ? AND tbl = ?",
                    [.integer(Int64(bitPattern: hlc.rawValue)), .integer(ownSiteIndex), .integer(seq), .integer(tableID)]
                )
                guard let table = tablesByID[tableID] else { continue }
                let dot = Dot(site: siteID, seq: UInt64(seq))
                var reader = ByteReader(keys)
                while !reader.isAtEnd {
                    let key = try Self.readLogKey(&reader, table: table)
                    guard var state = try loadState(table: table, key: key) else { continue }
                    state.restamp(dot, hlc: hlc)
                    try saveState(state, table: table, key: key)
                }
                try noteDigestPending(site: ownSiteIndex, seq: seq, table: tableID, keys: keys)
            }
            try connection.exec("COMMIT")
            hybridClock = HybridClock(latest: HLC(rawValue: next.rawValue - 1), maximumDriftMilliseconds: options.maximumClockDriftMilliseconds)
            options.logger.error(
                "local writes made while this machine's clock ran ahead, and never sent, are stamped with the peers' time",
                metadata: ["transactions": "\(clocks.count)", "from_seq": "\(first)"]
            )
        } catch {
            try? connection.exec("ROLLBACK")
            throw error
        }
    }

    /// How long a peer's clock reading counts without a newer one.
    static let peerClockLifetime: UInt64 = 60 * 60 * 1000

    /// How far this machine's clock runs ahead of its most advanced peer's, when that is beyond the drift bound and at
    /// least two peers were heard (local writes are then stamped with the peer's time); `nil` otherwise.
    public var clockAheadOfPeersMilliseconds: UInt64? {
        guard let peerNow = peerClockNow() else { return nil }
        let now = options.clock.nowMilliseconds()
        return now > peerNow + options.maximumClockDriftMilliseconds ? now - peerNow : nil
    }

    /// The most advanced peer's clock now, by the latest readings, when at least two peers were heard in the last hour;
    /// `nil` otherwise.
    func peerClockNow() -> UInt64? {
        let steady = options.clock.monotonicMilliseconds()
        let fresh = peerClocks.values.filter { steady &- $0.steady < Self.peerClockLifetime }
        guard fresh.count >= 2 else { return nil }
        return fresh.map { $0.estimate(steadyNow: steady) }.max()
    }
}
