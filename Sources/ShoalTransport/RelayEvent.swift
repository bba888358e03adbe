/// What the relay link reports as it happens (for the CLI's log and for tests).
public enum RelayEvent: Sendable, Hashable {
    /// The relay answered, after not answering (or for the first time).
    case reachable
    /// A request failed; repeated failures with the same reason are reported once.
    case failed(String)
    /// The relay refused the token.
    case unauthorized(String)
    /// Change-set chunks went up.
    case uploaded(chunks: Int)
    /// This node uploaded a snapshot of its merged state.
    case snapshotted
    /// Changes from the relay were applied.
    case applied(changes: Int)
    /// The sealing key moved to a new epoch: this node rotated it (`rotatedHere`) or learnt another member's rotation.
    case epoch(UInt32, rotatedHere: Bool)
}
