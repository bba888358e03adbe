import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The one source of time a node reads, injected so that tests drive time instead of sleeping.
///
/// It gives wall time (for clocks stamped on changes and for reports) and monotonic time (for timeouts,
/// keepalives and durations, which must not jump when the wall clock is stepped).
public protocol WallClock: Sendable {
    /// Milliseconds since the Unix epoch.
    func nowMilliseconds() -> UInt64

    /// Milliseconds on a clock that never goes back, from an arbitrary origin: for timeouts and durations.
    func monotonicMilliseconds() -> UInt64
}

extension WallClock {
    /// A clock that only tells wall time uses it for durations too (fine for test clocks, which only move
    /// when told to).
    public func monotonicMilliseconds() -> UInt64 { nowMilliseconds() }
}

/// The system's real-time clock.
public struct SystemWallClock: WallClock {
    /// The system's real-time clock.
    public init() {}

    /// Milliseconds since the Unix epoch, read from `CLOCK_REALTIME`.
    public func nowMilliseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }

    /// Milliseconds since an arbitrary origin, read from `CLOCK_MONOTONIC`.
    public func monotonicMilliseconds() -> UInt64 {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return UInt64(spec.tv_sec) * 1000 + UInt64(spec.tv_nsec) / 1_000_000
    }
}

/// A clock that only moves when told to; for tests.
public final class ManualWallClock: WallClock {
    /// The wall clock's reading, and the monotonic clock's.
    private let now: Mutex<(wall: UInt64, steady: UInt64)>

    /// Starts at `milliseconds`.
    public init(milliseconds: UInt64) {
        self.now = Mutex((milliseconds, milliseconds))
    }

    /// The time it was last set to.
    public func nowMilliseconds() -> UInt64 {
        now.withLock { $0.wall }
    }

    /// The monotonic reading: moved by ``advance(by:)`` and ``set(milliseconds:)``, not by ``jump(by:)``.
    public func monotonicMilliseconds() -> UInt64 {
        now.withLock { $0.steady }
    }

    /// Moves the clock by `milliseconds` (which may be negative, to model a clock stepped back).
    public func advance(by milliseconds: Int64) {
        now.withLock {
            $0.wall = UInt64(Int64($0.wall) + milliseconds)
            $0.steady = UInt64(Int64($0.steady) + milliseconds)
        }
    }

    /// Moves the wall clock alone (a clock set wrong, or stepped), while time itself runs on as before.
    public func jump(by milliseconds: Int64) {
        now.withLock { $0.wall = UInt64(Int64($0.wall) + milliseconds) }
    }

    /// Sets the clock.
    public func set(milliseconds: UInt64) {
        now.withLock { $0 = (milliseconds, milliseconds) }
    }
}
