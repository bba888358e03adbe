import Testing

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalWire

/// Two sessions over real stores, messages carried in memory: the protocol logic end to end, no sockets.
private final class Endpoint {
    let store: Store
    var session: SyncSession
    var outbox: [WireMessage] = []
    var closed: ShoalError?
    var acknowledged: [Ack] = []

    init(store: Store) throws {
        self.store = store
        let hello = Hello(
            clusterID: "test",
            siteID: store.siteID,
            nodeName: "n",
            schemaFingerprint: try store.schemaFingerprint(),
            listenPort: 0
        )
        session = SyncSession(local: hello, now: 0)
        perform(session.start())
    }

    func perform(_ actions: [SyncSession.Action]) {
        for action in actions {
            do {
                switch action {
                case .send(let message):
                    outbox.append(message)
                case .established, .roundFinished, .peerRefused:
                    break
                case .serve(let request):
                    let batches = try store.changes(since: request.versionVector, maxChangesPerBatch: 3)
                    outbox += SyncSession.batches(for: request, batches)
                    if !(try store.versionVector().dominatesOrEquals(request.versionVector)) {
                        perform(session.startRound(versionVector: try store.versionVector(), now: 0))
                    }
                case .apply(let message):
                    try store.apply(message.batch.changes, claim: message.batch.claim)
                    perform(session.applied(message, versionVector: try store.versionVector(), digest: nil, now: 0))
                case .wantRound:
                    perform(session.startRound(versionVector: try store.versionVector(), now: 0))
                case .peerAcknowledged(let ack):
                    acknowledged.append(ack)
                case .close(let error):
                    closed = error
                }
            } catch {
                perform(session.fail(error))
            }
        }
    }
}

/// Delivers messages both ways until both outboxes are empty.
private func run(_ a: Endpoint, _ b: Endpoint) {
    while !a.outbox.isEmpty || !b.outbox.isEmpty {
        let fromA = a.outbox
        a.outbox = []
        for message in fromA { b.perform(b.session.receive(message, now: 0)) }
        let fromB = b.outbox
        b.outbox = []
        for message in fromB { a.perform(a.session.receive(message, now: 0)) }
    }
}

@Suite struct SessionExchangeTests {
    @Test func oneRoundSyncsBothDirectionsInBatches() throws {
        let storeA = try makeStore()
        let storeB = try makeStore()
        try makeItems(storeA)
        try makeItems(storeB)
        try storeA.execute("INSERT INTO items(id, name) VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
        try storeB.execute("INSERT INTO items(id, name, hits) VALUES (10, 'x', 1)")
        try storeB.execute("UPDATE items SET hits = hits + 1 WHERE id = 10")
        let a = try Endpoint(store: storeA)
        let b = try Endpoint(store: storeB)
        run(a, b)
        #expect(a.closed == nil && b.closed == nil)
        #expect(try storeA.digest() == storeB.digest())
        #expect(try storeA.versionVector() == storeB.versionVector())
        #expect(!a.acknowledged.isEmpty && !b.acknowledged.isEmpty)

        // A later write flows on the next round (started by the writer: the other side pulls back because
        // the request shows it lacks something).
        try storeA.execute("DELETE FROM items WHERE id = 2")
        a.perform(a.session.startRound(versionVector: try storeA.versionVector(), now: 0))
        run(a, b)
        #expect(try storeA.digest() == storeB.digest())
        #expect(try rows(storeB, "SELECT count(*) FROM items") == [[.integer(4)]])
    }

    @Test func differentSchemasAreRefusedAtHello() throws {
        let storeA = try makeStore()
        let storeB = try makeStore()
        try makeItems(storeA)
        let a = try Endpoint(store: storeA)
        let b = try Endpoint(store: storeB)
        run(a, b)
        #expect(a.closed?.code == .unsupportedSchema || a.closed?.code == .rejected)
        #expect(b.closed != nil)
    }
}
