import NIOCore
import NIOPosix
import ShoalCore
import ShoalProtocol
import ShoalStore

/// Lists the rows in which this replica and a peer's differ (`shoal verify --peer`), read-only on both sides.
///
/// It dials the peer as a sync link does (the configuration's channel setup: mutual TLS checked against the roster,
/// or plaintext with `insecurePlaintext`) but opens an inspection (``WireMessage/inspect(_:)``, protocol version 3)
/// rather than a sync session: the peer keeps it apart from its sync links (a running node on this database keeps
/// its own link to the peer) and runs no round on it. No row travels: first each table's digest, then, for the
/// tables whose digests differ only, the row hashes in pages of ``pageRows`` in key order, merged with this node's.
/// A peer too old to answer is said to be so, in plain words.
public enum PeerVerifier {
    /// Row hashes per page asked of the peer and read locally.
    public static let pageRows = 1_024

    /// Compares the database at `configuration.databasePath` with the peer at `address`; lists at most `limit`
    /// differing rows. Throws a network or handshake error when the peer cannot be reached, and
    /// ``ShoalError/Code/rejected`` when it refuses (with its reason).
    public static func verify(
        configuration: NodeConfiguration,
        address: PeerAddress,
        limit: Int = 1_000,
        timeoutMilliseconds: Int64 = 120_000
    ) async throws(ShoalError) -> VerifyReport {
        let store = try Store(path: configuration.databasePath, options: configuration.storeOptions)
        let storedName = try store.nodeName()
        let hello = Hello(
            clusterID: configuration.clusterID,
            siteID: store.identitySiteID,
            nodeName: configuration.nodeName ?? storedName ?? "shoal",
            schemaFingerprint: try store.schemaFingerprint(),
            listenPort: 0
        )
        let setup: any ChannelSetup =
            configuration.channelSetup ?? FramingChannelSetup(maximumFrameLength: configuration.maximumFrameLength)
        let channel: NIOAsyncChannel<WireMessage, WireMessage>
        do {
            channel = try await ClientBootstrap(group: configuration.eventLoopGroup)
                .connectTimeout(.seconds(3))
                .connect(host: address.host, port: address.port) { channel in setup.configure(channel, role: .client) }
        } catch {
            throw ShoalError(code: .network, message: DialFailure.describe(error, address: address))
        }
        let raw = channel.channel
        let watchdog = Task {
            try await Task.sleep(for: .milliseconds(timeoutMilliseconds))
            raw.close(promise: nil)
        }
        defer { watchdog.cancel() }
        do {
            _ = try await setup.authenticatedPeer(of: raw)
        } catch {
            try? await channel.executeThenClose { _, _ in }
            throw error
        }
        let result: Result<VerifyReport, ShoalError>
        do {
            result = try await channel.executeThenClose { inbound, outbound in
                var conversation = Conversation(
                    messages: inbound.makeAsyncIterator(),
                    outbound: outbound,
                    address: address
                )
                do throws(ShoalError) {
                    let report = try await conversation.run(hello: hello, store: store, limit: limit)
                    outbound.finish()
                    return .success(report)
                } catch {
                    return .failure(error)
                }
            }
        } catch {
            throw ShoalError(
                code: .network,
                message: "the connection to \(address) failed during the comparison: \(error)"
            )
        }
        return try result.get()
    }

    /// One inspection, from the peer's hello to the last page.
    private struct Conversation {
        var messages: NIOAsyncChannelInboundStream<WireMessage>.AsyncIterator
        let outbound: NIOAsyncChannelOutboundWriter<WireMessage>
        let address: PeerAddress
        var nextRequest: UInt64 = 1

        mutating func run(hello: Hello, store: Store, limit: Int) async throws(ShoalError) -> VerifyReport {
            // The accepting side says hello first, on every link: its versions say whether it can answer at all.
            let peer: Hello
            switch try await next() {
            case .hello(let theirs): peer = theirs
            default: throw ShoalError(code: .malformedMessage, message: "\(address) did not say hello first")
            }
            guard peer.versions.upperBound >= WireProtocol.inspectionVersion else {
                throw ShoalError(
                    code: .versionMismatch,
                    message: "the node at \(address) (\(peer.nodeName.printable())) speaks protocol versions "
                        + "\(peer.versions.lowerBound)-\(peer.versions.upperBound): it runs an older Shoal that cannot "
                        + "list rows (version \(WireProtocol.inspectionVersion) can); upgrade it, then run this again"
                )
            }
            guard peer.versions.upperBound >= WireProtocol.comparableDigestVersion else {
                throw ShoalError(
                    code: .versionMismatch,
                    message: "the node at \(address) (\(peer.nodeName.printable())) speaks protocol versions "
                        + "\(peer.versions.lowerBound)-\(peer.versions.upperBound): it runs an older Shoal whose "
                        + "row hashes differ from this one's (deleted rows counted, or columns in table order rather "
                        + "than by name; version \(WireProtocol.comparableDigestVersion)), so tables would differ; "
                        + "upgrade it, then run this again"
                )
            }
            try await send(.inspect(hello))
            let (local, theirs) = try await tables(store: store)
            var report = VerifyReport(
                peerName: peer.nodeName.printable(),
                peerSite: peer.siteID,
                localVersionVector: local.versionVector,
                peerVersionVector: theirs.versionVector,
                localDigest: local.digest.bytes,
                peerDigest: theirs.digest,
                tables: [],
                differingTables: [],
                rows: [],
                truncated: false
            )
            let mine = Dictionary(uniqueKeysWithValues: local.tables.map { ($0.name, $0) })
            let others = Dictionary(uniqueKeysWithValues: theirs.tables.map { ($0.name, $0) })
            report.tables = Set(mine.keys).union(others.keys).sorted()
            report.peerTables = others.keys.sorted()
            for table in report.tables {
                let here = mine[table]
                let there = others[table]
                guard here?.digest.bytes != there?.digest || here?.digest.rowCount != there?.rows else { continue }
                report.differingTables.append(table)
                guard report.rows.count <= limit else { continue }
                let keyColumns = here?.keyColumns ?? there?.keyColumns ?? []
                let found = try await compareRows(
                    of: table,
                    here: here != nil,
                    there: there != nil,
                    store: store,
                    limit: limit + 1 - report.rows.count
                )
                for (key, difference) in found {
                    report.rows.append(
                        VerifyReport.Row(
                            table: table,
                            keyColumns: keyColumns,
                            key: decodeKey(key),
                            difference: difference
                        )
                    )
                }
            }
            if report.rows.count > limit {
                report.rows.removeLast(report.rows.count - limit)
                report.truncated = true
            }
            return report
        }

