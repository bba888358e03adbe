import ShoalCore
import ShoalProtocol
import ShoalStore

/// Node keys, the roster and invites in a database: what `shoal init`, `shoal invite` and scripted set-ups do.
public enum Membership {
    /// Gives the database a node key and a cluster of one (its founder is a member without any record, so nothing is
    /// written to the database), unless it has a key already. Returns the key file.
    ///
    /// A database that belongs to a cluster (it holds a roster) but has lost its key file is refused unless
    /// `newKey`: a new key would silently make it a stranger to its cluster; the key should be restored instead.
    @discardableResult
    public static func initialize(
        databasePath: String,
        store: Store,
        now: UInt64,
        newKey: Bool = false
    ) throws(ShoalError) -> KeyFile {
        let keyFile: KeyFile
        if KeyFile.exists(forDatabase: databasePath) {
            guard !newKey else {
                throw ShoalError(
                    code: .identity,
                    message: "\(KeyFile.path(forDatabase: databasePath)) exists: --new-key makes a key only for a "
                        + "database whose key is missing. A copy of a member's file that kept the key is that member "
                        + "(its peers refuse one of the two): to make the copy another node, remove the copy's key "
                        + "file, then run shoal init --new-key"
                )
            }
            keyFile = try KeyFile.load(forDatabase: databasePath)
        } else {
            let belongs = try store.hasRoster()
            guard newKey || !belongs else {
                throw ShoalError(
                    code: .identity,
                    message: "the node key \(KeyFile.path(forDatabase: databasePath)) is missing, but this database "
                        + "belongs to a cluster (it holds a roster): restore the key file. Without it the node is a "
                        + "stranger to its cluster; to start again as a new node, run `shoal init --new-key` and join "
                        + "with an invite"
                )
            }
            let identity = NodeIdentity.generate()
            keyFile = KeyFile(identity: identity, cluster: .founded(by: identity.nodeID))
            // A member's file with a new key is another node (a copy, or a file whose key was lost): it joins under a
            // site of its own, never the one the roster binds to the key it had.
            if belongs { try store.markNewNodeKey() }
            try keyFile.save(forDatabase: databasePath)
        }
        return keyFile
    }

    /// Makes a single-use invite valid for `minutes`, stored in the member's database.
    public static func invite(store: Store, minutes: Int = 10, now: UInt64) throws(ShoalError) -> InviteCode {
        for _ in 0..<64 {
            let code = InviteCode.generate()
            let invite = StoredInvite(
                id: code.id,
                secret: code.secret,
                createdMilliseconds: now,
                expiresMilliseconds: now + UInt64(minutes) * 60_000,
                state: .open
            )
            if try store.createInvite(invite) { return code }
        }
        throw ShoalError(code: .invite, message: "too many open invites: wait for some to expire")
    }

    /// Makes the databases one cluster on this machine (scripted set-ups, demos, tests): each gets a node key; the
    /// first founds the cluster, and every other joins through its database file with an invite of its own.
    public static func formLocally(_ databasePaths: [String], now: UInt64) throws(ShoalError) {
        guard let founder = databasePaths.first else { return }
        let founderStore = try Store(path: founder)
        try initialize(databasePath: founder, store: founderStore, now: now)
        for path in databasePaths.dropFirst() {
            let store = try Store(path: path)
            let keyFile = try initialize(databasePath: path, store: store, now: now)
            let code = try invite(store: founderStore, now: now)
            let admission = try JoinClient.admitLocally(
                code: code,
                memberDatabase: founder,
                memberStore: founderStore,
                joiner: keyFile.identity,
                siteID: store.identitySiteID,
                name: try store.nodeName() ?? "shoal",
                now: now
            )
            try JoinClient.adopt(admission, databasePath: path, store: store)
        }
    }

    /// Signs a roster record as the node of `keyFile` and writes it to `store`, where it replicates like any write.
    @discardableResult
    public static func sign(
        _ action: RosterRecord.Action,
        subject: NodeID,
        subjectKey: [UInt8] = [],
        siteID: SiteID? = nil,
        name: String,
        store: Store,
        keyFile: KeyFile,
        now: UInt64
    ) throws(ShoalError) -> RosterRecord {
        let record = try RosterRecord.make(
            action,
            cluster: keyFile.cluster.id,
            subject: subject,
            subjectKey: subjectKey,
            siteID: siteID,
            name: name,
            signer: keyFile.identity,
            signerSite: store.identitySiteID,
            at: now
        )
        try store.addRosterRecord(record.encoded, id: record.id)
        return record
    }

