import ShoalCore
import ShoalRelayProtocol

/// What ``RelayPullDriver`` needs to carry out what the pull session decides for a page: the time, the node's store
/// and the seals of the key epochs. ``RelayLink`` answers from the node's store and, for an epoch not held yet, the
/// relay's grants; the model tests answer from a model node.
protocol RelayPullEndpoint {
    /// Now, in Unix milliseconds.
    func nowMilliseconds() -> UInt64
    /// What the node holds: its version vector, read now.
    mutating func held() async throws(RelayCallError) -> VersionVector
    /// The seal to open a chunk sealed with `epoch` (when no epoch held here is `epoch`, its grant is fetched first).
    mutating func seal(opening epoch: UInt32) async throws(RelayCallError) -> RelaySeal
    /// The ends of ranges the relay just served whole (``RelayPullSession/takeServed()``), told before they are
    /// applied: the apply's commit wakes the uploader, which must not send them back.
    mutating func relayServed(_ served: VersionVector)
    /// Applies `batch` through the node's store in one transaction (``RelayLink/apply(_:received:)``): the changes
    /// applied, what the node holds after (the claim the store took: the session counts a range's claim no further),
    /// `received` with the batch's highest seqs added, and the sites some of whose changes a removal fence left out.
    mutating func apply(
        _ batch: ChangeBatch,
        received: [SiteID: UInt64]
    ) async throws(RelayCallError) -> (applied: Int, held: VersionVector, received: [SiteID: UInt64], fenced: Set<SiteID>)
}

/// Carries out what the pull session (``RelayPullSession``) decides for a page: the session checks each chunk, the
/// driver opens it with the seal and applies what the session hands back, then the claims that wait no longer. The
/// one driver both ``RelayLink`` and the model tests run.
enum RelayPullDriver {
    /// Hands the page's `entries` to `session` in order, then applies the claims that wait no longer; returns the
    /// changes applied.
    static func deliver(
        _ entries: [RelayEnvelopeList.Entry],
        _ session: inout RelayPullSession,
        _ endpoint: inout some RelayPullEndpoint
    ) async throws(RelayCallError) -> Int {
        var applied = 0
        for entry in entries {
            switch entry {
            case .envelope(let envelope):
                applied += try await receive(envelope, &session, &endpoint)
            case .undecodable(let site, let error):
                session.undecodable(site: site, error, now: endpoint.nowMilliseconds())
            }
        }
        if let (claims, proof) = session.readyClaims() {
            session.claimsApplied(held: try await endpoint.apply(claims, received: proof).held)
        }
        return applied
    }

    /// Carries out what the session decides for one chunk; returns the changes applied.
    static func receive(
        _ envelope: RelayEnvelope,
        _ session: inout RelayPullSession,
        _ endpoint: inout some RelayPullEndpoint
    ) async throws(RelayCallError) -> Int {
        var verdict = session.check(envelope, now: endpoint.nowMilliseconds())
        if verdict == .readHeld {
            // The ranges this process uploaded are not sent back: the node holds them, so its own version vector,
            // read now, covers what the page skipped.
            session.held(try await endpoint.held())
            verdict = session.recheck(envelope, now: endpoint.nowMilliseconds())
        }
        guard verdict == .open else { return 0 }
        let seal = try await endpoint.seal(opening: envelope.epoch)
        let plaintext = Result { () throws(ShoalError) in try seal.open(envelope) }
        let now = endpoint.nowMilliseconds()
        guard case .apply(let batch, let received) = session.opened(envelope, plaintext: plaintext, now: now) else {
            return 0
        }
        let served = session.takeServed()
        if !served.isEmpty { endpoint.relayServed(served) }
        let result = try await endpoint.apply(batch, received: received)
        session.applied(envelope, received: result.received, held: result.held, fenced: result.fenced)
        return result.applied
    }
}
