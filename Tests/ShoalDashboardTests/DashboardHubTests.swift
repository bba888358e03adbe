import Logging
import Testing

@testable import ShoalDashboard

@Suite struct DashboardHubTests {
    private func state(_ title: String) -> DashboardState {
        DashboardState(title: title, mode: "demo", controls: false)
    }

    /// The next `count` events a subscription yields.
    private func take(_ count: Int, from stream: AsyncStream<DashboardEvent>) async -> [DashboardEvent] {
        var taken: [DashboardEvent] = []
        for await event in stream {
            taken.append(event)
            if taken.count == count { break }
        }
        return taken
    }

    @Test func numbersEachNewStateAndSkipsRepeats() async {
        let hub = DashboardHub()
        hub.publish(state("a"))
        hub.publish(state("a"))
        hub.publish(state("b"))
        let events = await take(2, from: hub.subscribe(after: 0))
        #expect(events.map(\.id) == [1, 2])
        #expect(events[1].data.contains("\"title\":\"b\""))
        #expect(events[0].wire.hasPrefix("id: 1\nevent: state\ndata: {"))
        #expect(events[0].wire.hasSuffix("\n\n"))
    }

    @Test func resumesAfterTheLastEventID() async {
        let hub = DashboardHub()
        for title in ["a", "b", "c", "d"] { hub.publish(state(title)) }
        let resumed = hub.subscribe(after: 2)
        hub.publish(state("e"))
        let events = await take(3, from: resumed)
        #expect(events.map(\.id) == [3, 4, 5])
    }

    @Test func aFreshOrUnknownSubscriberGetsTheLatestStateOnly() async {
        let hub = DashboardHub()
        for index in 0..<(DashboardHub.keptEvents + 10) { hub.publish(state("s\(index)")) }
        let latest = UInt64(DashboardHub.keptEvents + 10)
        #expect(await take(1, from: hub.subscribe(after: nil)).map(\.id) == [latest])
        // Older than those kept, or from another run of the server (ahead of this one's ids).
        #expect(await take(1, from: hub.subscribe(after: 1)).map(\.id) == [latest])
        #expect(await take(1, from: hub.subscribe(after: latest + 100)).map(\.id) == [latest])
        // The largest id a header can carry (once an overflow that stopped the process).
        #expect(await take(1, from: hub.subscribe(after: .max)).map(\.id) == [latest])
    }

    @Test func percentilesAreNearestRank() {
        var samples = LatencySamples(capacity: 100)
        #expect(samples.summary == DashboardState.Latency(samples: 0))
        for value in 1...100 { samples.add(Double(value)) }
        #expect(samples.percentile(0.5) == 50)
        #expect(samples.percentile(0.95) == 95)
        samples.add(1_000)  // replaces the oldest (1)
        #expect(samples.count == 100)
        #expect(samples.percentile(1) == 1_000)
        #expect(samples.percentile(0) == 2)
    }

    @Test func refusesToListenBeyondLoopbackWithoutAToken() async {
        #expect(DashboardServer.isLoopback("127.0.0.1"))
        #expect(DashboardServer.isLoopback("::1"))
        #expect(DashboardServer.isLoopback("127.4.5.6") && DashboardServer.isLoopback("[::1]"))
        #expect(!DashboardServer.isLoopback("0.0.0.0"))
        // A name that only starts like a loopback address may resolve anywhere.
        #expect(!DashboardServer.isLoopback("127.0.0.1.nip.io") && !DashboardServer.isLoopback("127.example.com"))
        #expect(!DashboardServer.isLoopback("localhost.example.com") && !DashboardServer.isLoopback("2130706433"))
        #expect(DashboardServer.hostName(ofHeader: "127.0.0.1:8080") == "127.0.0.1")
        #expect(DashboardServer.hostName(ofHeader: "[::1]:8080") == "[::1]")
        #expect(DashboardServer.hostName(ofHeader: "evil.example:8080") == "evil.example")
        let server = DashboardServer(host: "0.0.0.0", port: 0, hub: DashboardHub(), logger: Logger(label: "test"))
        await #expect(throws: DashboardServerError.self) { try await server.run() }
    }
}
