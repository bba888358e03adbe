import Foundation
import Synchronization
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalStore
@testable import ShoalTransport

/// What a driver reported, for the test to wait on.
private enum Report: Sendable {
    case established(SiteID)
    case roundFinished(applied: Int)
    case progress
    case acknowledged
    case roundFailed(String)
    /// The driver asked whether a pull under way elsewhere covers what its peer announced, and was told so.
    case putOff
    case pullStarting
}

/// A delegate that admits every connection and streams what it is told.
private final class Recorder: ConnectionDelegate {
    let reports: AsyncStream<Report>
    private let sink: AsyncStream<Report>.Continuation
    /// Whether a pull under way on another link (there is none: the test says so) covers whatever is asked.
    let coveringPullUnderWay = Mutex(false)

    init() {
        (reports, sink) = AsyncStream.makeStream(of: Report.self)
    }

    func connectionEstablished(_ id: Int, peer: Hello, address: String) async -> Admission {
        sink.yield(.established(peer.siteID))
        return .accepted
    }
    func connectionRoundFinished(peer: SiteID, applied: Int, milliseconds: UInt64) async {
        sink.yield(.roundFinished(applied: applied))
    }
    func connectionProgress(peer: SiteID, changes: Int, bytes: Int, remaining: UInt64, milliseconds: UInt64) async {
        sink.yield(.progress)
    }
    func connectionAcknowledged(peer: SiteID, _ ack: Ack) async { sink.yield(.acknowledged) }
    func pullStarting(_ id: Int, expecting: VersionVector) async { sink.yield(.pullStarting) }
    func pullUnderWay(covering vector: VersionVector, except id: Int) async -> Bool {
        let covering = coveringPullUnderWay.withLock { $0 }
        if covering { sink.yield(.putOff) }
        return covering
    }
    func connectionRoundFailed(peer: SiteID, reason: String) async { sink.yield(.roundFailed(reason)) }
    func connectionClockView(peer: SiteID, aheadMilliseconds: Int64) async {}
    func describeClockRefusal(_ error: ShoalError, batch: ChangeBatch, peer: SiteID?) async -> ShoalError { error }

    /// Waits for a report matching `matches`; `false` if the stream ended or `seconds` passed first.
    func wait(within seconds: Double = 20, for matches: @escaping @Sendable (Report) -> Bool) async -> Bool {
        let reports = self.reports
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                for await report in reports where matches(report) { return true }
                return false
            }
            group.addTask {
                try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
    }
}

/// Messages, appended from any task.
private final class MessageLog: Sendable {
    let messages = Mutex<[WireMessage]>([])
    /// The same messages, as they are written.
    let stream: AsyncStream<WireMessage>
    let sink: AsyncStream<WireMessage>.Continuation

    init() {
        (stream, sink) = AsyncStream.makeStream(of: WireMessage.self)
    }
}

/// A message stream that remembers what was written through it.
private struct RecordingStream: MessageStream {
    let inner: InMemoryMessageStream
    let written = MessageLog()

    var inbound: AsyncThrowingStream<WireMessage, any Error> { inner.inbound }

    func write(_ message: WireMessage) async throws {
        // A message encoded ahead (a batch or a piece, compressed or not) is recorded as the peer reads it.
        var seen = message
        if case .encoded(let encoded) = message { seen = try WireMessage.decode(encoded.payload) }
        written.messages.withLock { $0.append(seen) }
        written.sink.yield(seen)
        try await inner.write(message)
    }
    func finish() { inner.finish() }
    func close() { inner.close() }
}

/// One end: a real store behind a SerializedStore, a driver and its inbox.
private struct Side {
    let worker: SerializedStore
    let recorder = Recorder()
    let inbox: AsyncStream<ConnectionEvent>
    let signals: AsyncStream<ConnectionEvent>.Continuation
    var settings = ConnectionDriver.Settings(clock: SystemWallClock())

