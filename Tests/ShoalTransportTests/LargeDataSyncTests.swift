import Foundation
import NIOCore
import NIOPosix
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport
@testable import ShoalProtocol

/// Rows count on `node` for `sql` (one integer).
private func count(_ node: RunningNode, _ sql: String) async throws -> Int64? {
    try await node.node.execute(sql).rows.first?.first?.integerValue
}

@Suite(.serialized) struct LargeDataSyncTests {
    @Test func fiveThousandRowsOfFourKilobyteBlobsInFiftyTransactionsReachThePeer() async throws {
        let directory = try temporaryDirectory("blobs")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        // About 20 MB in all: more than one frame's worth, in batches cut by bytes.
        for transaction in 0..<50 {
            try await a.node.execute(
                "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100) "
                    + "INSERT INTO kv(k, v) SELECT 'blob-\(transaction)-' || i, randomblob(4096) FROM c"
            )
        }
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(try await converge(a, b, within: 120))
        #expect(try await count(b, "SELECT count(*) FROM kv WHERE length(v) = 4096") == 5_000)
        #expect(try await b.node.versionVector() == a.node.versionVector())
        await b.stop()
        await a.stop()
    }

    @Test func aTwentyMegabyteBlobAndASixtyFourMegabyteValueReachThePeerAndLaterChangesFlow() async throws {
        let directory = try temporaryDirectory("huge")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('twenty', randomblob(20 * 1024 * 1024))")
        // 64 MB of TEXT (hex digits), the other large-value type.
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('sixty-four', hex(randomblob(32 * 1024 * 1024)))")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('after', 1)")
        #expect(try await converge(a, b, within: 180))
        let sizes = try await b.node.execute("SELECT k, length(v), typeof(v) FROM kv ORDER BY k").rows
        let expected: [[SQLValue]] = [
            [.text("after"), .integer(1), .text("integer")],
            [.text("sixty-four"), .integer(64 * 1024 * 1024), .text("text")],
            [.text("twenty"), .integer(20 * 1024 * 1024), .text("blob")],
        ]
        #expect(sizes == expected)
        // (converge compared the state digests, which cover every value byte for byte.)
        // Changes written afterwards still flow, both ways.
        try await a.node.execute("UPDATE kv SET n = n + 1 WHERE k = 'after'")
        try await b.node.execute("INSERT INTO kv(k, v) VALUES ('from b', 2)")
        #expect(try await converge(a, b, within: 60))
        #expect(await b.node.peerStatuses().allSatisfy { $0.lastError == nil })
        await b.stop()
        await a.stop()
    }

    /// A node asked to stop while it answers a long catch-up ends the answer at its next batch, instead of
    /// sending the rest first (which took ten seconds and more).
    @Test func aNodeStopsWithoutFinishingALongAnswer() async throws {
        let directory = try temporaryDirectory("stop-serving")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        try await a.node.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 200000) "
                + "INSERT INTO kv(k, v) SELECT 'row-' || i, i FROM c"
        )
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await b.log.seen(within: 120) { if case .catchUpProgress = $0 { true } else { false } })
        await a.stop()
        // Had the answer run to its end, b would hold (and claim) the whole transaction.
        #expect(try await b.node.versionVector()[a.node.siteID] == 0)
        #expect(
            await b.log.seen(within: 30) {
                if case .peerDisconnected(_, let reason) = $0 { reason.contains("shutting down") } else { false }
            }
        )
        await b.stop()
    }

    @Test func aTransactionOfAHundredThousandRowsOfThreeKilobytesCrosses() async throws {
        let directory = try temporaryDirectory("bigtx")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        // One transaction of about 300 MB: it spans many batches, and only the last one claims it.
        try await a.node.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100000) "
                + "INSERT INTO kv(k, v) SELECT 'row-' || i, randomblob(3072) FROM c"
        )
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        var sawPartial = false
        let deadline = Date().addingTimeInterval(600)
        while Date() < deadline, try await b.node.versionVector()[a.node.siteID] == 0 {
            // While the transaction is on its way, b claims nothing of it, whatever it applied already.
            if try await count(b, "SELECT count(*) FROM kv") ?? 0 > 0 { sawPartial = true }
            _ = await b.log.next(within: 1) { if case .catchUpProgress = $0 { true } else { false } }
        }
        #expect(sawPartial)
        #expect(try await converge(a, b, within: 120))
        #expect(try await count(b, "SELECT count(*) FROM kv WHERE length(v) = 3072") == 100_000)
        await b.stop()
        await a.stop()
    }
}

/// Every frame a node sends answering one pull, as (length, message), read off a raw TCP connection.
private func framesAnsweringAPull(port: Int, fingerprint: String, within seconds: Double) async throws
    -> [(length: Int, message: WireMessage)]
{
    let hello = Hello(clusterID: "test", siteID: .random(), nodeName: "probe", schemaFingerprint: fingerprint, listenPort: 0)
    let request = SyncRequest(requestID: 1, versionVector: VersionVector())
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
    return try await channel.executeThenClose { inbound, outbound in
        try await outbound.write(ByteBuffer(bytes: frame(.hello(hello)) + frame(.syncRequest(request))))
        let deadline = Task {
            try await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
            channel.channel.close(promise: nil)
        }
        defer { deadline.cancel() }
        var received = ByteBuffer()
        var frames: [(Int, WireMessage)] = []
        do {
            reading: for try await chunk in inbound {
                received.writeImmutableBuffer(chunk)
                while let length = received.getInteger(at: received.readerIndex, as: UInt32.self),
                    let message = try WireMessageDecoder.nextMessage(from: &received, maximumFrameLength: 1 << 24)
                {
                    frames.append((Int(length), message))
                    if case .changeBatch(let batch) = message, batch.isLast { break reading }
                }
            }
        } catch {}
        return frames
    }
}

