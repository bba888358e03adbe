import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalSecurity

/// One pass of what a node does about the relay's key epochs, with no I/O: it adopts the grants made for this node,
/// resumes the keyring's token after a fallback, starts again at a relay that lost or rolled back its storage the
/// epochs it lacks, rotates after a removal, and leaves grants for members that joined. ``RelayLink`` starts one per
/// pass, carries out each ``Action`` through the relay's API and reports the answer; the session reads and writes the
/// link's ``RelayLinkState`` (given `inout` under the link's lock at every event), and decides with ``RelayEpochPlan``.
///
/// The rules, in one place:
/// - Only a current member's grant for this node counts, and no epoch is granted to a node any epoch held here was made
///   without (a removed node is never granted a newer epoch, even by a member whose roster lags).
/// - A refused token (retired by a rotation) makes this node read every grant for it again; finding none that is new,
///   it goes back to the keyring's token if the relay's newest epoch is held here already (a fallback to the configured
///   token, refused while the relay had lost that epoch, left it; if the relay lacks newer ones, its epochs are checked
///   at once), and otherwise fails: no grant for this node.
/// - Every 30 s at most (at once after a failure), this node's grants of every epoch are read: an epoch held here with
///   another secret than the relay's (started again there by a member that never held this one, after the relay lost
///   it) takes the relay's, the one its envelopes are sealed with. Then the relay's newest epoch is compared with the
///   newest held: epochs it lacks are started again there, in order, each with its grants and upload key, under the
///   token the members hold for the newest (never a fresh one: the members' would then be unknown to the relay), which
///   this node then uses. A 409 means another member started them first: its grants say which.
/// - A removal the newest held epoch does not exclude makes this node read the grants first (another member may have
///   rotated), then rotate past the newest epoch held and the relay's; a 409 on the rotation means another member
///   started that epoch: its grant is adopted instead. The newest, not any held epoch: an epoch started again at a
///   relay that lost it may sit on top of a newer member's fresh one that excluded more.
/// - Members seen since the last check get grants of every held epoch the relay's mailbox lacks for them, of those
///   the relay holds as this node does (its grant to this node there opens to the same secret); the newest epoch's
///   carry the keyring's token (the one the members use), as a restart's do, not a fallback's.
struct RelayEpochSession {
    /// Which pass.
    enum Pass: Sendable, Equatable {
        /// Fetch this node's grants if the relay retired the token in use (``RelayLinkState/grantsNeeded``).
        case grantsIfNeeded
        /// Fetch the grants of epochs after the newest held (an envelope sealed with an epoch not held yet).
        case newerGrants
        /// Check the relay's epochs, rotate after a removal, leave grants for members that joined.
        case epochs
    }

    /// What the shell does next.
    enum Action: Sendable {
        /// Read the relay's grants of epochs after `after` (for `recipient` only, if given, waiting up to
        /// `waitMilliseconds` for one); report them with ``listed(_:state:random:)``.
        case fetchGrants(after: UInt32, recipient: NodeID?, waitMilliseconds: UInt64)
        /// Start an epoch at the relay; report with ``rotation(_:state:random:)``.
        case postRotation(RelayRotation)
        /// Leave these grants in the relay's mailbox; report with ``posted(state:)``.
        case postGrants([RelayGrant])
        /// The pass failed with this error.
        case fail(RelayCallError)
        /// The pass is over.
        case done
    }

    /// The answer to ``Action/postRotation(_:)``.
    enum RotationOutcome: Sendable, Equatable {
        case rotated
        /// 409: another member started the epoch first.
        case conflict
    }

    /// What the shell does on the side, in order, after each event (``takeEffects()``).
    enum Effect: Sendable, Equatable {
        /// Epochs were adopted: save `keyring` and say the key moved to `newest`.
        case adopted(RelayKeyring, newest: UInt32, rotatedHere: Bool)
        /// The relay lacks epochs held here (`relay`: its newest; `held`: the newest here).
        case restarting(relay: UInt32, held: UInt32)
        /// This node rotated the key to `epoch`.
        case rotated(UInt32)
    }

    /// What the session waits for.
    private enum Awaiting {
        case nothing
        /// This node's grants, then `then`.
        case grants(required: Bool, then: Then)
        /// The relay's newest epoch (the 30 s check).
        case relayEpochs
        /// The answer to restarting `epoch` (one of `keyring`'s, under the members' `token`).
        case restarted(epoch: UInt32, keyring: RelayKeyring, token: String)
        /// The answer to a fresh rotation to `epoch`.
        case rotated(epoch: UInt32, contents: EpochGrant.Contents)
        /// The relay's mailbox, to grant `members` what it lacks for them.
        case mailbox(Set<NodeID>)
        /// The grants posted for `members`.
        case posted(Set<NodeID>)
    }