    init(_ directory: URL, _ name: String, schema: String = "CREATE TABLE kv(k TEXT PRIMARY KEY, v, n INTEGER DEFAULT 0)")
        throws
    {
        let path = directory.appendingPathComponent("\(name).db").path
        let store = try Store(path: path)
        try store.execute(schema)
        try store.replicate(table: schema.contains(" kv(") ? "kv" : "other", counters: schema.contains(" n ") ? ["n"] : [])
        worker = try SerializedStore(path: path, options: StoreOptions())
        (inbox, signals) = AsyncStream.makeStream(of: ConnectionEvent.self)
        settings.tickMilliseconds = 10
    }

    func hello() async throws -> Hello {
        try await worker.hello(clusterID: "test", nodeName: nil, listenPort: 0)
    }

    func write(_ sql: String) async throws {
        _ = try await worker.withStore { store throws(ShoalError) in try store.execute(sql) }
    }

    /// Runs a driver over `stream` until it ends.
    func run(over stream: some MessageStream) -> Task<ConnectionDriver.Outcome, any Error> {
        let worker = self.worker
        let recorder = self.recorder
        let settings = self.settings
        let inbox = self.inbox
        let signals = self.signals
        return Task {
            let hello = try await worker.hello(clusterID: "test", nodeName: nil, listenPort: 0)
            var driver = ConnectionDriver(
                id: 1,
                address: "memory",
                worker: worker,
                delegate: recorder,
                settings: settings
            )
            return await driver.run(hello: hello, over: stream, inbox: inbox, events: signals)
        }
    }
}

