import CSQLite
import Foundation
import NIOCore
import NIOPosix
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalStore
@testable import ShoalTransport

/// Changes `path` behind Shoal's back, as a tool that bypasses its triggers would: a connection of its own with
/// triggers off runs `sql` (nothing is captured, no version moves), then the digest's stored sums are dropped, so the
/// next read of the digest rebuilds it from a scan and sees the change.
func changeBehindShoalsBack(_ path: String, _ sql: String) throws {
    let connection = try SQLiteConnection(path: path)
    _ = shoal_db_config_flag(connection.handle, SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
    try connection.exec("BEGIN IMMEDIATE; \(sql); DELETE FROM shoal_digest; COMMIT")
}

@Suite struct DivergenceTests {
    /// Two live nodes at the same version whose rows differ: each says so (an event, the peer's status), and
    /// `PeerVerifier` lists exactly the row that differs; a write that mends the row clears the divergence.
    @Test func aRowChangedBehindShoalsBackIsALoudDivergenceAndVerifyListsIt() async throws {
        let directory = try temporaryDirectory("diverged")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a") { $0.roundIntervalMilliseconds = 200 }
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) { $0.roundIntervalMilliseconds = 200 }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('k1', 'one'), ('k2', 'two'), ('k3', 'three')")
        #expect(try await converge(a, b))
        let versionBefore = try await b.node.versionVector()

        try changeBehindShoalsBack(b.path, "UPDATE kv SET v = 'tampered' WHERE k = 'k2'")
        let divergedAtA = await a.log.seen(within: 60) { event in
            if case .peerDiverged = event { true } else { false }
        }
        let divergedAtB = await b.log.seen(within: 60) { event in
            if case .peerDiverged = event { true } else { false }
        }
        let eventsA = await a.log.events
        let eventsB = await b.log.events
        #expect(divergedAtA && divergedAtB, "\(eventsA)\n\(eventsB)")
        #expect(try await b.node.versionVector() == versionBefore)
        let peerOfA = try #require(await a.node.peerStatuses().first)
        #expect(peerOfA.siteID == b.node.siteID && peerOfA.isConnected)
        #expect(peerOfA.divergence != nil && peerOfA.consecutiveFailures == 0)
        // b dialled a: a knows where b listens from its hello, for `shoal verify --peer`.
        #expect(peerOfA.listeningAddress == "127.0.0.1:\(b.port)")
        #expect(await b.node.peerStatuses().first?.divergence != nil)

        // Read-only on both sides, over a connection of its own: the sync link stays up.
        var configuration = NodeConfiguration(databasePath: a.path)
        configuration.clusterID = "test"
        configuration.insecurePlaintext = true
        let report = try await PeerVerifier.verify(
            configuration: configuration,
            address: PeerAddress(host: "127.0.0.1", port: b.port)
        )
        #expect(report.sameVersion && !report.sameDigest)
        #expect(report.peerSite == b.node.siteID && report.differingTables == ["kv"])
        #expect(
            report.rows == [VerifyReport.Row(table: "kv", keyColumns: ["k"], key: [.text("k2")], difference: .differs)]
        )
        #expect(report.rows.first?.keyDescription == "k='k2'")
        #expect(try await b.node.versionVector() == versionBefore)
        #expect(await a.node.peerStatuses().first?.isConnected == true)
        #expect(await b.node.peerStatuses().first?.isConnected == true)

        // A write through Shoal that overwrites the row mends it: both say the divergence is over.
        try await a.node.execute("UPDATE kv SET v = 'mended' WHERE k = 'k2'")
        #expect(await a.log.seen(within: 60) { if case .peerConverged = $0 { true } else { false } })
        #expect(await b.log.seen(within: 60) { if case .peerConverged = $0 { true } else { false } })
        #expect(await a.node.peerStatuses().first?.divergence == nil)
        let mended = try await PeerVerifier.verify(
            configuration: configuration,
            address: PeerAddress(host: "127.0.0.1", port: b.port)
        )
        #expect(mended.sameDigest && mended.rows.isEmpty && mended.differingTables.isEmpty)

        // A row whose data and metadata were both deleted behind Shoal's back is missing on the peer.
        try changeBehindShoalsBack(
            b.path,
            "DELETE FROM kv WHERE k = 'k3'; DELETE FROM shoal_clock_1 WHERE k0 = 'k3'"
        )
        let missing = try await waitUntil(within: 30, checkingEvery: 200) {
            let found = try await PeerVerifier.verify(
                configuration: configuration,
                address: PeerAddress(host: "127.0.0.1", port: b.port)
            )
            return found.rows == [
                VerifyReport.Row(table: "kv", keyColumns: ["k"], key: [.text("k3")], difference: .missingOnPeer)
            ]
        }
        #expect(missing)
        await b.stop()
        await a.stop()
    }

    /// A node that holds values for a column it has not added yet (it follows schema changes by hand) has rows that
    /// differ from its peer's at the same version, by design: neither side calls that a divergence. Once it adds the
    /// column, the digests are compared again, and match.
    @Test func aNodeHoldingValuesForAColumnItLacksIsNotCalledDiverged() async throws {
        let directory = try temporaryDirectory("diverged-held")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a") { $0.roundIntervalMilliseconds = 200 }
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) {
            $0.roundIntervalMilliseconds = 200
            $0.storeOptions.schemaChanges = .manual
        }
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('k1', 'one')")
        #expect(try await converge(a, b))
        try await a.node.execute("ALTER TABLE kv ADD COLUMN colour TEXT")
        try await a.node.execute("UPDATE kv SET colour = 'red' WHERE k = 'k1'")
        // The same changes on both (equal versions), not the same rows (b holds the colour it has no column for).
        let holds = try await waitUntil(within: 30, checkingEvery: 100) {
            let held = try await b.node.withStore { store throws(ShoalError) in try store.holdsChanges() }
            let (vectorA, vectorB) = (try await a.node.versionVector(), try await b.node.versionVector())
            return held && vectorA == vectorB
        }
        #expect(holds)
        // Rounds go on at the same version (each acknowledgement would carry a digest to compare; a digest is
        // refreshed at most every 2 s once the data is quiet): some seconds of them. A settled link runs one periodic
        // round in thirty (6 s apart here).
        let roundsBefore = await a.log.events.count { if case .roundFinished = $0 { true } else { false } }
        let rounds = try await waitUntil(within: 30, checkingEvery: 100) {
            await a.log.events.count { if case .roundFinished = $0 { true } else { false } } >= roundsBefore + 2
        }
        #expect(rounds)
        for log in [a.log, b.log] {
            #expect(await !log.events.contains { if case .peerDiverged = $0 { true } else { false } })
        }
        // b's app update adds the column: the held values are merged, and the rows are the same again.
        try await b.node.execute("ALTER TABLE kv ADD COLUMN colour TEXT")
        let merged = try await waitUntil(within: 30, checkingEvery: 100) {
            try await b.node.execute("SELECT colour FROM kv WHERE k = 'k1'").rows == [[.text("red")]]
        }
        #expect(merged)
        #expect(try await converge(a, b))
        #expect(await a.node.peerStatuses().first?.divergence == nil)
        await b.stop()
        await a.stop()
    }

    /// A node that speaks only protocol versions 1-2 (an older Shoal, played by a server that says its hello) is told
    /// apart before anything is asked, in plain words.
    @Test func anOlderPeerIsToldApartInPlainWords() async throws {
        let directory = try temporaryDirectory("inspect-old")
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("here.db").path
        do {
            let store = try Store(path: path)
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
        }
        let oldHello = frame(
            .hello(
                Hello(
                    versions: 1...2,
                    clusterID: "test",
                    siteID: .random(),
                    nodeName: "old",
                    schemaFingerprint: try Store(path: path).schemaFingerprint(),
                    listenPort: 0
                )
            )
        )
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let port = try #require(server.channel.localAddress?.port)
        let serving = Task {
            try await server.executeThenClose { connections in
                for try await connection in connections {
                    try await connection.executeThenClose { inbound, outbound in
                        try await outbound.write(ByteBuffer(bytes: oldHello))
                        for try await _ in inbound {}
                    }
                }
            }
        }
        defer { serving.cancel() }
        var configuration = NodeConfiguration(databasePath: path)
        configuration.clusterID = "test"
        configuration.insecurePlaintext = true
        do {
            _ = try await PeerVerifier.verify(
                configuration: configuration,
                address: PeerAddress(host: "127.0.0.1", port: port)
            )
            Issue.record("an older peer was not told apart")
        } catch {
            #expect(error.code == .versionMismatch && error.message.contains("older Shoal"), "\(error)")
        }
        try? await server.channel.close()
    }

    /// The session's rules: an inspection opens with its own hello (version 3 on), answers inspection requests
    /// only and runs no round; inspection messages on a sync link are refused.
    @Test func anInspectionIsASessionOfItsOwn() throws {
        let fingerprint = "kv"
        func hello(_ versions: ClosedRange<UInt16> = 1...WireProtocol.maximumVersion) -> Hello {
            Hello(
                versions: versions,
                clusterID: "c",
                siteID: .random(),
                nodeName: "n",
                schemaFingerprint: fingerprint,
                listenPort: 0
            )
        }
        var session = SyncSession(local: hello(), now: 0)
        _ = session.start()
        let asker = hello()
        let opened = session.receive(.inspect(asker), now: 1)
        #expect(opened == [.inspectionStarted(asker, version: WireProtocol.maximumVersion)])
        #expect(session.isInspection && session.localChange().isEmpty)
        #expect(session.startRound(versionVector: VersionVector(), now: 2).isEmpty)
        let request = InspectionRequest(requestID: 7, query: .rows(table: "kv", after: [1, 2], limit: 10))
        #expect(session.receive(.inspectionRequest(request), now: 3) == [.answerInspection(request)])
        let refused = session.receive(.syncRequest(SyncRequest(requestID: 1, versionVector: VersionVector())), now: 4)
        #expect(
            refused.contains { if case .send(.reject(let r)) = $0 { r.reason == .malformedMessage } else { false } }
        )

        // A node speaking versions 1-2 only refuses an inspection.
        var old = SyncSession(local: hello(1...2), now: 0)
        let oldAnswer = old.receive(.inspect(hello()), now: 1)
        #expect(
            oldAnswer.contains { if case .send(.reject(let r)) = $0 { r.reason == .versionMismatch } else { false } }
        )

        // On a sync link, an inspection request is refused.
        var sync = SyncSession(local: hello(), now: 0)
        _ = sync.receive(.hello(hello()), now: 1)
        let onSync = sync.receive(.inspectionRequest(request), now: 2)
        #expect(onSync.contains { if case .send(.reject(let r)) = $0 { r.reason == .malformedMessage } else { false } })
    }

    /// The inspection messages round-trip through the codec; bad ones are refused as malformed.
    @Test func inspectionMessagesRoundTrip() throws {
        var vector = VersionVector()
        vector.advance(.random(), to: 9)
        let messages: [WireMessage] = [
            .inspect(Hello(clusterID: "c", siteID: .random(), nodeName: "n", schemaFingerprint: "f", listenPort: 7)),
            .inspectionRequest(InspectionRequest(requestID: 1, query: .tables)),
            .inspectionRequest(InspectionRequest(requestID: 2, query: .rows(table: "kv", after: nil, limit: 1))),
            .inspectionRequest(
                InspectionRequest(requestID: 3, query: .rows(table: "kv", after: [0, 1], limit: 4_096))
            ),
            .inspectionAnswer(
                InspectionAnswer(
                    requestID: 1,
                    content: .tables(
                        versionVector: vector,
                        digest: Array(repeating: 7, count: 32),
                        tables: [TableSummary(name: "kv", keyColumns: ["a", "b"], digest: [1, 2], rows: 3)]
                    )
                )
            ),
            .inspectionAnswer(
                InspectionAnswer(
                    requestID: 2,
                    content: .rows(table: "kv", rows: [RowHash(key: [3, 0, 1, 0x6b], hash: [9, 9])], isLast: true)
                )
            ),
        ]
        for message in messages { #expect(try WireMessage.decode(message.encoded()) == message) }
        // A page beyond the maximum, and an unknown query.
        var tooLarge = WireMessage.inspectionRequest(
            InspectionRequest(requestID: 1, query: .rows(table: "kv", after: nil, limit: 1))
        ).encoded()
        tooLarge.replaceSubrange((tooLarge.count - 4)..., with: [0, 1, 0, 1])
        #expect(throws: ShoalError.self) { try WireMessage.decode(tooLarge) }
        #expect(throws: ShoalError.self) { try WireMessage.decode([11, 0, 0, 0, 0, 0, 0, 0, 1, 9]) }
    }

    /// Inspections are no sync links (never a duplicate, out of the handshake pool) and only a few run at once.
    @Test func inspectionsAreBoundedAndApartFromSyncLinks() {
        var registry = ConnectionRegistry(localSite: .random(), limits: ConnectionRegistry.Limits())
        let (_, inbox) = AsyncStream.makeStream(of: ConnectionEvent.self)
        var ids: [Int] = []
        for _ in 0...ConnectionRegistry.maximumInspections {
            guard case .admitted(let id, _) = registry.register(dialed: false, remoteIP: "10.0.0.1", inbox: inbox)
            else {
                Issue.record("not admitted")
                return
            }
            ids.append(id)
            // Each one leaves the handshake pool (4 per address) as it becomes an inspection.
            _ = registry.inspecting(id)
        }
        #expect(registry.entries.values.filter(\.inspection).count == ConnectionRegistry.maximumInspections)
        #expect(registry.entries[ids.last!]?.inspection == false)
        _ = registry.remove(ids[0])
        let admitted = registry.inspecting(ids.last!)
        #expect(admitted)
        #expect(!registry.isConnected(.random()) && registry.entries.values.allSatisfy { $0.peer == nil })
    }

    /// The merge of two key-ordered streams of row hashes, a page at a time.
    @Test func rowHashesMergeAPageAtATime() {
        func row(_ key: UInt8, _ hash: UInt8) -> RowHash { RowHash(key: [key], hash: [hash]) }
        var merge = RowHashMerge()
        merge.addLocal([row(1, 1), row(2, 2)], isLast: false)
        merge.addRemote([row(1, 1), row(3, 3)], isLast: false)
        merge.advance(limit: 100)
        // 2 is below 3, so it is missing on the peer; 3 waits for this node's next page.
        #expect(merge.found.map(\.key) == [[2]] && merge.needsLocal && !merge.needsRemote)
        merge.addLocal([row(3, 4), row(5, 5)], isLast: true)
        merge.advance(limit: 100)
        #expect(merge.found.map(\.difference) == [.missingOnPeer, .differs] && merge.needsRemote)
        merge.addRemote([row(4, 4)], isLast: true)
        merge.advance(limit: 100)
        #expect(merge.isFinished)
        #expect(merge.found.map(\.key) == [[2], [3], [4], [5]])
        #expect(merge.found.map(\.difference) == [.missingOnPeer, .differs, .missingHere, .missingOnPeer])
    }

    /// A mismatch is a suspicion until a second comparison in a row confirms it; a match ends it.
    @Test func divergenceNeedsTwoComparisonsAndEndsWithAMatch() {
        var watch = DivergenceWatch()
        let peer = SiteID.random()
        var vector = VersionVector()
        vector.advance(.random(), to: 3)
        var other = vector
        other.advance(.random(), to: 1)
        #expect(
            watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "x",
                localVector: vector,
                localDigest: "y",
                now: 1
            ) == .none
        )
        guard
            case .diverged(let found) = watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "x",
                localVector: vector,
                localDigest: "y",
                now: 2
            )
        else {
            Issue.record("a second mismatch in a row is a divergence")
            return
        }
        #expect(found.since == 2 && watch.diverged[peer] != nil)
        // Different versions say nothing either way.
        #expect(
            watch.compare(peer: peer, peerVector: other, peerDigest: "x", localVector: vector, localDigest: "x", now: 3)
                == .none
        )
        #expect(watch.diverged[peer] != nil)
        #expect(
            watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "z",
                localVector: vector,
                localDigest: "z",
                now: 4
            ) == .converged
        )
        #expect(watch.diverged.isEmpty)
        // One mismatch followed by a match is nothing.
        #expect(
            watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "x",
                localVector: vector,
                localDigest: "y",
                now: 5
            ) == .none
        )
        #expect(
            watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "y",
                localVector: vector,
                localDigest: "y",
                now: 6
            ) == .none
        )
        #expect(
            watch.compare(
                peer: peer,
                peerVector: vector,
                peerDigest: "x",
                localVector: vector,
                localDigest: "y",
                now: 7
            ) == .none
        )
    }
}
