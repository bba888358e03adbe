import Crypto
import NIOCore
import NIOPosix
import ShoalCore
import ShoalProtocol
import ShoalStore
import ShoalTransport

/// The joining device's side of an invite: dial a member, prove the code without sending it, check the member's
/// proof, and take the cluster's credentials and roster.
public enum JoinClient {
    /// What a member handed over.
    public struct Admission: Sendable {
        /// The cluster joined.
        public var cluster: ClusterCredentials
        /// The member that admitted the device.
        public var member: NodeID
        /// Its name.
        public var memberName: String
        /// The roster records it sent.
        public var records: [[UInt8]]
    }

    /// Runs the join exchange with the member at `address`. Writes nothing locally.
    ///
    /// Throws ``ShoalError/Code/invite`` when the member refuses (with its reason: unknown, used, expired or wrong
    /// code, too many attempts) or fails to prove the code (a wrong code, or not a member), and a network or
    /// handshake error when it cannot be reached.
    public static func exchange(
        code: InviteCode,
        identity: NodeIdentity,
        name: String,
        siteID: SiteID,
        address: PeerAddress,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        timeoutMilliseconds: Int64 = 10_000
    ) async throws(ShoalError) -> Admission {
        let setup = try TLSChannelSetup(
            joining: identity,
            name: name,
            siteID: siteID,
            handshakeTimeoutMilliseconds: timeoutMilliseconds
        )
        let channel: NIOAsyncChannel<WireMessage, WireMessage>
        do {
            channel = try await ClientBootstrap(group: group)
                .connectTimeout(.milliseconds(min(timeoutMilliseconds, 5_000)))
                .connect(host: address.host, port: address.port) { channel in setup.configure(channel, role: .client) }
        } catch {
            throw ShoalError(code: .network, message: "cannot reach \(address): \(error)")
        }
        let raw = channel.channel
        let watchdog = Task {
            try await Task.sleep(for: .milliseconds(timeoutMilliseconds))
            raw.close(promise: nil)
        }
        defer { watchdog.cancel() }
        let verified: PeerIdentity?
        do {
            verified = try await setup.authenticatedPeer(of: raw)
        } catch {
            try? await channel.executeThenClose { _, _ in }
            throw error
        }
        guard let member = verified else {
            try? await channel.executeThenClose { _, _ in }
            throw ShoalError(code: .handshakeFailed, message: "no TLS identity")
        }
        let result: Result<Admission, ShoalError>
        do {
            result = try await channel.executeThenClose { inbound, outbound in
                var messages = inbound.makeAsyncIterator()
                do throws(ShoalError) {
                    return .success(
                        try await run(
                            code: code,
                            identity: identity,
                            name: name,
                            siteID: siteID,
                            member: member,
                            messages: &messages,
                            outbound: outbound
                        )
                    )
                } catch {
                    return .failure(error)
                }
            }
        } catch {
            throw ShoalError(code: .network, message: "the connection to \(address) failed during the join: \(error)")
        }
        return try result.get()
    }

    private static func run(
        code: InviteCode,
        identity: NodeIdentity,
        name: String,
        siteID: SiteID,
        member: PeerIdentity,
        messages: inout NIOAsyncChannelInboundStream<WireMessage>.AsyncIterator,
        outbound: NIOAsyncChannelOutboundWriter<WireMessage>
    ) async throws(ShoalError) -> Admission {
        var exchange: CPace
        do {
            exchange = try CPace(
                role: .initiator,
                password: code.secret,
                sessionID: identity.nodeID.bytes + member.nodeID.bytes,
                channelID: Array("shoal-join/1 invite \(code.id)".utf8)
            )
        } catch {
            throw ShoalError(code: .invite, message: "cannot start the join exchange: \(error)")
        }
        let request = JoinRequest(inviteID: code.id, name: name, siteID: siteID, share: exchange.share)
        try await send(.join(.request(request)), outbound)
        let (share, tag) = try await next(&messages) { message in
            if case .join(.challenge(let share, let tag)) = message { return (share, tag) }
            return nil
        }
        let confirmation: CPace.Confirmation
        do {
            confirmation = try exchange.receive(peerShare: share)
        } catch {
            throw ShoalError(code: .invite, message: "the member's answer is not valid: \(error)")
        }
        guard confirmation.verify(peerTag: tag) else {
            throw ShoalError(
                code: .invite,
                message: "the member at the other end did not prove the code: the code is wrong (mistyped?), or that "
                    + "node did not make it; nothing was sent"
            )
        }
        try await send(.join(.confirm(tag: confirmation.ownTag)), outbound)
        let sealed = try await next(&messages) { message in
            if case .join(.welcome(let sealed)) = message { return sealed }
            return nil
        }
        let welcome: JoinWelcome
        do {
            let box = try ChaChaPoly.SealedBox(combined: sealed)
            welcome = try JoinWelcome(decoding: Array(try ChaChaPoly.open(box, using: confirmation.sessionKey)))
        } catch let error as ShoalError {
            throw error
        } catch {
            throw ShoalError(code: .invite, message: "the member's welcome does not open: \(error)")
        }
        return Admission(cluster: welcome.cluster, member: member.nodeID, memberName: member.name, records: welcome.records)
    }

