import ArgumentParser
import Foundation
import Shoal

extension ShoalCommand {
    struct ID: ParsableCommand, DescribedActivity {
        static let configuration = CommandConfiguration(
            commandName: "id",
            abstract: "Print this node's id (the hash of its public key): grouped, on the last line.",
            discussion: """
                Also prints the public key, which `shoal trust add --key` takes on another member, and its pin for \
                `curl --pinnedpubkey` (the node id in base64: what a client of `shoal serve --dashboard-tls` checks \
                the node by). --write-tls FILE writes this node's certificate and key (PEM, mode 600) for a TLS \
                client: `curl --cert FILE` reaches the dashboard of any member serving it with --dashboard-tls.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(
            help: ArgumentHelp("Write this node's certificate and key (PEM, mode 600) to FILE, for curl --cert.", valueName: "FILE")
        )
        var writeTls: String?

        var activity: String { "could not read the node's identity" }

        func run() throws {
            try database.requireExisting()
            let keyFile = try KeyFile.load(forDatabase: database.db)
            print("public key: \(Data(keyFile.identity.publicKeyDER).base64EncodedString())")
            print("cluster: \(keyFile.cluster.idHex)")
            print("pin: sha256//\(Data(keyFile.identity.nodeID.bytes).base64EncodedString())")
            if let writeTls {
                let store = try database.open(nodeName: nil, creating: false)
                let name = try store.nodeName() ?? "shoal"
                let certificate = try keyFile.identity.certificate(name: name, siteID: store.identitySiteID)
                let der: [UInt8]
                do {
                    der = try certificate.toDERBytes()
                } catch {
                    throw ShoalError(code: .identity, message: "cannot encode the node's certificate: \(error)")
                }
                let base64 = Data(der).base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
                let pem =
                    "-----BEGIN CERTIFICATE-----\n\(base64)\n-----END CERTIFICATE-----\n"
                    + keyFile.identity.privateKey.pemRepresentation + "\n"
                try? FileManager.default.removeItem(atPath: writeTls)
                guard
                    FileManager.default.createFile(
                        atPath: writeTls,
                        contents: Data(pem.utf8),
                        attributes: [.posixPermissions: 0o600]
                    )
                else {
                    throw ShoalError(code: .invalidArgument, message: "cannot write \(writeTls)")
                }
                print("wrote this node's certificate and key to \(writeTls) (for curl --cert)")
            }
            print(keyFile.identity.nodeID)
        }
    }

    struct Invite: ParsableCommand, DescribedActivity {
        static let configuration = CommandConfiguration(
            commandName: "invite",
            abstract: "Make a single-use invite code for a new device (printed on the last line).",
            discussion: """
                The code is valid for 10 minutes and admits one device: on it, run \
                `shoal join CODE --db PATH` while this node serves. A node already serving takes the invite at \
                once. A wrong guess burns the code.
                """
        )

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Minutes the code stays valid (1 to 60).") var minutes = 10
        @Flag(help: "Forget the failed join attempts counted so far (the cap that holds joins back).")
        var resetFailures = false

        var activity: String { "could not make an invite" }

        func validate() throws {
            guard (1...60).contains(minutes) else { throw ValidationError("--minutes takes 1 to 60") }
        }

        func run() throws {
            let store = try database.open()
            let keyFile = try KeyFile.load(forDatabase: database.db)
            try Membership.requireMember(store: store, keyFile: keyFile)
            let now = SystemWallClock().nowMilliseconds()
            if resetFailures { try store.clearJoinFailures() }
            let failures = try store.joinFailures(since: now - 3_600_000)
            if failures >= Membership.joinFailuresPerAddress {
                print(
                    "note: \(failures) failed join attempts in the last hour: joins may be refused until they age out "
                        + "(`shoal invite --reset-failures` forgets them)"
                )
            }
            let code = try Membership.invite(store: store, minutes: minutes, now: now)
            print("On the new device: shoal join \(code) --db PATH [--peer HOST:PORT] (valid \(minutes) min, once)")
            print(code)
        }
    }

    struct Join: AsyncParsableCommand, DescribedActivity {
        static let configuration = CommandConfiguration(
            commandName: "join",
            abstract: "Join a cluster with an invite code from one of its members.",
            discussion: """
                Finds the member that made the code (the given --peer, else by mDNS), proves the code without \
                sending it, and receives the cluster's id, secret and roster. The database keeps its rows, which \
                then sync with the cluster. Exits 0 once admitted; then run `shoal serve`.
                """
        )

        @Argument(help: "The invite code (10 characters; dashes and spaces are ignored), or - to read it from stdin.")
        var code: String
        @OptionGroup var database: DatabaseOptions
        @Option(name: .customLong("peer"), help: "The member's address, HOST:PORT (repeatable); else found by mDNS.")
        var peers: [String] = []
        @Option(help: "Seconds to look for members by mDNS.") var browseSeconds = 5
        @Option(help: "The network interface to look for members on by mDNS (default: every interface).")
        var mdnsInterface: String?
        @Option(
            help: ArgumentHelp(
                "Join through a member's database on this machine instead of the network (scripted set-ups).",
                valueName: "path"
            )
        )
        var memberDb: String?

        var activity: String { "could not join" }

        func validate() throws {
            guard (1...60).contains(browseSeconds) else { throw ValidationError("--browse-seconds takes 1 to 60") }
        }

        func run() async throws {
            // From stdin, the code stays out of the process list and the shell's history.
            let text = code == "-" ? (readLine(strippingNewline: true) ?? "") : code
            let invite = try InviteCode(parsing: text)
            try database.requireExisting()
            let lock = try ServeLock.acquire(database: database.db)
            defer { withExtendedLifetime(lock) {} }
            let store = try database.open()
            let keyFile = try KeyFile.load(forDatabase: database.db)
            let name = try store.nodeName() ?? "shoal"
            var addresses = try peers.map { text in
                guard let peer = PeerAddress(parsing: text) else {
                    throw ShoalError(code: .invalidArgument, message: "--peer wants HOST:PORT, got \"\(text)\"")
                }
                return peer
            }
            if let memberDb {
                let admission = try JoinClient.admitLocally(
                    code: invite,
                    memberDatabase: memberDb,
                    memberStore: try DatabaseOptions.open(memberDb),
                    joiner: keyFile.identity,
                    siteID: store.identitySiteID,
                    name: name,
                    now: SystemWallClock().nowMilliseconds()
                )
                try JoinClient.adopt(admission, databasePath: database.db, store: store)
                print("joined cluster \(admission.cluster.idHex) through \(admission.memberName) (\(admission.member.short))")
                print("this node: \(keyFile.identity.nodeID)")
                return
            }
            if addresses.isEmpty {
                addresses = await MDNSDiscovery.browseShoalNodes(
                    seconds: browseSeconds,
                    excluding: store.identitySiteID,
                    interface: mdnsInterface
                )
                guard !addresses.isEmpty else {
                    throw ShoalError(
                        code: .invite,
                        message: "no Shoal node found by mDNS in \(browseSeconds) s; give the member's address with --peer HOST:PORT"
                    )
                }
            }
            var failures: [String] = []
            for address in addresses {
                let admission: JoinClient.Admission
                do {
                    admission = try await Self.exchange(
                        invite,
                        identity: keyFile.identity,
                        name: name,
                        siteID: store.identitySiteID,
                        address: address
                    )
                } catch {
                    // Another node may hold the invite: try the next one. A refusal by the one that holds it is final.
                    let elsewhere =
                        error.message.contains("holds no invite") || error.code == .network || error.code == .handshakeFailed
                    guard elsewhere, address != addresses.last else { throw error }
                    failures.append("\(address): \(error.message)")
                    continue
                }
                try JoinClient.adopt(admission, databasePath: database.db, store: store)
                print("joined cluster \(admission.cluster.idHex) through \(admission.memberName) (\(admission.member.short))")
                print("this node: \(keyFile.identity.nodeID)")
                return
            }
            throw ShoalError(code: .invite, message: failures.joined(separator: "; "))
        }

        /// The join exchange with one member, tried again (three times in all, with backoff) when the connection
        /// fails before the member answered: a busy member (a flood of connections) refuses some at once. A refusal
        /// by the member is final.
        private static func exchange(
            _ invite: InviteCode,
            identity: NodeIdentity,
            name: String,
            siteID: SiteID,
            address: PeerAddress
        ) async throws(ShoalError) -> JoinClient.Admission {
            var backoff = Backoff(initialMilliseconds: 500, maximumMilliseconds: 4_000)
            var attempt = 1
            while true {
                do {
                    return try await JoinClient.exchange(
                        code: invite,
                        identity: identity,
                        name: name,
                        siteID: siteID,
                        address: address
                    )
                } catch {
                    guard attempt < 3, error.code == .network || error.code == .handshakeFailed else { throw error }
                    attempt += 1
                    try? await Task.sleep(for: .milliseconds(backoff.next()))
                }
            }
        }
    }

    struct Trust: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "trust",
            abstract: "List, add or remove the cluster's members, and show devices waiting to be accepted.",
            subcommands: [List.self, Add.self, Remove.self, Pending.self]
        )

        struct List: ParsableCommand, DescribedActivity {
            static let configuration = CommandConfiguration(
                commandName: "list",
                abstract: "List members and removed nodes."
            )
            @OptionGroup var database: DatabaseOptions
            var activity: String { "could not read the roster" }

            func run() throws {
                let store = try database.open()
                let keyFile = try KeyFile.load(forDatabase: database.db)
                let roster = try Membership.roster(store: store, cluster: keyFile.cluster.id)
                var members = roster.members
                let me = keyFile.identity.nodeID
                if let known = members[me], known.name.isEmpty {
                    members[me]?.name = try store.nodeName() ?? ""
                } else if members[me] == nil, roster.isMember(me) {
                    // The founder is a member before it signs anything.
                    members[me] = Roster.Member(
                        nodeID: me,
                        publicKeyDER: keyFile.identity.publicKeyDER,
                        siteID: store.identitySiteID,
                        name: try store.nodeName() ?? "",
                        addedBy: me,
                        addedAtMilliseconds: 0
                    )
                }
                var rows: [[SQLValue]] = members.values.sorted { $0.nodeID < $1.nodeID }.map { member in
                    [
                        .text(member.nodeID.description), .text(member.name), .text(member.siteID?.hex.prefix(8).description ?? ""),
                        .text("member"), .text(member.addedBy.short),
                    ]
                }
                rows += roster.removed.values.sorted { $0.subject < $1.subject }.map { record in
                    [.text(record.subject.description), .text(record.name), .text(""), .text("removed"), .text(record.signer.short)]
                }
                print(Output.table(columns: ["node", "name", "site", "state", "by"], rows: rows), terminator: "")
            }
        }

        struct Add: ParsableCommand, DescribedActivity {
            static let configuration = CommandConfiguration(
                commandName: "add",
                abstract: "Accept a node: a pending device (seen by the running node), or one given with its key.",
                discussion: """
                    A pending device is one that connected with a key the roster does not hold; `shoal trust pending` \
                    lists them. Adding a node makes it a member: it may read and write every row, so compare its \
                    id with what `shoal id` prints on it first. A node removed once cannot be added again. Adding \
                    does not hand over the cluster's secret: a new device should join with an invite instead.
                    """
            )
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The node id (grouped or not).") var node: String
            @Option(help: "Its public key (base64, as `shoal id` prints it), for a node not pending here.") var key: String?
            @Option(help: "The site id its hellos must carry (default: the one its certificate claims).") var site: String?
            @Option(help: "A name for it.") var name: String?
            var activity: String { "could not add the node" }

            func run() throws {
                let nodeID = try NodeID.argument(node)
                let store = try database.open()
                let keyFile = try KeyFile.load(forDatabase: database.db)
                let roster = try Membership.roster(store: store, cluster: keyFile.cluster.id)
                if roster.removed[nodeID] != nil {
                    throw ShoalError(code: .notAMember, message: "node \(nodeID.short) was removed from the roster, for good")
                }
                if roster.isMember(nodeID) {
                    print("node \(nodeID.short) is already a member")
                    return
                }
                let pending = LiveStatus.read(forDatabase: database.db)?.pending?.first { $0.node == nodeID.description }
                let publicKey: [UInt8]
                if let key {
                    guard let bytes = Data(base64Encoded: key).map(Array.init) else {
                        throw ShoalError(code: .invalidArgument, message: "--key is not base64")
                    }
                    publicKey = bytes
                } else if let pending, let bytes = Data(base64Encoded: pending.publicKey).map(Array.init) {
                    publicKey = bytes
                } else {
                    throw ShoalError(
                        code: .invalidArgument,
                        message: "node \(nodeID.short) is not pending on a node running on \(database.db); give its key with --key"
                    )
                }
                guard NodeIdentity.nodeID(ofPublicKeyDER: publicKey) == nodeID else {
                    throw ShoalError(code: .invalidArgument, message: "that key does not belong to node \(nodeID.short)")
                }
                let siteID = try site.map { text throws(ShoalError) in
                    guard let parsed = SiteID(hex: text) else {
                        throw ShoalError(code: .invalidArgument, message: "--site wants 32 hexadecimal digits")
                    }
                    return parsed
                } ?? pending?.site.flatMap { SiteID(hex: $0) }
                try Membership.sign(
                    .add,
                    subject: nodeID,
                    subjectKey: publicKey,
                    siteID: siteID,
                    name: name ?? pending?.name ?? "",
                    store: store,
                    keyFile: keyFile,
                    now: SystemWallClock().nowMilliseconds()
                )
                print("added \(nodeID) to the roster: it is a member now, and may read and write every row")
            }
        }

        struct Remove: ParsableCommand, DescribedActivity {
            static let configuration = CommandConfiguration(
                commandName: "remove",
                abstract: "Remove a member for good: every member closes its connections and refuses it.",
                discussion: "A removal wins over any add, on every member, forever."
            )
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The node id (grouped or not).") var node: String
            var activity: String { "could not remove the node" }

            func run() throws {
                let nodeID = try NodeID.argument(node)
                let store = try database.open()
                let keyFile = try KeyFile.load(forDatabase: database.db)
                guard nodeID != keyFile.identity.nodeID else {
                    throw ShoalError(code: .invalidArgument, message: "a node cannot remove itself; run this on another member")
                }
                let roster = try Membership.roster(store: store, cluster: keyFile.cluster.id)
                if roster.removed[nodeID] != nil {
                    print("node \(nodeID.short) is already removed")
                    return
                }
                try Membership.remove(
                    nodeID,
                    name: roster.members[nodeID]?.name ?? "",
                    store: store,
                    keyFile: keyFile,
                    now: SystemWallClock().nowMilliseconds()
                )
                print("removed \(nodeID) from the roster")
            }
        }

        struct Pending: ParsableCommand, DescribedActivity {
            static let configuration = CommandConfiguration(
                commandName: "pending",
                abstract: "List devices that tried to connect with a key the roster does not hold (needs a running node)."
            )
            @OptionGroup var database: DatabaseOptions
            var activity: String { "could not list pending devices" }

            func run() throws {
                try database.requireExisting()
                guard let live = LiveStatus.read(forDatabase: database.db) else {
                    throw ShoalError(
                        code: .invalidArgument,
                        message: "no node is running on \(database.db): pending devices are what a running node saw"
                    )
                }
                let rows: [[SQLValue]] = (live.pending ?? []).map { device in
                    [.text(device.node), .text(device.name), .text(device.address), .integer(Int64(device.attempts))]
                }
                print(Output.table(columns: ["node", "name", "address", "attempts"], rows: rows), terminator: "")
            }
        }
    }
}

extension NodeID {
    /// A node id given on the command line, or a typed error that says what a node id looks like.
    static func argument(_ text: String) throws(ShoalError) -> NodeID {
        guard let id = NodeID(parsing: text) else {
            throw ShoalError(
                code: .invalidArgument,
                message: "\"\(text)\" is not a node id (52 base32 characters, as `shoal id` prints it)"
            )
        }
        return id
    }
}