        /// This node's table digests and the peer's.
        private mutating func tables(
            store: Store
        ) async throws(ShoalError) -> (
            local: (versionVector: VersionVector, digest: StateDigest, tables: [TableDigest]),
            peer: (versionVector: VersionVector, digest: [UInt8], tables: [TableSummary])
        ) {
            let id = nextRequest
            nextRequest += 1
            try await send(.inspectionRequest(InspectionRequest(requestID: id, query: .tables)))
            guard case .inspectionAnswer(let answer) = try await next(), answer.requestID == id,
                case .tables(let vector, let digest, let tables) = answer.content
            else { throw unexpected() }
            // Read after the peer answered, so a sync finishing meanwhile shows in both (or neither) more often.
            let local = try store.tableDigests()
            return (local, (vector, digest, tables))
        }

        /// Merges this node's row hashes of `table` with the peer's, a page of each at a time.
        private mutating func compareRows(
            of table: String,
            here: Bool,
            there: Bool,
            store: Store,
            limit: Int
        ) async throws(ShoalError) -> [(key: [UInt8], difference: VerifyReport.Difference)] {
            var merge = RowHashMerge()
            if !here { merge.addLocal([], isLast: true) }
            if !there { merge.addRemote([], isLast: true) }
            while !merge.isFinished && merge.found.count < limit {
                if merge.needsLocal {
                    let page = try store.rowHashes(of: table, after: merge.localAfter, limit: PeerVerifier.pageRows)
                    merge.addLocal(page.rows.map { RowHash(key: $0.key, hash: $0.hash) }, isLast: page.isLast)
                }
                if merge.needsRemote {
                    let id = nextRequest
                    nextRequest += 1
                    let query = InspectionRequest.Query.rows(
                        table: table,
                        after: merge.remoteAfter,
                        limit: UInt32(PeerVerifier.pageRows)
                    )
                    try await send(.inspectionRequest(InspectionRequest(requestID: id, query: query)))
                    guard case .inspectionAnswer(let answer) = try await next(), answer.requestID == id,
                        case .rows(let answered, let rows, let isLast) = answer.content, answered == table
                    else { throw unexpected() }
                    merge.addRemote(rows, isLast: isLast)
                }
                merge.advance(limit: limit)
            }
            return merge.found
        }

        private func decodeKey(_ encoded: [UInt8]) -> [SQLValue] {
            var reader = ByteReader(encoded)
            var key: [SQLValue] = []
            while !reader.isAtEnd {
                guard let value = try? SQLValue.decode(from: &reader) else { return key + [.blob(encoded)] }
                key.append(value)
            }
            return key
        }

        private func send(_ message: WireMessage) async throws(ShoalError) {
            do {
                try await outbound.write(message)
            } catch {
                throw ShoalError(code: .network, message: "\(address) closed the connection: \(error)")
            }
        }

        /// The peer's next message that is not a keepalive; a refusal ends the comparison with its reason.
        private mutating func next() async throws(ShoalError) -> WireMessage {
            while true {
                let message: WireMessage?
                do {
                    message = try await messages.next()
                } catch {
                    throw ShoalError(code: .network, message: "the connection to \(address) was cut off: \(error)")
                }
                guard let message else {
                    throw ShoalError(code: .network, message: "\(address) closed the connection")
                }
                switch message {
                case .ping(let nonce):
                    try await send(.pong(nonce))
                case .pong:
                    continue
                case .reject(let rejection) where rejection.reason == .unknownMessageType:
                    throw ShoalError(
                        code: .rejected,
                        message: "the node at \(address) does not know inspections (\(rejection.message)): it runs an "
                            + "older Shoal; upgrade it, then run this again"
                    )
                case .reject(let rejection):
                    throw ShoalError(code: .rejected, message: "the node at \(address) refused: \(rejection.message)")
                default:
                    return message
                }
            }
        }

        private func unexpected() -> ShoalError {
            ShoalError(code: .malformedMessage, message: "\(address) answered something else than what was asked")
        }
    }
}