    /// Removes `subject` from the roster as the node of `keyFile`: one removal per site the roster knows the subject
    /// writes under, each carrying what `store` holds of it (its cut); `store` refuses those sites' changes beyond
    /// their cuts from now on. Returns the first removal signed (the one naming the subject's membership site).
    @discardableResult
    public static func remove(
        _ subject: NodeID,
        name: String,
        store: Store,
        keyFile: KeyFile,
        now: UInt64
    ) throws(ShoalError) -> RosterRecord {
        // A removal's cut is what this database holds of the subject. One awaiting its fresh state may hold less than
        // the other members keep, and sends none of its own writes until it took that state, this removal included:
        // none of them could raise a cut signed here, and it could wait forever for changes the cut refuses.
        guard try !store.awaitsFreshState() else {
            throw ShoalError(
                code: .awaitingFreshState,
                message: "this database awaits its fresh state (it was restored from a backup or copied, or its "
                    + "peers collected deletes without it): what it holds of the node may be older than what the other "
                    + "members hold. Run `shoal trust remove` on another member, or here once `shoal status` no longer "
                    + "says \"fresh state: awaited\"; nothing was written"
            )
        }
        let roster = try roster(store: store, cluster: keyFile.cluster.id)
        let named = roster.member(subject)?.siteID
        let others = roster.sites(of: subject).subtracting(named.map { [$0] } ?? []).sorted()
        var cuts: [SiteID: UInt64] = [:]
        for site in [named].compactMap({ $0 }) + others { cuts[site] = 0 }
        let held = try store.raiseFences(cuts)
        var first: RosterRecord?
        for site in [named] + others.map(Optional.some) {
            let record = try RosterRecord.make(
                .remove,
                cluster: keyFile.cluster.id,
                subject: subject,
                siteID: site,
                name: name,
                signer: keyFile.identity,
                signerSite: store.identitySiteID,
                cut: site.map { held[$0] ?? 0 },
                at: now
            )
            try store.addRosterRecord(record.encoded, id: record.id)
            if first == nil { first = record }
        }
        return first!
    }

    /// Makes `store` refuse what removed nodes wrote after their removal: fences every site of each removed node
    /// (``Roster/removedSites``) at the highest cut its removals carry (``RosterRecord/cut``), or at what `store`
    /// holds of it where no removal cuts it. Where `store` already holds more of a removed node's site than that (it
    /// got those changes before it learnt of the removal, from the node itself or a member that had), it keeps them
    /// and signs a removal of its own with what it holds, so every member ends up drawing the same line and all
    /// replicas stay identical. Run after every change of the roster, on a running node and after an offline apply
    /// (an apply that brings roster records fences at once too: ``installFenceGate(store:keyFile:)``). Returns the
    /// removals it signed.
    @discardableResult
    public static func enforceRemovals(store: Store, keyFile: KeyFile, now: UInt64) throws(ShoalError) -> [RosterRecord] {
        let roster = try roster(store: store, cluster: keyFile.cluster.id)
        guard !roster.removedSites.isEmpty, roster.removed[keyFile.identity.nodeID] == nil else { return [] }
        let beyond = try store.raiseFences(cuts(roster))
        var signed: [RosterRecord] = []
        for (node, sites) in roster.removedSites.sorted(by: { $0.key < $1.key }) {
            for site in sites.sorted() {
                guard let held = beyond[site] else { continue }
                let record = try RosterRecord.make(
                    .remove,
                    cluster: keyFile.cluster.id,
                    subject: node,
                    siteID: site,
                    name: roster.removed[node]?.name ?? "",
                    signer: keyFile.identity,
                    signerSite: store.identitySiteID,
                    cut: held,
                    at: now
                )
                try store.addRosterRecord(record.encoded, id: record.id)
                signed.append(record)
            }
        }
        return signed
    }

    /// The fence each removed node's site needs: the highest cut its removals carry, or 0 (what a member holds of a
    /// site is never fenced out).
    static func cuts(_ roster: Roster) -> [SiteID: UInt64] {
        var cuts: [SiteID: UInt64] = [:]
        for site in roster.removedSites.values.joined() { cuts[site] = roster.fences[site] ?? 0 }
        return cuts
    }

    /// Makes every apply to `store` that brings roster records fence the sites of the nodes they remove before it
    /// merges anything, in the same transaction (``fenceGate(keyFile:)``).
    public static func installFenceGate(store: Store, keyFile: KeyFile) {
        store.fenceGate = fenceGate(keyFile: keyFile)
    }

    /// What a store given it (``StoreOptions/fenceGate``) asks, in every apply that brings roster records, for the
    /// fences the roster then requires, and raises before it merges anything. Without it, a removed node's fresh site
    /// (bound by a record that travels with that site's changes) would get them in before the roster watcher fences
    /// it.
    public static func fenceGate(keyFile: KeyFile) -> @Sendable ([[UInt8]]) -> [SiteID: UInt64] {
        let cluster = keyFile.cluster.id
        let own = keyFile.identity.nodeID
        return { records in
            let roster = Roster(records: records.compactMap { try? RosterRecord(decoding: $0) }, clusterID: cluster)
            guard roster.removed[own] == nil else { return [:] }
            return cuts(roster)
        }
    }

