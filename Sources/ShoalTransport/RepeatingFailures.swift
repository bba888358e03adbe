import NIOCore
import NIOPosix
import ShoalCore

#if canImport(Glibc)
import Glibc
#endif

/// Keeps a repeating failure from being logged once per retry: the first occurrence of a reason is said, then
/// only the 10th, 100th, 1000th… repetition, with the count.
struct RepeatingFailures: Sendable {
    private var entries: [String: (reason: String, count: Int)] = [:]

    /// Records a failure of `key` (a peer or an address); returns the line to log, or `nil` to stay quiet. A
    /// repetition says the node retries with backoff, unless `retrying` is false (a connection it did not dial).
    mutating func note(_ key: String, _ reason: String, retrying: Bool = true) -> String? {
        let shape = Self.shape(of: reason)
        guard let entry = entries[key], entry.reason == shape else {
            entries[key] = (shape, 1)
            return reason
        }
        let count = entry.count + 1
        entries[key] = (shape, count)
        var power = 10
        while power < count { power *= 10 }
        guard power == count else { return nil }
        return "\(reason) (\(count) times in a row\(retrying ? "; retrying with backoff" : ""))"
    }

    /// Whether `key` failed the same way more than once in a row.
    func isRepeating(_ key: String) -> Bool { (entries[key]?.count ?? 0) > 1 }

    /// The failure of `key` is over (a round finished).
    mutating func clear(_ key: String) { entries[key] = nil }

    /// A reason with its numbers taken out, so "… 86399512 ms …" and "… 86399730 ms …" count as one.
    static func shape(of reason: String) -> String {
        String(reason.filter { !$0.isNumber })
    }
}

/// How far ahead of local time a peer's clocks looked, the last time it sent changes.
struct ClockView: Sendable {
    /// Milliseconds ahead (negative: behind) of local time, of the newest clock in its last batch.
    var ahead: Int64
    /// Whether the batch was refused for it.
    var refused: Bool
}

/// The message of a clock refusal: how far apart the clocks are, which one looks wrong, what happens meanwhile.
enum ClockRefusal {
    static func message(
        peer: String,
        aheadMilliseconds ahead: Int64,
        boundMilliseconds bound: UInt64,
        otherViews: [(name: String, view: ClockView)]
    ) -> String {
        let gap = humanDuration(milliseconds: UInt64(max(0, ahead)))
        // A third view: other peers whose clocks were also refused by about as much point at this node's clock;
        // other peers whose changes were in time point at the sender's.
        let alsoAhead = otherViews.filter { $0.view.refused && abs($0.view.ahead - ahead) <= max(ahead / 4, 60_000) }
        let inTime = otherViews.filter { $0.view.ahead <= Int64(bound) }
        let verdict: String
        if let other = alsoAhead.first {
            verdict =
                "\(other.name)'s clock is ahead by about as much, so this node's clock looks \(gap) behind: check "
                + "this machine's time"
        } else if let other = inTime.first {
            verdict = "\(other.name)'s clock agrees with this node's, so \(peer)'s clock looks \(gap) ahead: check that machine's time"
        } else {
            verdict = "with no third node to compare, it cannot be told which of the two clocks is wrong: check both"
        }
        return "changes from \(peer) carry clocks \(gap) ahead of this node's clock, beyond the allowed "
            + "\(humanDuration(milliseconds: bound)); \(verdict). Meanwhile none of its changes are applied: they are "
            + "held back until this node's clock reaches theirs (in about \(gap)) or the wrong clock is corrected, "
            + "and the node retries with backoff; other peers keep syncing"
    }

    /// "850 ms", "42 s", "3 min 5 s", "3 h 12 min", "2 d 4 h".
    static func humanDuration(milliseconds: UInt64) -> String {
        let seconds = milliseconds / 1000
        switch seconds {
        case 0: return "\(milliseconds) ms"
        case ..<60: return "\(seconds) s"
        case ..<3600: return seconds % 60 == 0 ? "\(seconds / 60) min" : "\(seconds / 60) min \(seconds % 60) s"
        case ..<86_400:
            let minutes = seconds / 60 % 60
            return minutes == 0 ? "\(seconds / 3600) h" : "\(seconds / 3600) h \(minutes) min"
        default:
            let hours = seconds / 3600 % 24
            return hours == 0 ? "\(seconds / 86_400) d" : "\(seconds / 86_400) d \(hours) h"
        }
    }
}

/// A failed dial in plain words (rather than NIO's error text).
enum DialFailure {
    static func describe(_ error: any Error, address: PeerAddress) -> String {
        if let failure = error as? NIOConnectionError {
            if failure.dnsAError != nil || failure.dnsAAAAError != nil {
                return "cannot connect to \(address): the host name \"\(address.host)\" does not resolve"
            }
            if let reason = failure.connectionErrors.lazy.compactMap({ ($0.error as? IOError).map(describe) }).first {
                return "cannot connect to \(address): \(reason)"
            }
        }
        if let error = error as? ChannelError, case .connectTimeout(let limit) = error {
            return "cannot connect to \(address): no answer within \(limit.nanoseconds / 1_000_000_000) s"
        }
        if let error = error as? IOError { return "cannot connect to \(address): \(describe(error))" }
        return "cannot connect to \(address): \(error)"
    }

    /// A connection that failed after it was made, in plain words: a network error keeps its own code
    /// (never labelled as a malformed message or an SQLite error).
    static func connectionLost(_ error: any Error) -> ShoalError {
        if let error = error as? ShoalError { return error }
        if let error = error as? IOError {
            let reason =
                switch error.errnoCode {
                case ECONNRESET: "the peer reset the connection"
                case EPIPE: "the peer closed the connection while this node was sending"
                default: describe(error)
                }
            return ShoalError(code: .network, message: "the connection was lost: \(reason)")
        }
        if let error = error as? ChannelError {
            return ShoalError(code: .network, message: "the connection was lost: \(error)")
        }
        return ShoalError(code: .network, message: "the connection failed: \(error)")
    }

    private static func describe(_ error: IOError) -> String {
        switch error.errnoCode {
        case ECONNREFUSED: "connection refused (no node listens on that port, or a firewall refuses)"
        case EHOSTUNREACH, ENETUNREACH: "the host cannot be reached from here"
        case ETIMEDOUT: "no answer (timed out)"
        default: String(cString: strerror(error.errnoCode))
        }
    }
}