    /// What follows a read of this node's grants.
    private enum Then {
        case done
        /// Clear ``RelayLinkState/grantsNeeded`` if it is still `refused`.
        case clear(refused: String)
        /// Decide the epochs step; `again` once the grants were read for it.
        case decide(again: Bool)
    }

    let pass: Pass
    let identity: NodeIdentity?
    let cluster: String
    let clusterSecret: [UInt8]
    /// How long a refused node waits at the relay for its grant.
    let waitMilliseconds: Int
    /// The roster as it stood when the pass began.
    let roster: Roster?
    /// The monotonic time the pass began (milliseconds).
    let now: UInt64
    private var awaiting = Awaiting.nothing
    /// The relay's newest epoch, as last listed in this pass.
    private var relayNewest: UInt32 = 0
    private var effects: [Effect] = []

    /// A pass of kind `pass`; `roster` as it stands, `now` from the link's monotonic clock.
    init(
        _ pass: Pass,
        identity: NodeIdentity?,
        cluster: String,
        clusterSecret: [UInt8],
        waitMilliseconds: Int,
        roster: Roster?,
        now: UInt64
    ) {
        self.pass = pass
        self.identity = identity
        self.cluster = cluster
        self.clusterSecret = clusterSecret
        self.waitMilliseconds = waitMilliseconds
        self.roster = roster
        self.now = now
    }

    /// What happened on the side since the last call, to carry out before the next action.
    mutating func takeEffects() -> [Effect] {
        defer { effects = [] }
        return effects
    }

    // MARK: Events

    /// The first action of the pass.
    mutating func start(state: inout RelayLinkState, random: inout some RandomNumberGenerator) -> Action {
        switch pass {
        case .grantsIfNeeded:
            guard let refused = state.grantsNeeded else { return .done }
            // A token no longer in use was refused (the other loop moved on meanwhile): nothing to fetch.
            guard state.credentials.token == refused else {
                return finish(.clear(refused: refused), state: &state, random: &random)
            }
            return fetchOwnGrants(required: true, then: .clear(refused: refused), state: &state, random: &random)
        case .newerGrants:
            return fetchOwnGrants(required: false, then: .done, state: &state, random: &random)
        case .epochs:
            guard let identity, let roster, roster.removed[identity.nodeID] == nil else { return .done }
            // The relay may have lost or rolled back its storage: checked 30 s apart, and at once after a failure.
            let keyring = state.credentials.keyring
            guard keyring.newest > 0, state.epochsCheckedMs.map({ now - $0 >= 30_000 }) ?? true else {
                return decide(again: false, state: &state, random: &random)
            }
            // This node's grants of every epoch, not only newer ones: an epoch held here may have been started again
            // with another secret at a relay that lost it (by a member that never held this one), and the relay's is
            // the one its envelopes are sealed with.
            awaiting = .relayEpochs
            return .fetchGrants(after: 0, recipient: identity.nodeID, waitMilliseconds: 0)
        }
    }

    /// The relay listed `listed`.
    mutating func listed(
        _ listed: RelayGrants,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        relayNewest = max(relayNewest, listed.epoch ?? 0)
        switch awaiting {
        case .grants(let required, let then):
            return ownGrants(listed, required: required, then: then, state: &state, random: &random)
        case .relayEpochs:
            state.epochsCheckedMs = now
            if let identity {
                let adopted = RelayEpochPlan.adoptable(
                    listed.grants, identity: identity, cluster: cluster, roster: roster,
                    keyring: state.credentials.keyring
                )
                if !adopted.isEmpty { adopt(adopted, rotatedHere: false, state: &state) }
            }
            let held = state.credentials.keyring
            guard let relayNewest = listed.epoch, relayNewest < held.newest else {
                return decide(again: false, state: &state, random: &random)
            }
            effects.append(.restarting(relay: relayNewest, held: held.newest))
            // The newest epoch's token as the members hold it (the one a fallback to the configured token may have
            // replaced here): started again with another, the members' would be unknown to the relay.
            let token = held.token ?? state.credentials.token
            // The relay's newest epoch may have been started there afresh by a member that never held the later ones
            // here: its rotation retired every other token, and the token its grant to this node carries is the one the
            // relay accepts, so the restart goes under it.
            if let identity, let accepted = RelayEpochPlan.token(
                of: relayNewest, in: listed.grants, identity: identity, cluster: cluster, roster: roster
            ) {
                state.credentials.token = accepted
            }
            return restart(after: relayNewest, keyring: held, token: token, state: &state, random: &random)
        case .mailbox(let members):
            guard let identity, let roster else { return .done }
            let keyring = state.credentials.keyring
            var grants: [RelayGrant] = []
            for missing in RelayEpochPlan.missing(
                keyring: keyring, inUse: state.credentials.token, roster: roster, identity: identity, cluster: cluster,
                listed: listed.grants
            ) {
                do {
                    grants.append(
                        try RelayEpochPlan.grant(
                            missing.epoch, missing.contents, to: missing.recipient, cluster: cluster, signer: identity
                        )
                    )
                } catch {
                    return fail(.local(error))
                }
            }
            guard !grants.isEmpty else {
                state.grantedMembers = members
                return finished()
            }
            awaiting = .posted(members)
            return .postGrants(grants)
        case .nothing, .restarted, .rotated, .posted:
            return finished()
        }
    }

