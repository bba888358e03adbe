import ShoalCore
import ShoalStore

/// Node keys, the roster and invites in a database: what `shoal init`, `shoal invite` and scripted set-ups do.
public enum Membership {
    /// Gives the database a node key and a cluster of one (its founder is a member without any record, so nothing is
    /// written to the database), unless it has a key already. Returns the key file.
    @discardableResult
    public static func initialize(databasePath: String, store: Store, now: UInt64) throws(ShoalError) -> KeyFile {
        let keyFile: KeyFile
        if KeyFile.exists(forDatabase: databasePath) {
            keyFile = try KeyFile.load(forDatabase: databasePath)
        } else {
            let identity = NodeIdentity.generate()
            keyFile = KeyFile(identity: identity, cluster: .founded(by: identity.nodeID))
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
                siteID: store.siteID,
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
            signerSite: store.siteID,
            at: now
        )
        try store.addRosterRecord(record.encoded, id: record.id)
        return record
    }

    /// The roster `store` holds for `cluster`.
    public static func roster(store: Store, cluster: [UInt8]) throws(ShoalError) -> Roster {
        Roster(records: try store.rosterRecords().compactMap { try? RosterRecord(decoding: $0) }, clusterID: cluster)
    }
}
