import ShoalCore

/// What a node learned of its peers' wall clocks: the most advanced reading, and where the monotonic clock stood
/// when it came, so that it can be carried forward without trusting the local wall clock.
struct PeerClockEvidence {
    var wall: UInt64
    var steady: UInt64

    /// The peer's wall clock now, by the time elapsed since its reading.
    func estimate(steadyNow: UInt64) -> UInt64 { wall &+ (steadyNow &- steady) }
}

extension Store {
    /// The wall clock this store stamps writes with, read now (milliseconds since the Unix epoch).
    public func wallClockMilliseconds() -> UInt64 { options.clock.nowMilliseconds() }

    /// Notes a peer's wall clock reading (milliseconds since the Unix epoch; it travels in each request a peer sends),
    /// and returns how far this machine's clock is ahead of it (negative: behind).
    ///
    /// A machine can start with its clock far ahead (a real-time clock reset, a wrong time zone setting, a manual
    /// change), and with no earlier reading to compare with, the jump check of local stamps cannot see it; peers would
    /// then refuse every write stamped ahead. So the store keeps the most advanced of its peers' clocks, carried
    /// forward by its own monotonic clock, and while the local clock runs ahead of even that one by more than the
    /// drift bound, local writes are stamped with the peers' time instead (with an error logged, and
    /// ``clockAheadOfPeersMilliseconds`` set for status). A peer whose clock is behind never holds this node back: only
    /// the most advanced peer counts.
    @discardableResult
    public func notePeerClock(_ wallMilliseconds: UInt64) -> Int64 {
        let steady = options.clock.monotonicMilliseconds()
        // The newest reading of the most advanced peer wins; a reading an hour old no longer holds a newer one back.
        let keep = peerClock.map {
            $0.estimate(steadyNow: steady) > wallMilliseconds && steady &- $0.steady < Self.peerClockLifetime
        }
        if keep != true { peerClock = PeerClockEvidence(wall: wallMilliseconds, steady: steady) }
        return Int64(bitPattern: options.clock.nowMilliseconds() &- wallMilliseconds)
    }

    /// How long a peer's clock reading counts without a newer one.
    static let peerClockLifetime: UInt64 = 60 * 60 * 1000

    /// How far this machine's clock runs ahead of its most advanced peer's, when that is beyond the drift bound (local
    /// writes are then stamped with the peer's time); `nil` otherwise.
    public var clockAheadOfPeersMilliseconds: UInt64? {
        guard let peerNow = peerClockNow() else { return nil }
        let now = options.clock.nowMilliseconds()
        return now > peerNow + options.maximumClockDriftMilliseconds ? now - peerNow : nil
    }

    /// The most advanced peer's clock now, by its latest reading; `nil` without one, or with one too old.
    func peerClockNow() -> UInt64? {
        guard let peerClock else { return nil }
        let steady = options.clock.monotonicMilliseconds()
        guard steady &- peerClock.steady < Self.peerClockLifetime else { return nil }
        return peerClock.estimate(steadyNow: steady)
    }
}