    /// The relay took the rotation, or answered 409 (another member started the epoch first).
    mutating func rotation(
        _ outcome: RotationOutcome,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        switch awaiting {
        case .restarted(let epoch, let keyring, let token):
            // Another member started it first (this node's, or one made afresh): the grants say which.
            guard outcome == .rotated else { return decide(again: false, state: &state, random: &random) }
            // The rotation retired every other token, the one this pass used included (the configured one, after a
            // fallback): the next epoch goes under the members' token, which the rotation registered.
            state.credentials.token = token
            return restart(after: epoch, keyring: keyring, token: token, state: &state, random: &random)
        case .rotated(let epoch, let contents):
            guard outcome == .rotated else {
                // Another member started this epoch: adopt its grant; the next pass checks what it excludes.
                return fetchOwnGrants(required: false, then: .done, state: &state, random: &random)
            }
            adopt([(epoch, contents)], rotatedHere: true, state: &state)
            effects.append(.rotated(epoch))
            return finished()
        case .nothing, .grants, .relayEpochs, .mailbox, .posted:
            return finished()
        }
    }

    /// The relay stored the grants posted.
    mutating func posted(state: inout RelayLinkState) -> Action {
        if case .posted(let members) = awaiting { state.grantedMembers = members }
        return finished()
    }

    // MARK: Steps

    /// Reads the grants for this node: of epochs after the newest held, or (`required`: the token was retired, or an
    /// upload was refused under a key the relay does not hold) every one, waiting at the relay for one to come.
    private mutating func fetchOwnGrants(
        required: Bool,
        then: Then,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard let identity else {
            guard !required else {
                return fail(
                    .unauthorized(
                        "the token was retired by a key rotation, and this node has no key to open grants", token: nil
                    )
                )
            }
            return finish(then, state: &state, random: &random)
        }
        // Refused: every grant for this node is read again, not only newer epochs, since the relay may hold another
        // secret for an epoch held here. When the token was retired, the grant may still be on its way (a member grants
        // those it sees join): it is waited for at the relay rather than asked for again and again.
        let after = required ? 0 : state.credentials.keyring.newest
        let wait = required ? UInt64(max(0, waitMilliseconds)) : 0
        awaiting = .grants(required: required, then: then)
        return .fetchGrants(after: after, recipient: identity.nodeID, waitMilliseconds: wait)
    }

    private mutating func ownGrants(
        _ listed: RelayGrants,
        required: Bool,
        then: Then,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard let identity else { return finished() }
        let adopted = RelayEpochPlan.adoptable(
            listed.grants, identity: identity, cluster: cluster, roster: roster,
            keyring: state.credentials.keyring
        )
        guard !adopted.isEmpty else {
            if required {
                // The relay's newest epoch is held here already, with its token: a fallback to the configured token
                // (refused while the relay had lost that epoch) left it. Back to it, rather than "no grant". When the
                // relay lacks epochs held here (it lost or rolled back its storage, and a member may have started some
                // again there under the keyring's token), its epochs are checked at once: if it does not know that
                // token either, the fallback that follows leaves the configured one for the check, which starts them.
                let keyring = state.credentials.keyring
                if let token = keyring.token, let epoch = listed.epoch, epoch <= keyring.newest,
                    token != state.credentials.token
                {
                    if epoch < keyring.newest { state.epochsCheckedMs = nil }
                    state.credentials.token = token
                    return finish(then, state: &state, random: &random)
                }
                return fail(
                    .ungranted(
                        "the token was retired when the cluster's key moved to epoch \(listed.epoch ?? 0), and no "
                            + "grant for this node was found: it was removed from the cluster, or the member who "
                            + "rotated did not know it yet (members add grants for newer members as they see them)"
                    )
                )
            }
            return finish(then, state: &state, random: &random)
        }
        adopt(adopted, rotatedHere: false, state: &state)
        return finish(then, state: &state, random: &random)
    }