    private static func send(
        _ message: WireMessage,
        _ outbound: NIOAsyncChannelOutboundWriter<WireMessage>
    ) async throws(ShoalError) {
        do {
            try await outbound.write(message)
        } catch {
            throw ShoalError(code: .network, message: "the member closed the connection: \(error)")
        }
    }

    /// The next message, as `pick` reads it; a refusal or anything else ends the join with a typed error.
    private static func next<T>(
        _ messages: inout NIOAsyncChannelInboundStream<WireMessage>.AsyncIterator,
        _ pick: (WireMessage) -> T?
    ) async throws(ShoalError) -> T {
        let message: WireMessage?
        do {
            message = try await messages.next()
        } catch {
            throw ShoalError(code: .network, message: "the join was cut off: \(error)")
        }
        guard let message else {
            throw ShoalError(code: .network, message: "the member closed the connection during the join")
        }
        if case .join(.refused(let reason, let text)) = message {
            throw ShoalError(code: .invite, message: "the member refused: \(text) (\(reason))")
        }
        guard let value = pick(message) else {
            throw ShoalError(code: .invite, message: "unexpected message from the member during the join")
        }
        return value
    }

    /// Makes the database a member of the cluster the admission names: its roster becomes the cluster's (the records
    /// of its former cluster of one are dropped), and the key file gets the cluster's credentials. Rows stay.
    public static func adopt(_ admission: Admission, databasePath: String, store: Store) throws(ShoalError) {
        var keyFile = try KeyFile.load(forDatabase: databasePath)
        let records = admission.records.compactMap { try? RosterRecord(decoding: $0) }
        let roster = Roster(records: records, clusterID: admission.cluster.id)
        guard roster.isMember(keyFile.identity.nodeID) else {
            throw ShoalError(code: .invite, message: "the member's roster does not list this node: nothing was changed")
        }
        try store.prepareRoster()
        try store.resetRoster()
        for record in roster.records { try store.addRosterRecord(record.encoded, id: record.id) }
        keyFile.cluster = admission.cluster
        try keyFile.save(forDatabase: databasePath)
    }
}

extension JoinClient {
    /// Admits a device through a member's database on the same machine (`shoal join CODE --member-db PATH`), for
    /// scripted set-ups: nothing travels, so no exchange is needed, but the invite is checked and spent exactly as a
    /// running member would (one guess; a wrong code burns it and counts as a failed attempt). Reading the member's
    /// key file already takes its owner's rights.
    public static func admitLocally(
        code: InviteCode,
        memberDatabase: String,
        memberStore: Store,
        joiner: NodeIdentity,
        siteID: SiteID,
        name: String,
        now: UInt64
    ) throws(ShoalError) -> Admission {
        let member = try KeyFile.load(forDatabase: memberDatabase)
        let invite: StoredInvite
        switch try Membership.gateJoin(code.id, from: "this machine", store: memberStore, now: now) {
        case .claimed(let claimed): invite = claimed
        case .refused(_, let message): throw ShoalError(code: .invite, message: message)
        }
        func fail(_ message: String) throws(ShoalError) -> Never {
            try Membership.failJoin(invite, from: "this machine", reason: message, store: memberStore, now: now)
            throw ShoalError(code: .invite, message: message)
        }
        guard HMAC<SHA256>.isValidAuthenticationCode(
            HMAC<SHA256>.authenticationCode(for: invite.secret, using: SymmetricKey(data: Array("shoal".utf8))),
            authenticating: code.secret,
            using: SymmetricKey(data: Array("shoal".utf8))
        ) else { try fail("wrong invite code: invite \(invite.id) is burnt") }
        try memberStore.setInviteState(invite.id, .used)
        try Membership.sign(
            .add,
            subject: joiner.nodeID,
            subjectKey: joiner.publicKeyDER,
            siteID: siteID,
            name: name,
            store: memberStore,
            keyFile: member,
            now: now
        )
        return Admission(
            cluster: member.cluster,
            member: member.identity.nodeID,
            memberName: try memberStore.nodeName() ?? "shoal",
            records: try memberStore.rosterRecords()
        )
    }
}
