/// A hybrid logical clock value: physical milliseconds since the Unix epoch in the high 48 bits, a logical
/// counter in the low 16 bits.
///
/// Values compare as plain integers, so a later physical time always wins and the logical counter orders
/// events within one millisecond.
public struct HLC: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The packed value.
    public let rawValue: UInt64

    /// Wraps a packed value.
    public init(rawValue: UInt64) {
        self.rawValue = rawValue
    }

    /// Packs physical milliseconds and a logical counter.
    public init(milliseconds: UInt64, logical: UInt16) {
        self.rawValue = (milliseconds << 16) | UInt64(logical)
    }

    /// The smallest clock value.
    public static let zero = HLC(rawValue: 0)

    /// Physical milliseconds since the Unix epoch.
    public var milliseconds: UInt64 { rawValue >> 16 }

    /// The logical counter.
    public var logical: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    /// `milliseconds.logical`.
    public var description: String { "\(milliseconds).\(logical)" }

    /// Orders by physical time, then by the logical counter.
    public static func < (lhs: HLC, rhs: HLC) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// The hybrid logical clock of one node: issues monotonic timestamps and folds in the clocks it observes.
///
/// A remote clock further ahead of local physical time than `maximumDrift` is refused, never adopted:
/// adopting it would drag every later local write into the future.
public struct HybridClock: Sendable {
    /// The latest value issued or observed.
    public private(set) var latest: HLC
    /// How far ahead of local physical time a remote clock may be, in milliseconds.
    public let maximumDriftMilliseconds: UInt64

    /// Starts from `latest` (persisted by the store) with the given drift bound.
    public init(latest: HLC = .zero, maximumDriftMilliseconds: UInt64 = 5 * 60 * 1000) {
        self.latest = latest
        self.maximumDriftMilliseconds = maximumDriftMilliseconds
    }

    /// The next local timestamp: after every value issued or observed, and at least physical time.
    public mutating func tick(now: UInt64) -> HLC {
        let physical = HLC(milliseconds: now, logical: 0)
        let next = physical > latest ? physical : HLC(rawValue: latest.rawValue + 1)
        latest = next
        return next
    }

    /// Whether `remote` is within the drift bound relative to physical time `now`.
    public func accepts(_ remote: HLC, now: UInt64) -> Bool {
        remote.milliseconds <= now &+ maximumDriftMilliseconds
    }

    /// Folds in a remote clock value; throws ``ShoalError`` when it is beyond the drift bound.
    public mutating func observe(_ remote: HLC, now: UInt64) throws(ShoalError) {
        guard accepts(remote, now: now) else {
            throw ShoalError.clockTooFarAhead(remote: remote, now: now, bound: maximumDriftMilliseconds)
        }
        if remote > latest { latest = remote }
    }
}