    /// Starts again at the relay the held epochs after `after`, in order, each with its grants for the members and its
    /// upload key, each under the members' `token`: a fresh token for an older epoch would retire the one this pass
    /// uses and, its answer lost, leave every member without a token the relay accepts. Only the newest epoch's grants
    /// carry the token; an older epoch's hand none out.
    private mutating func restart(
        after: UInt32,
        keyring: RelayKeyring,
        token: String,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard let identity, let roster else { return finished() }
        for epoch in keyring.epochs where epoch.epoch > after {
            let newest = epoch.epoch == keyring.newest
            guard let contents = RelayEpochPlan.contents(of: epoch, newest: newest, token: token) else { continue }
            do {
                let rotation = try RelayEpochPlan.rotation(
                    epoch.epoch, contents, token: token, roster: roster, excluding: keyring.removed, cluster: cluster,
                    signer: identity
                )
                awaiting = .restarted(epoch: epoch.epoch, keyring: keyring, token: token)
                return .postRotation(rotation)
            } catch {
                return fail(.local(error))
            }
        }
        state.grantedMembers = nil
        return decide(again: false, state: &state, random: &random)
    }

    /// The epochs step for the roster as it stands; a rotation is preceded by a read of the grants.
    private mutating func decide(
        again: Bool,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        guard let identity, let roster else { return finished() }
        let step = RelayEpochPlan.next(
            roster: roster, identity: identity, excluded: state.credentials.keyring.removedFromNewest,
            granted: state.grantedMembers
        )
        switch step {
        case .none:
            return finished()
        case .rotate where !again:
            // Another member may have rotated already.
            return fetchOwnGrants(required: false, then: .decide(again: true), state: &state, random: &random)
        case .rotate:
            return rotate(identity: identity, roster: roster, state: &state, random: &random)
        case .grantMembers(let members):
            guard !state.credentials.keyring.epochs.isEmpty else {
                state.grantedMembers = members
                return finished()
            }
            awaiting = .mailbox(members)
            return .fetchGrants(after: 0, recipient: nil, waitMilliseconds: 0)
        }
    }

    /// A new epoch after the newest held and the relay's newest, excluding every node the roster removed and every node
    /// a held epoch excludes. The relay's newest may be one this node cannot adopt (its rotator was removed since, or
    /// it was made for members this node does not count): rotating past it, rather than under its number, keeps the
    /// rotation from a 409 every time.
    private mutating func rotate(
        identity: NodeIdentity,
        roster: Roster,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        let epoch = max(state.credentials.keyring.newest, relayNewest) + 1
        let secret = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
        let token = Self.token(using: &random)
        let contents = EpochGrant.Contents(secret: secret, token: token, removed: roster.removed.keys.sorted())
        let excluded = state.credentials.keyring.removed.union(contents.removed.map(\.description))
        do {
            let rotation = try RelayEpochPlan.rotation(
                epoch, contents, token: token, roster: roster, excluding: excluded, cluster: cluster, signer: identity
            )
            awaiting = .rotated(epoch: epoch, contents: contents)
            return .postRotation(rotation)
        } catch {
            return fail(.local(error))
        }
    }

    /// What follows a read of this node's grants.
    private mutating func finish(
        _ then: Then,
        state: inout RelayLinkState,
        random: inout some RandomNumberGenerator
    ) -> Action {
        switch then {
        case .done:
            return finished()
        case .clear(let refused):
            if state.grantsNeeded == refused { state.grantsNeeded = nil }
            return finished()
        case .decide(let again):
            return decide(again: again, state: &state, random: &random)
        }
    }

    private mutating func adopt(
        _ grants: [(epoch: UInt32, contents: EpochGrant.Contents)],
        rotatedHere: Bool,
        state: inout RelayLinkState
    ) {
        let (keyring, newest) = state.adopt(grants, clusterSecret: clusterSecret)
        effects.append(.adopted(keyring, newest: newest, rotatedHere: rotatedHere))
    }

    /// A fresh relay token, as ``RelayAPI/makeToken()`` makes them.
    private static func token(using random: inout some RandomNumberGenerator) -> String {
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
        return RelayAPI.tokenPrefix + bytes.map { String(format: "%02x", $0) }.joined()
    }

    private mutating func finished() -> Action {
        awaiting = .nothing
        return .done
    }

    private mutating func fail(_ error: RelayCallError) -> Action {
        awaiting = .nothing
        return .fail(error)
    }
}