    /// Binds to this node, in the roster, every site its database writes or wrote under beside the one its membership
    /// names (its database moved to a fresh site: it was restored from an older copy, or copied), so that a removal
    /// of this node fences them all. Signs only what the roster lacks; returns the records signed.
    @discardableResult
    public static func bindOwnSites(store: Store, keyFile: KeyFile, now: UInt64) throws(ShoalError) -> [RosterRecord] {
        let roster = try roster(store: store, cluster: keyFile.cluster.id)
        let own = keyFile.identity.nodeID
        var sites: Set<SiteID> = [store.siteID]
        if let change = try store.identityChange() { sites.insert(change.previousSite) }
        sites.remove(store.identitySiteID)
        if let named = roster.member(own)?.siteID { sites.remove(named) }
        sites.subtract(roster.boundSites[own] ?? [])
        var signed: [RosterRecord] = []
        for site in sites.sorted() {
            let record = try RosterRecord.make(
                .site,
                cluster: keyFile.cluster.id,
                subject: own,
                siteID: site,
                name: "",
                signer: keyFile.identity,
                signerSite: store.identitySiteID,
                at: now
            )
            try store.addRosterRecord(record.encoded, id: record.id)
            signed.append(record)
        }
        return signed
    }

    /// Throws when the node of `keyFile` was removed from its cluster, saying by whom: it no longer syncs with its
    /// cluster nor admits anyone.
    public static func requireMember(store: Store, keyFile: KeyFile) throws(ShoalError) {
        let roster = try roster(store: store, cluster: keyFile.cluster.id)
        guard let removal = roster.removed[keyFile.identity.nodeID] else { return }
        throw ShoalError(
            code: .notAMember,
            message: "this node (\(keyFile.identity.nodeID.short)) was removed from cluster \(keyFile.cluster.idHex) by "
                + "\(removal.signer.short): it no longer syncs with that cluster nor admits anyone; to start again as "
                + "a new node, run `shoal init --new-key` and join with an invite"
        )
    }

    /// What a member decides about a join attempt before the exchange.
    public enum JoinGate: Sendable {
        /// The invite, now claimed for this attempt: the right proof uses it, anything else burns it.
        case claimed(StoredInvite)
        /// Refused, with the reason to send.
        case refused(JoinRefusal, String)
    }

    /// Failed join attempts from one address within an hour after which the member takes none from it.
    public static let joinFailuresPerAddress = 10
    /// Failed join attempts from anywhere within an hour after which the member takes no joins at all.
    public static let joinFailuresInAll = 50

    /// Checks a join attempt for invite `id` from `address` and claims the invite for it. Every refusal but the cap
    /// itself counts as a failed attempt (unknown ids too, so the ids of open invites cannot be probed for free).
    public static func gateJoin(_ id: String, from address: String, store: Store, now: UInt64) throws(ShoalError)
        -> JoinGate
    {
        let hourAgo = now > 3_600_000 ? now - 3_600_000 : 0
        let fromThere = try store.joinFailures(since: hourAgo, address: address)
        let inAll = try store.joinFailures(since: hourAgo)
        guard fromThere < joinFailuresPerAddress, inAll < joinFailuresInAll else {
            return .refused(
                .tooManyAttempts,
                "\(max(fromThere, inAll)) failed join attempts in the last hour: this member takes no joins "
                    + (fromThere >= joinFailuresPerAddress ? "from \(address) " : "") + "for now"
            )
        }
        func refuse(_ reason: JoinRefusal, _ message: String) throws(ShoalError) -> JoinGate {
            try store.recordJoinFailure(at: now, address: address, reason: message)
            return .refused(reason, message)
        }
        guard let invite = try store.claimInvite(id.uppercased(), now: now) else {
            return try refuse(.unknownInvite, "this member holds no invite \(id.uppercased())")
        }
        switch invite.state {
        case .used: return try refuse(.used, "invite \(invite.id) was already used")
        case .burnt:
            return try refuse(.used, "invite \(invite.id) was burnt by an attempt with a wrong code: ask for a new one")
        case .claimed: return try refuse(.used, "invite \(invite.id) is being used by another device right now")
        case .open:
            guard invite.expiresMilliseconds > now else {
                return try refuse(.expired, "invite \(invite.id) expired: ask for a new one")
            }
            return .claimed(invite)
        }
    }

    /// A claimed invite's attempt failed: the invite is burnt, and the attempt counted.
    public static func failJoin(
        _ invite: StoredInvite,
        from address: String,
        reason: String,
        store: Store,
        now: UInt64
    ) throws(ShoalError) {
        try store.setInviteState(invite.id, .burnt)
        try store.recordJoinFailure(at: now, address: address, reason: reason)
    }

    /// The roster `store` holds for `cluster`.
    public static func roster(store: Store, cluster: [UInt8]) throws(ShoalError) -> Roster {
        Roster(records: try store.rosterRecords().compactMap { try? RosterRecord(decoding: $0) }, clusterID: cluster)
    }
}
