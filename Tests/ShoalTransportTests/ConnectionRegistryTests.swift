import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalProtocol
@testable import ShoalTransport

private let small = SiteID(high: 1, low: 0)
private let large = SiteID(high: 2, low: 0)

private func inbox() -> (AsyncStream<ConnectionEvent>, AsyncStream<ConnectionEvent>.Continuation) {
    AsyncStream.makeStream(of: ConnectionEvent.self)
}

private func id(_ registration: ConnectionRegistry.Registration) -> Int? {
    if case .admitted(let id, _) = registration { id } else { nil }
}

/// Who may connect and which duplicate survives: the registry's rules, with no socket.
@Suite struct ConnectionRegistryTests {
    @Test func handshakingConnectionsHaveABoundedPoolWithACapPerAddress() {
        var registry = ConnectionRegistry(
            localSite: small,
            limits: .init(maximumConnections: 64, maximumPending: 3, maximumPendingPerAddress: 2)
        )
        #expect(id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1)) != nil)
        #expect(id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1)) != nil)
        guard case .refused(let perAddress) = registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1)
        else {
            Issue.record("a third connection from one address was admitted")
            return
        }
        #expect(perAddress.reason == .tooManyConnections && perAddress.message.contains("127.0.0.2"))
        #expect(id(registry.register(dialed: false, remoteIP: "127.0.0.3", inbox: inbox().1)) != nil)
        // The pool is full; another address with as many as the newcomer's would have gets nothing.
        guard case .refused = registry.register(dialed: false, remoteIP: "127.0.0.3", inbox: inbox().1) else {
            Issue.record("the pool held more than its maximum")
            return
        }
        // Dialled connections are not counted against the inbound pool.
        #expect(id(registry.register(dialed: true, remoteIP: "127.0.0.9", inbox: inbox().1)) != nil)
        #expect(registry.pendingHighWater["127.0.0.2"] == 2)
    }

    @Test func aFullPoolMakesRoomForANewAddressAtTheExpenseOfTheBusiestOne() async {
        var registry = ConnectionRegistry(
            localSite: small,
            limits: .init(maximumConnections: 64, maximumPending: 4, maximumPendingPerAddress: 2)
        )
        // Two flooding addresses fill the pool, two handshakes each.
        let (oldestEvents, oldest) = inbox()
        let first = id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: oldest))!
        _ = registry.register(dialed: false, remoteIP: "127.0.0.3", inbox: inbox().1)
        _ = registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1)
        _ = registry.register(dialed: false, remoteIP: "127.0.0.3", inbox: inbox().1)
        // A peer from a third address gets in: the oldest handshake of a busiest address is told to close.
        guard case .admitted(let peer, let evicting?) = registry.register(
            dialed: false,
            remoteIP: "127.0.0.9",
            inbox: inbox().1
        ) else {
            Issue.record("a newcomer from a new address was kept out of a pool full of floods")
            return
        }
        evicting.yield(.shutdown)
        evicting.finish()
        var events = oldestEvents.makeAsyncIterator()
        if case .shutdown = await events.next() {} else { Issue.record("the oldest handshake was not the one told") }
        // The evicted one cannot get in after all, even if its hello was on its way; the newcomer can.
        #expect(registry.establish(first, peer: large).admission == .full)
        #expect(registry.establish(peer, peer: large).admission == .accepted)
        // A flooding address with as many as any other cannot push others out in turn.
        guard case .admitted(_, nil) = registry.register(dialed: false, remoteIP: "127.0.0.4", inbox: inbox().1)
        else {
            Issue.record("room was not free after the newcomer's handshake")
            return
        }
        guard case .refused = registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1) else {
            Issue.record("a flooding address took another's place")
            return
        }
    }

    @Test func aFinishedHandshakeLeavesThePendingPool() {
        var registry = ConnectionRegistry(
            localSite: small,
            limits: .init(maximumConnections: 64, maximumPending: 1, maximumPendingPerAddress: 1)
        )
        let first = id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1))!
        #expect(registry.establish(first, peer: large).admission == .accepted)
        #expect(id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: inbox().1)) != nil)
        #expect(registry.isConnected(large))
    }

    @Test func ofTwoConnectionsWithOnePeerTheOneDialledBySmallerSiteStays() async {
        // This node has the smaller site id: its dialled connection wins, whichever finished its hello first.
        var registry = ConnectionRegistry(localSite: small, limits: .init())
        let (olderEvents, older) = inbox()
        let inbound = id(registry.register(dialed: false, remoteIP: "127.0.0.2", inbox: older))!
        #expect(registry.establish(inbound, peer: large).admission == .accepted)
        let dialled = id(registry.register(dialed: true, remoteIP: "127.0.0.2", inbox: inbox().1))!
        let (admission, evicted) = registry.establish(dialled, peer: large)
        #expect(admission == .accepted)
        // The older connection's inbox is the one handed back, to be told it lost.
        evicted?.yield(.duplicate)
        older.finish()
        var told: [ConnectionEvent] = []
        for await event in olderEvents { told.append(event) }
        #expect(told.count == 1)
        #expect(registry.entries[inbound]?.peer == nil && registry.entries[dialled]?.peer == large)

        // Seen from the other side (larger site id), the inbound one is the keeper and a dialled one loses.
        var other = ConnectionRegistry(localSite: large, limits: .init())
        let kept = id(other.register(dialed: false, remoteIP: "127.0.0.1", inbox: inbox().1))!
        #expect(other.establish(kept, peer: small).admission == .accepted)
        let losing = id(other.register(dialed: true, remoteIP: "127.0.0.1", inbox: inbox().1))!
        #expect(other.establish(losing, peer: small).admission == .duplicate)
    }

    @Test func establishedConnectionsAreCapped() {
        var registry = ConnectionRegistry(localSite: small, limits: .init(maximumConnections: 1))
        let first = id(registry.register(dialed: true, remoteIP: nil, inbox: inbox().1))!
        #expect(registry.establish(first, peer: large).admission == .accepted)
        let second = id(registry.register(dialed: true, remoteIP: nil, inbox: inbox().1))!
        #expect(registry.establish(second, peer: SiteID(high: 3, low: 0)).admission == .full)
        #expect(registry.remove(first)?.peer == large)
        #expect(!registry.isConnected(large))
    }
}