/// Runs two drivers against each other over an in-memory pair until both finished a round and their stores
/// match, then shuts one down; returns both outcomes and what each side wrote.
private func exchange(
    _ a: Side,
    _ b: Side
) async throws -> (a: ConnectionDriver.Outcome, b: ConnectionDriver.Outcome, sentByB: [WireMessage]) {
    let (left, right) = InMemoryMessageStream.pair()
    let recordedB = RecordingStream(inner: right)
    let runA = a.run(over: left)
    let runB = b.run(over: recordedB)
    // Both pull at the handshake; wait until the two stores agree (each finished round is a chance to check).
    var agreed = false
    for _ in 0..<50 {
        if try await a.worker.digest() == b.worker.digest() {
            agreed = true
            break
        }
        _ = await a.recorder.wait(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
    }
    #expect(agreed, "the two stores did not converge")
    a.signals.yield(.shutdown)
    return (try await runA.value, try await runB.value, recordedB.written.messages.withLock { $0 })
}

/// The one connection driver, run over an in-memory message stream on real stores: the code the node runs over
/// TCP, without sockets.
@Suite struct ConnectionDriverTests {
    @Test func oneRoundSyncsBothDirections() async throws {
        let directory = try temporaryDirectory("driver-both")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Side(directory, "a")
        let b = try Side(directory, "b")
        try await a.write("INSERT INTO kv(k, v) VALUES ('1', 'a'), ('2', 'b'), ('3', 'c')")
        try await b.write("INSERT INTO kv(k, v) VALUES ('x', 'y')")
        try await b.write("UPDATE kv SET n = n + 1 WHERE k = 'x'")
        let (outcomeA, outcomeB, _) = try await exchange(a, b)
        #expect(try await a.worker.versionVector() == b.worker.versionVector())
        #expect(outcomeA.established && outcomeB.established)
        #expect(outcomeA.healthy && outcomeB.refusal?.reason == .shuttingDown)
    }

    @Test func anAnswerTravelsInNumberedBatches() async throws {
        let directory = try temporaryDirectory("driver-batches")
        defer { try? FileManager.default.removeItem(at: directory) }
        var a = try Side(directory, "a")
        var b = try Side(directory, "b")
        a.settings.maxChangesPerBatch = 3
        b.settings.maxChangesPerBatch = 3
        for index in 0..<20 { try await b.write("INSERT INTO kv(k, v) VALUES ('\(index)', \(index))") }
        let (_, _, sentByB) = try await exchange(a, b)
        let batches = sentByB.compactMap { message -> ChangeBatchMessage? in
            if case .changeBatch(let batch) = message, !batch.batch.changes.isEmpty { batch } else { nil }
        }
        #expect(batches.count >= 7)
        #expect(batches.map(\.sequence) == (0..<UInt32(batches.count)).map { $0 })
        #expect(batches.map(\.isLast) == Array(repeating: false, count: batches.count - 1) + [true])
        #expect(try await a.worker.digest() == b.worker.digest())
    }

    @Test func aLargeValueTravelsInPieces() async throws {
        let directory = try temporaryDirectory("driver-pieces")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Side(directory, "a")
        var b = try Side(directory, "b")
        b.settings.session.inlineValueLimit = 1_000
        b.settings.session.pieceBytes = 256
        try await b.write("INSERT INTO kv(k, v) VALUES ('big', randomblob(10000))")
        let (_, _, sentByB) = try await exchange(a, b)
        let pieces = sentByB.filter { if case .valuePiece = $0 { true } else { false } }
        #expect(pieces.count == 40)  // 10,000 bytes and a 3-byte header, in pieces of 256
        let held = try await a.worker.withStore { store throws(ShoalError) in try store.execute("SELECT length(v) FROM kv WHERE k = 'big'") }
        #expect(held.rows == [[.integer(10_000)]])
    }

    @Test func differentSchemasKeepSyncingEachHoldingWhatItLacks() async throws {
        let directory = try temporaryDirectory("driver-schema")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Side(directory, "a")
        let b = try Side(directory, "b", schema: "CREATE TABLE other(id INTEGER PRIMARY KEY, v)")
        try await a.write("INSERT INTO kv(k, v) VALUES ('a', 1)")
        try await b.write("INSERT INTO other(id, v) VALUES (1, 'x')")
        let (left, right) = InMemoryMessageStream.pair()
        let runA = a.run(over: left)
        let runB = b.run(over: right)
        var held = false
        for _ in 0..<50 {
            let heldByA = try await a.worker.withStore { store throws(ShoalError) in try store.heldChanges() }
            let heldByB = try await b.worker.withStore { store throws(ShoalError) in try store.heldChanges() }
            if heldByA == ["other": 1] && heldByB == ["kv": 2] {  // kv's row: its value and its counter
                held = true
                break
            }
            _ = await a.recorder.wait(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
        }
        let heldByA = try await a.worker.withStore { store throws(ShoalError) in try store.heldChanges() }
        let heldByB = try await b.worker.withStore { store throws(ShoalError) in try store.heldChanges() }
        #expect(held, "each side holds the table it lacks: \(heldByA) \(heldByB)")
        #expect(try await a.worker.versionVector() == b.worker.versionVector())
        a.signals.yield(.shutdown)
        let (outcomeA, outcomeB) = (try await runA.value, try await runB.value)
        #expect(outcomeA.established && outcomeB.established)
    }

    @Test func aLongApplyTellsThePeerItIsAlive() async throws {
        let directory = try temporaryDirectory("driver-heartbeat")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try Side(directory, "a")
        var b = try Side(directory, "b")
        b.settings.session.keepaliveInterval = 40
        try await a.write("INSERT INTO kv(k, v) VALUES ('1', 'a')")
        let answer = try await a.worker.withStore { store throws(ShoalError) in
            try store.changes(since: VersionVector())
        }
        // The test is b's peer: it says hello, waits for b's pull, and answers it while b's store is busy.
        let (left, peer) = InMemoryMessageStream.pair()
        let run = b.run(over: left)
        try await peer.write(.hello(try await a.hello()))
        var inbound = peer.inbound.makeAsyncIterator()
        var request: SyncRequest?
        while request == nil, let message = try await inbound.next() {
            if case .syncRequest(let pull) = message { request = pull }
        }
        let pull = try #require(request)
        let (busy, busySink) = AsyncStream.makeStream(of: Void.self)
        let release = DispatchSemaphore(value: 0)
        let worker = b.worker
        let holder = Task {
            try await worker.withStore { _ throws(ShoalError) in
                busySink.yield()
                release.wait()
            }
        }
        for await _ in busy { break }
        try await peer.write(.changeBatch(ChangeBatchMessage(requestID: pull.requestID, isLast: true, batch: answer[0])))
        // b's apply waits on its store, far past its keepalive interval: it says it is alive meanwhile. (Should it
        // not, the watchdog ends the wait and the test fails instead of hanging.)
        let watchdog = Task {
            try await Task.sleep(for: .seconds(20))
            peer.close()
        }
        defer { watchdog.cancel() }
        var heartbeats = 0
        while heartbeats < 3, let message = try await inbound.next() {
            if case .pong(0) = message { heartbeats += 1 }
        }
        #expect(heartbeats == 3)
        release.signal()
        try await holder.value
        var acknowledged = false
        while !acknowledged, let message = try await inbound.next() {
            if case .ack(let ack) = message { acknowledged = ack.requestID == pull.requestID }
        }
        #expect(acknowledged)
        let held = try await b.worker.withStore { store throws(ShoalError) in try store.execute("SELECT v FROM kv") }
        #expect(held.rows == [[.text("a")]])
        b.signals.yield(.shutdown)
        _ = try await run.value
    }

    @Test func aFailedApplyReachesThePeerAsItsReason() async throws {
        let directory = try temporaryDirectory("driver-refusal")
        defer { try? FileManager.default.removeItem(at: directory) }
        // B's clock is a day ahead: A refuses its changes, and B hears why (not just a closed connection).
        let a = try Side(directory, "a")
        let b = try Side(directory, "b")
        let ahead = try Store(
            path: directory.appendingPathComponent("b.db").path,
            options: {
                var options = StoreOptions()
                options.clock = ManualWallClock(milliseconds: SystemWallClock().nowMilliseconds() + 86_400_000)
                return options
            }()
        )
        try ahead.execute("INSERT INTO kv(k, v) VALUES ('future', 1)")
        _ = try await b.worker.changedElsewhere()
        let (left, right) = InMemoryMessageStream.pair()
        let runA = a.run(over: left)
        let runB = b.run(over: right)
        let outcomeA = try await runA.value
        let outcomeB = try await runB.value
        #expect(outcomeA.failedHere)
        #expect(outcomeA.error?.code == .clockTooFarAhead)
        #expect(outcomeB.refusal?.reason == .applyFailed)
        #expect(!outcomeB.healthy)
    }

    @Test func aSettledLinkSkipsPeriodicRoundsButNeverMoreThanTwentyNineInARow() {
        var link = SettledLink()
        func due() -> Bool { link.periodicRoundIsDue() }
        #expect(due())  // nothing known yet
        link.pullFinished(applied: 0)
        #expect(due())  // the peer has not acknowledged our vector yet
        link.acknowledged(level: true)
        let pattern = (0..<60).map { _ in due() }
        let skips = Array(repeating: false, count: SettledLink.maximumSkips)
        #expect(SettledLink.maximumSkips == 29)
        #expect(pattern == skips + [true] + skips + [true])
        // A commit here, a pull that brought something, a peer behind: each makes the next periodic round run.
        link.committed()
        #expect(due())
        link.pullFinished(applied: 0)
        link.acknowledged(level: true)
        #expect(!due())
        link.pullFinished(applied: 3)
        #expect(due())
        link.pullFinished(applied: 0)
        link.acknowledged(level: false)
        #expect(due())
    }

    @Test func onlyLongStretchesOnTheNodesRunningClockCountAsUnwatched() {
        // The loop saw no tick for 17 s, and the node's clock ran with real time: 16.9 s were not the peer's silence.
        #expect(ConnectionDriver.unwatched(real: .milliseconds(17_000), clock: 17_010, tick: 100) == 16_900)
        #expect(ConnectionDriver.unwatched(real: .milliseconds(1_050), clock: 1_050, tick: 100) == nil)
        // A clock a test moves by hand (or holds still) is the test's: its jumps are not corrected.
        #expect(ConnectionDriver.unwatched(real: .milliseconds(2_000), clock: 15_001, tick: 100) == nil)
        #expect(ConnectionDriver.unwatched(real: .milliseconds(17_000), clock: 0, tick: 100) == nil)
    }

    @Test func aSilentPeerTimesOutOnTheInjectedClock() async throws {
        let directory = try temporaryDirectory("driver-idle")
        defer { try? FileManager.default.removeItem(at: directory) }
        var a = try Side(directory, "a")
        let clock = ManualWallClock(milliseconds: 1_000_000)
        a.settings.clock = clock
        let (left, silent) = InMemoryMessageStream.pair()
        let run = a.run(over: left)
        // The silent end says hello (as another site) and then nothing at all.
        var hello = try await a.hello()
        hello.siteID = SiteID(high: 9, low: 9)
        try await silent.write(.hello(hello))
        #expect(await a.recorder.wait { if case .established = $0 { true } else { false } })
        clock.advance(by: Int64(a.settings.session.idleTimeout) + 1)
        let outcome = try await run.value
        #expect(outcome.error?.code == .timeout)
    }
    /// b announces a write while a pull under way on another of a's links (the test's word for it) brings it: a puts
    /// its own pull off. When that pull ends and did not bring it, a pulls (`.pullsEnded`); and a pull put off behind
    /// one that stopped moving is made all the same once ``ConnectionDriver/putOffLimitMilliseconds`` passed on a's
    /// clock (moved by hand here: nothing else makes it pull).
    @Test(arguments: [false, true])
    func aPullPutOffForAnotherLinksIsMadeWhenThatOneEndsOrAfterTheLimit(waitsForTheLimit: Bool) async throws {
        let directory = try temporaryDirectory("driver-put-off")
        defer { try? FileManager.default.removeItem(at: directory) }
        var a = try Side(directory, "a")
        let b = try Side(directory, "b")
        let clock = ManualWallClock(milliseconds: 1_000_000)
        a.settings.clock = clock
        let (left, right) = InMemoryMessageStream.pair()
        let runA = a.run(over: left)
        let runB = b.run(over: right)
        // Both empty: each side's one pull at the handshake ended, and the link is quiet (no answer under way brings
        // what b writes next).
        #expect(await a.recorder.wait { if case .roundFinished = $0 { true } else { false } })
        #expect(await b.recorder.wait { if case .roundFinished = $0 { true } else { false } })
        // From now on, another link's pull covers whatever b announces.
        a.recorder.coveringPullUnderWay.withLock { $0 = true }
        try await b.write("INSERT INTO kv(k, v) VALUES ('2', 'second')")
        b.signals.yield(.localChange)
        #expect(await a.recorder.wait { if case .putOff = $0 { true } else { false } })
        let lacking = try await a.worker.versionVector()
        #expect(try await !lacking.dominatesOrEquals(b.worker.versionVector()))
        if waitsForTheLimit {
            // The other pull never ends: a's clock passes the limit, and its next tick pulls.
            clock.advance(by: Int64(ConnectionDriver.putOffLimitMilliseconds))
        } else {
            // The other pull ended without bringing it.
            a.recorder.coveringPullUnderWay.withLock { $0 = false }
            a.signals.yield(.pullsEnded)
        }
        #expect(await a.recorder.wait { if case .pullStarting = $0 { true } else { false } })
        var converged = false
        for _ in 0..<50 where !converged {
            converged = try await a.worker.digest() == b.worker.digest()
            if !converged { _ = await a.recorder.wait(within: 0.5) { if case .roundFinished = $0 { true } else { false } } }
        }
        #expect(converged)
        #expect(try await a.worker.versionVector() == b.worker.versionVector())
        a.signals.yield(.shutdown)
        _ = try await runA.value
        _ = try await runB.value
    }
}