@Suite struct BatchBoundTests {
    @Test func noBatchFrameExceedsTheByteBoundAndPiecesStayWithinTheirSize() async throws {
        let directory = try temporaryDirectory("bound")
        defer { try? FileManager.default.removeItem(at: directory) }
        let bound = 256 * 1024
        let a = try await startNode(in: directory, name: "a") { configuration in
            configuration.maxBytesPerBatch = bound
            configuration.pieceBytes = 100_000
        }
        // Values from bytes to megabytes, in transactions small and large, every type.
        try await a.node.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 2000) "
                + "INSERT INTO kv(k, v) SELECT 'small-' || i, CASE i % 4 WHEN 0 THEN i WHEN 1 THEN i * 0.5 "
                + "WHEN 2 THEN 'text ' || i ELSE randomblob(i % 50) END FROM c"
        )
        for size in [3_000, 60_000, 70_000, 255_000, 1_500_000, 5_000_000] {
            try await a.node.execute("INSERT INTO kv(k, v) VALUES ('size-\(size)', randomblob(\(size)))")
        }
        try await a.node.execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 300) "
                + "INSERT INTO kv(k, v) SELECT 'kb-' || i, randomblob(5000) FROM c"
        )
        let fingerprint = try Store(path: a.path).schemaFingerprint()
        let frames = try await framesAnsweringAPull(port: a.port, fingerprint: fingerprint, within: 60)
        let batches = frames.compactMap { frame -> (Int, ChangeBatchMessage)? in
            if case .changeBatch(let batch) = frame.message { (frame.length, batch) } else { nil }
        }
        #expect(batches.last?.1.isLast == true)
        #expect(batches.count > 3)
        for (length, batch) in batches {
            let rows = Set(batch.batch.changes.map { [SQLValue.text($0.table)] + $0.primaryKey }).count
            #expect(length <= bound || rows == 1, "a \(length)-byte batch of \(rows) rows")
        }
        var pieces = 0
        for case (let length, .valuePiece(let piece)) in frames {
            pieces += 1
            #expect(piece.bytes.count <= 100_000 && length <= 100_100)
        }
        // The 70 kB, 255 kB, 1.5 MB and 5 MB values came in pieces (over the 64 KiB inline limit), each encoded
        // with a tag and a length (a few bytes more).
        #expect(pieces == 1 + 3 + 16 + 51)
        let keys = Set(batches.flatMap { $0.1.batch.changes.map(\.primaryKey) })
        #expect(keys.count == 2_000 + 6 + 300)
        await a.stop()
    }
}

@Suite struct UnsendableChangeTests {
    @Test func aValueOverTheMaximumIsAFailureBothSidesReportAndBackOffFrom() async throws {
        let directory = try temporaryDirectory("unsendable")
        defer { try? FileManager.default.removeItem(at: directory) }
        // A node whose maximum value size is 1 MiB (so the test needs no 256 MiB value).
        let a = try await startNode(in: directory, name: "a") { $0.session.maximumValueBytes = 1 << 20 }
        let b = try await startNode(in: directory, name: "b", peers: [a.port]) { configuration in
            configuration.backoffInitialMilliseconds = 20
            configuration.backoffMaximumMilliseconds = 60_000
        }
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('too big', randomblob(2 * 1024 * 1024))")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('behind it', 1)")
        // Both sides say why, plainly, and b (the dialler) backs off instead of reconnecting at once.
        let deadline = Date().addingTimeInterval(60)
        var statusA: PeerStatus?
        var statusB: PeerStatus?
        while Date() < deadline {
            statusA = await a.node.peerStatuses().first
            statusB = await b.node.peerStatuses().first
            if (statusB?.consecutiveFailures ?? 0) >= 5 && statusA?.lastError != nil { break }
            _ = await b.log.next(within: 0.5) { _ in true }
        }
        #expect(statusA?.lastError?.contains("exceeds the maximum value size") == true)
        #expect(statusB?.lastError?.contains("the peer refused") == true)
        #expect(statusB?.lastError?.contains("cannot be sent") == true)
        #expect((statusB?.retryDelayMilliseconds ?? 0) >= 20 * 16 * 8 / 10)
        let dials = await b.node.dialCount(PeerAddress(host: "127.0.0.1", port: a.port))
        #expect(dials <= (statusB?.consecutiveFailures ?? 0) + 2)
        // b never claims what it did not receive.
        #expect(try await b.node.versionVector()[a.node.siteID] < a.node.versionVector()[a.node.siteID])
        await b.stop()
        await a.stop()
    }
}
