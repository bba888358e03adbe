import ShoalCore
import ShoalRelayProtocol

/// What ``RelayEpochDriver`` needs to carry out a pass of the epoch session: the relay's key-epoch calls, the link's
/// state, and somewhere for the session's effects to go. ``RelayLink`` answers through the relay's HTTP API
/// (``RelayAPIClient``) with its state under its lock; the model tests answer from a model relay that loses answers.
protocol RelayEpochEndpoint {
    /// Where the session's random numbers come from (tokens, secrets, the order of its choices).
    associatedtype Random: RandomNumberGenerator

    /// The relay's grants of epochs after `after`, for `recipient` only if given, waiting up to `waitMilliseconds`
    /// for one (``RelayAPIClient/grants(after:recipient:waitMilliseconds:)``).
    mutating func grants(
        after: UInt32,
        recipient: NodeID?,
        waitMilliseconds: UInt64
    ) async throws(RelayCallError) -> RelayGrants
    /// Starts an epoch at the relay (``RelayCallError/conflict(epoch:_:)`` when another member started it first).
    mutating func rotate(_ rotation: RelayRotation) async throws(RelayCallError)
    /// Leaves `grants` in the relay's mailbox.
    mutating func post(_ grants: [RelayGrant]) async throws(RelayCallError)
    /// Runs one event of the session on the link's state (in ``RelayLink``, under its lock).
    mutating func withState(
        _ event: (inout RelayLinkState, inout Random) -> RelayEpochSession.Action
    ) -> RelayEpochSession.Action
    /// Carries out the effects the session had, in order (``RelayEpochSession/takeEffects()``).
    mutating func carryOut(_ effects: [RelayEpochSession.Effect]) async throws(RelayCallError)
}

/// Carries out one pass of the epoch session (``RelayEpochSession``): each action through the endpoint, each answer
/// handed back to the session on the link's state, each effect in order. The one loop both ``RelayLink`` and the model
/// tests run.
enum RelayEpochDriver {
    /// Runs `session` to its end; throws what the pass failed with (the session's error, or a call's).
    static func run(
        _ session: inout RelayEpochSession,
        _ endpoint: inout some RelayEpochEndpoint
    ) async throws(RelayCallError) {
        var action = endpoint.withState { session.start(state: &$0, random: &$1) }
        while true {
            try await endpoint.carryOut(session.takeEffects())
            switch action {
            case .done:
                return
            case .fail(let error):
                throw error
            case .fetchGrants(let after, let recipient, let wait):
                let listed = try await endpoint.grants(after: after, recipient: recipient, waitMilliseconds: wait)
                action = endpoint.withState { session.listed(listed, state: &$0, random: &$1) }
            case .postRotation(let rotation):
                let outcome: RelayEpochSession.RotationOutcome
                do {
                    try await endpoint.rotate(rotation)
                    outcome = .rotated
                } catch {
                    guard case .conflict = error else { throw error }
                    outcome = .conflict
                }
                action = endpoint.withState { session.rotation(outcome, state: &$0, random: &$1) }
            case .postGrants(let grants):
                try await endpoint.post(grants)
                action = endpoint.withState { state, _ in session.posted(state: &state) }
            }
        }
    }
}
