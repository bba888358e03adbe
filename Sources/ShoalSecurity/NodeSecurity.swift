import Crypto
import Logging
import NIOCore
import ShoalCore
import ShoalProtocol
import ShoalStore
import ShoalTransport
import Synchronization

/// A member's security, wired into its node: the TLS setup with the roster check, the hello check, the join
/// exchange for invites, and the roster watcher that closes removed nodes' connections.
///
/// ```swift
/// let security = try NodeSecurity(databasePath: path, store: store)   // reads the key file and the roster
/// var configuration = NodeConfiguration(databasePath: path)
/// try security.configure(&configuration)
/// let node = try SyncNode(configuration: configuration)
/// security.attach(node)                                              // then run both
/// ```
public final class NodeSecurity: PeerAuthorizer {
    /// This node's key and cluster.
    public let keyFile: KeyFile
    /// Who may connect.
    public let trust: TrustStore
    /// This node's site id.
    public let siteID: SiteID
    /// The name in its certificate.
    public let name: String
    private let node = Mutex<SyncNode?>(nil)
    /// The roster records last acted on (nil: none yet, so the first reading acts even on an empty roster).
    private let lastRecords = Mutex<[[UInt8]]?>(nil)
    private let logger: Logger
    private let clock: any WallClock

    /// How long a join exchange may take, end to end.
    public static let joinTimeoutMilliseconds: UInt64 = 10_000

    /// Reads the key file of the database at `databasePath` and the roster from `store` (the database opened).
    public init(
        databasePath: String,
        store: Store,
        name: String? = nil,
        clock: any WallClock = SystemWallClock(),
        logger: Logger = Logger(label: "shoal.security")
    ) throws(ShoalError) {
        let keyFile = try KeyFile.load(forDatabase: databasePath)
        self.keyFile = keyFile
        self.siteID = store.identitySiteID
        let stored = try store.nodeName()
        self.name = name ?? stored ?? "shoal"
        self.clock = clock
        self.logger = logger
        try Membership.requireMember(store: store, keyFile: keyFile)
        Membership.installFenceGate(store: store, keyFile: keyFile)
        if try store.hasRoster() {
            // A database that moved to a fresh site binds it before it syncs: a removal of this node fences it too.
            try Membership.bindOwnSites(store: store, keyFile: keyFile, now: clock.nowMilliseconds())
        }
        let roster = try Membership.roster(store: store, cluster: keyFile.cluster.id)
        self.trust = TrustStore(localNode: keyFile.identity.nodeID, clusterID: keyFile.cluster.id, roster: roster)
    }

    /// Sets the node up for TLS with this roster: the channel setup, the hello check, the cluster id.
    public func configure(_ configuration: inout NodeConfiguration) throws(ShoalError) {
        configuration.clusterID = keyFile.cluster.idHex
        configuration.storeOptions.fenceGate = Membership.fenceGate(keyFile: keyFile)
        configuration.channelSetup = try TLSChannelSetup(
            identity: keyFile.identity,
            name: name,
            siteID: siteID,
            trust: trust,
            maximumFrameLength: configuration.maximumFrameLength,
            handshakeTimeoutMilliseconds: Int64(configuration.session.handshakeTimeout),
            clock: configuration.clock
        )
        configuration.peerAuthorizer = self
        configuration.nodeID = keyFile.identity.nodeID
        configuration.clusterHint = Self.discoveryHint(keyFile.cluster)
    }

    /// What mDNS announces for a cluster: 16 hex digits of an HMAC keyed by the cluster secret (purpose
    /// "mdns-hint"), so members recognise each other and no one else learns the cluster id or can forge the hint.
    public static func discoveryHint(_ cluster: ClusterCredentials) -> String {
        let key = ClusterKeys.derive(secret: SymmetricKey(data: cluster.secret), purpose: "mdns-hint")
        let tag = HMAC<SHA256>.authenticationCode(for: Array("shoal mdns hint".utf8) + cluster.id, using: key)
        return tag.prefix(8).map { String(format: "%02x", $0) }.joined()
    }

    /// The node whose store the joins and the roster watcher use.
    public func attach(_ node: SyncNode) {
        self.node.withLock { $0 = node }
    }

