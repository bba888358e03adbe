/// How long to wait before trying again after failures: exponential, capped, with jitter.
///
/// The one backoff of the node: dialling peers, retrying discovery, retrying the capture of other writers'
/// changes. Each ``next(using:)`` returns the current delay with jitter applied and doubles the delay for the
/// time after, up to ``maximumMilliseconds``; ``reset()`` starts again from ``initialMilliseconds`` after a
/// success. Randomness is passed in, so tests are deterministic.
public struct Backoff: Sendable, Hashable {
    /// The first delay.
    public let initialMilliseconds: UInt64
    /// The largest delay (before jitter).
    public let maximumMilliseconds: UInt64
    /// The factor range each delay is multiplied by, drawn uniformly: spreads retries of many nodes apart.
    public let jitter: ClosedRange<Double>
    /// The delay the next call returns, before jitter.
    public private(set) var currentMilliseconds: UInt64

    /// A backoff from `initial` doubling to `maximum` milliseconds, each delay multiplied by a factor in `jitter`.
    public init(initialMilliseconds: UInt64, maximumMilliseconds: UInt64, jitter: ClosedRange<Double> = 0.8...1.2) {
        self.initialMilliseconds = max(1, initialMilliseconds)
        self.maximumMilliseconds = max(self.initialMilliseconds, maximumMilliseconds)
        self.jitter = jitter
        self.currentMilliseconds = self.initialMilliseconds
    }

    /// The delay to wait now (jittered), and the next one doubles.
    public mutating func next(using random: inout some RandomNumberGenerator) -> UInt64 {
        let scaled = Double(currentMilliseconds) * Double.random(in: jitter, using: &random)
        // Clamped: a delay near UInt64.max rounds up past it as a Double.
        let delay = scaled < Double(UInt64.max) ? UInt64(max(0, scaled)) : UInt64.max
        currentMilliseconds = min(currentMilliseconds.multipliedReportingOverflow(by: 2).partialValue, maximumMilliseconds)
        if currentMilliseconds < initialMilliseconds { currentMilliseconds = maximumMilliseconds }
        return delay
    }

    /// The delay to wait now, with the system's randomness.
    public mutating func next() -> UInt64 {
        var random = SystemRandomNumberGenerator()
        return next(using: &random)
    }

    /// Starts again from the first delay (after a success).
    public mutating func reset() {
        currentMilliseconds = initialMilliseconds
    }
}