    /// Reads the roster now, then again after every commit that may have changed it (a record from a peer or the
    /// relay, `shoal trust` in another process), until cancelled; when a member is removed, closes its connections at
    /// once. Before a node is attached (``attach(_:)``) it reads the roster every `intervalMilliseconds` instead.
    public func watchRoster(intervalMilliseconds: UInt64 = 500) async {
        guard let node = node.withLock({ $0 }) else {
            while !Task.isCancelled {
                await refreshRoster()
                try? await Task.sleep(for: .milliseconds(intervalMilliseconds))
            }
            return
        }
        let commits = await node.store.commits()
        await refreshUntilDone(intervalMilliseconds)
        for await commit in commits where commit.touches([Store.rosterTable]) {
            await refreshUntilDone(intervalMilliseconds)
        }
    }

    /// Reads the roster, again every `intervalMilliseconds` while it cannot (a busy file), until cancelled.
    private func refreshUntilDone(_ intervalMilliseconds: UInt64) async {
        while await !refreshRoster(), !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(intervalMilliseconds))
        }
    }

    /// Reads the roster now and acts on removals; returns whether it could (it is tried again otherwise).
    @discardableResult
    public func refreshRoster() async -> Bool {
        guard let node = node.withLock({ $0 }) else { return false }
        let cluster = keyFile.cluster.id
        do throws(ShoalError) {
            let records = try await node.store.read { store throws(ShoalError) in try store.rosterRecords() }
            // Signatures are checked again only when the records changed.
            let changed = lastRecords.withLock { last in
                defer { last = records }
                return last != records
            }
            guard changed else { return true }
            let roster = Roster(records: records.compactMap { try? RosterRecord(decoding: $0) }, clusterID: cluster)
            if !roster.removedSites.isEmpty {
                do throws(ShoalError) {
                    let keyFile = keyFile
                    let now = clock.nowMilliseconds()
                    let signed = try await node.store.withStore { store throws(ShoalError) in
                        try Membership.enforceRemovals(store: store, keyFile: keyFile, now: now).map(\.subject)
                    }
                    if !signed.isEmpty {
                        logger.info(
                            "held changes of removed nodes from before it learnt of their removal: signed removals with what it holds",
                            metadata: ["nodes": "\(signed.map(\.short).sorted())"]
                        )
                    }
                } catch {
                    // Tried again at the next reading.
                    lastRecords.withLock { $0 = nil }
                    throw error
                }
            }
            let previous = trust.roster
            let gone = trust.replaceRoster(roster)
            // Deletes are collected once every current member holds them (members that showed their admission
            // included: the trust store's roster).
            await node.setMembers(Self.memberSites(trust.roster), boundSites: Self.boundSites(trust.roster))
            if !gone.isEmpty {
                let closed = await node.closeConnections(of: gone)
                // Not dialled again either (its remembered address is forgotten).
                for site in gone.compactMap({ previous.members[$0]?.siteID ?? roster.members[$0]?.siteID }) {
                    await node.forget(site)
                }
                logger.info(
                    "removed from the roster: their connections are closed",
                    metadata: ["nodes": "\(gone.map(\.short).sorted())", "connections": "\(closed)"]
                )
            }
            return true
        } catch {
            logger.warning("cannot read the roster", metadata: ["error": "\(error.message)"])
            return false
        }
    }

    /// The sites the current members' memberships name (removed nodes left out).
    static func memberSites(_ roster: Roster) -> Set<SiteID> {
        Set(roster.members.values.filter { roster.removed[$0.nodeID] == nil }.compactMap(\.siteID))
    }

    /// Per current member (by the site its membership names), the other sites it signed that it writes under (it
    /// moved to a fresh site: restored, or copied).
    static func boundSites(_ roster: Roster) -> [SiteID: Set<SiteID>] {
        var bound: [SiteID: Set<SiteID>] = [:]
        for member in roster.members.values where roster.removed[member.nodeID] == nil {
            guard let site = member.siteID, let sites = roster.boundSites[member.nodeID], !sites.isEmpty else { continue }
            bound[site] = sites
        }
        return bound
    }

    // MARK: - PeerAuthorizer

    /// A member's hello must carry the site id the roster binds to its key.
    public func authorize(_ hello: Hello, identity: PeerIdentity?) -> Rejection? {
        guard let identity else {
            return Rejection(.notAMember, "this node takes authenticated peers only")
        }
        guard let member = trust.member(identity.nodeID) else {
            return Rejection(.notAMember, "node \(identity.nodeID.short) is not on this node's roster")
        }
        if let bound = member.siteID, bound != hello.siteID {
            return Rejection(
                .notAMember,
                "node \(identity.nodeID.short) is on the roster with site \(bound.hex.prefix(8)), not \(hello.siteID.hex.prefix(8))"
            )
        }
        return nil
    }

    /// Runs the member's side of a join.
    public func join(_ channel: NIOAsyncChannel<WireMessage, WireMessage>, identity: PeerIdentity, address: String) async {
        let limit = Self.joinTimeoutMilliseconds
        let raw = channel.channel
        let watchdog = Task {
            try await Task.sleep(for: .milliseconds(limit))
            raw.close(promise: nil)
        }
        defer { watchdog.cancel() }
        do {
            try await channel.executeThenClose { inbound, outbound in
                var messages = inbound.makeAsyncIterator()
                let outcome = await respond(to: &messages, outbound: outbound, joiner: identity, address: address)
                switch outcome {
                case .joined(let name):
                    logger.info("a device joined", metadata: ["node": "\(identity.nodeID.short)", "name": "\(name)"])
                case .refused(let reason, let message, let counted):
                    try? await outbound.write(.join(.refused(reason, message)))
                    logger.info(
                        "join refused",
                        metadata: ["from": "\(address)", "reason": "\(message)", "counted": "\(counted)"]
                    )
                }
            }
        } catch {
            logger.info("join ended early", metadata: ["from": "\(address)", "error": "\(error)"])
        }
    }

    private enum JoinOutcome {
        case joined(String)
        case refused(JoinRefusal, String, counted: Bool)
    }

    private func respond(
        to messages: inout NIOAsyncChannelInboundStream<WireMessage>.AsyncIterator,
        outbound: NIOAsyncChannelOutboundWriter<WireMessage>,
        joiner: PeerIdentity,
        address: String
    ) async -> JoinOutcome {
        guard let node = node.withLock({ $0 }) else {
            return .refused(.other, "this node is not ready for joins", counted: false)
        }
        let now = clock.nowMilliseconds()
        guard trust.roster.isMember(keyFile.identity.nodeID) else {
            return .refused(.other, "this node was removed from its cluster: it admits no one", counted: false)
        }
        guard case .join(.request(let request))? = try? await messages.next() else {
            return .refused(.other, "expected a join request", counted: false)
        }
        // A site is one member's: a device whose file is a copy of a member's still names that member's site, and two
        // members under one site would count as one for collection, and the removal of either would fence the other.
        if let holder = trust.roster.members.values.first(where: {
            $0.siteID == request.siteID && $0.nodeID != joiner.nodeID && trust.roster.removed[$0.nodeID] == nil
        }) {
            let name = holder.name.isEmpty ? holder.nodeID.short : holder.name.printable()
            return .refused(
                .other,
                "site \(request.siteID.hex.prefix(8)) is member \(name)'s: this database is a copy of that member's "
                    + "file. Give it a site of its own with `shoal init --new-key` (it keeps its rows), then join",
                counted: false
            )
        }
        let ip = address.split(separator: ":").dropLast().joined(separator: ":")
        let gate: Membership.JoinGate
        do {
            let id = request.inviteID
            gate = try await node.store.read { store throws(ShoalError) in
                try Membership.gateJoin(id, from: ip, store: store, now: now)
            }
        } catch {
            return .refused(.other, "cannot read invites: \(error.message)", counted: false)
        }
        let invite: StoredInvite
        switch gate {
        case .claimed(let claimed): invite = claimed
        case .refused(let reason, let message): return .refused(reason, message, counted: reason != .tooManyAttempts)
        }
        func fail(_ reason: JoinRefusal, _ message: String) async -> JoinOutcome {
            _ = try? await node.store.read { store throws(ShoalError) in
                try Membership.failJoin(invite, from: ip, reason: message, store: store, now: now)
            }
            return .refused(reason, message, counted: true)
        }
        // From here the invite's one guess is spent: only the right proof keeps it from being burnt.
        var exchange: CPace
        let confirmation: CPace.Confirmation
        do {
            exchange = try CPace(
                role: .responder,
                password: invite.secret,
                sessionID: joiner.nodeID.bytes + keyFile.identity.nodeID.bytes,
                channelID: Array("shoal-join/1 invite \(invite.id)".utf8)
            )
            confirmation = try exchange.receive(peerShare: request.share)
        } catch {
            return await fail(.wrongCode, "the join exchange failed: \(error)")
        }
        do {
            try await outbound.write(.join(.challenge(share: exchange.share, tag: confirmation.ownTag)))
        } catch {
            return await fail(.wrongCode, "the device left during the join")
        }
        guard case .join(.confirm(let tag))? = try? await messages.next(), confirmation.verify(peerTag: tag) else {
            return await fail(.wrongCode, "wrong invite code: invite \(invite.id) is burnt")
        }
        // Admitted: the roster says so first, then the device gets the cluster's credentials.
        do {
            let (keyFile, joinerSite, joinerName) = (self.keyFile, request.siteID, request.name.printable())
            let records = try await node.store.withStore { store throws(ShoalError) in
                try store.setInviteState(invite.id, .used)
                try Membership.sign(
                    .add,
                    subject: joiner.nodeID,
                    subjectKey: joiner.publicKey,
                    siteID: joinerSite,
                    name: joinerName,
                    store: store,
                    keyFile: keyFile,
                    now: now
                )
                return try store.rosterRecords()
            }
            let cluster = keyFile.cluster.id
            let roster = Roster(records: records.compactMap { try? RosterRecord(decoding: $0) }, clusterID: cluster)
            trust.replaceRoster(roster)
            // The device counts for collection from now on, before its first sync.
            await node.setMembers(Self.memberSites(roster), boundSites: Self.boundSites(roster))
            let welcome = JoinWelcome(cluster: keyFile.cluster, records: records)
            let sealed = try ChaChaPoly.seal(welcome.encoded, using: confirmation.sessionKey).combined
            try await outbound.write(.join(.welcome(sealed: Array(sealed))))
            return .joined(request.name)
        } catch {
            return .refused(.other, "cannot admit the device: \(error)", counted: false)
        }
    }
}

/// What a member hands a device that proved the invite code: the cluster's credentials and its roster.
public struct JoinWelcome: Sendable {
    /// The cluster's id and secret.
    public var cluster: ClusterCredentials
    /// The roster records (encoded).
    public var records: [[UInt8]]

    /// The welcome's bytes (sealed before they travel).
    public var encoded: [UInt8] {
        var bytes: [UInt8] = [1] + cluster.id + cluster.secret
        bytes.appendVarint(UInt64(records.count))
        for record in records {
            bytes.appendVarint(UInt64(record.count))
            bytes += record
        }
        return bytes
    }

    /// A welcome into `cluster`.
    public init(cluster: ClusterCredentials, records: [[UInt8]]) {
        self.cluster = cluster
        self.records = records
    }

    /// Decodes a welcome; throws on anything malformed.
    public init(decoding bytes: [UInt8]) throws(ShoalError) {
        var reader = ByteReader(bytes)
        guard bytes.count >= 49, try reader.readByte() == 1 else {
            throw ShoalError(code: .invite, message: "the member's welcome is malformed")
        }
        cluster = ClusterCredentials(id: Array(try reader.readBytes(16)), secret: Array(try reader.readBytes(32)))
        let count = try reader.readVarint()
        guard count <= 100_000 else { throw ShoalError(code: .invite, message: "the member's welcome is malformed") }
        records = []
        for _ in 0..<count {
            let length = try reader.readVarint()
            guard length <= 4096 else { throw ShoalError(code: .invite, message: "the member's welcome is malformed") }
            records.append(Array(try reader.readBytes(Int(length))))
        }
    }
}
