import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import ShoalCore
@testable import ShoalDiscovery

/// The next event matching `matches`, or `nil` after `seconds` (a deadline; the wait is on the stream).
func nextEvent(
    _ discovery: MDNSDiscovery,
    within seconds: Double,
    _ matches: @escaping @Sendable (DiscoveryEvent) -> Bool
) async -> DiscoveryEvent? {
    await withTaskGroup(of: DiscoveryEvent?.self) { group in
        group.addTask {
            for await event in discovery.events where matches(event) { return event }
            return nil
        }
        group.addTask {
            try? await Task.sleep(for: .milliseconds(Int(seconds * 1000)))
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

@Suite(.serialized) struct MDNSDiscoveryTests {
    @Test func twoNodesOnLoopbackFindEachOtherWithTheirTXTRecords() async throws {
        let siteA = SiteID.random()
        let siteB = SiteID.random()
        let a = MDNSDiscovery(
            instanceName: "test-a \(siteA.hex.prefix(12))",
            port: 40_001,
            txt: ["site": siteA.hex, "hint": "t", "proto": "1"],
            interface: "lo"
        )
        let b = MDNSDiscovery(
            instanceName: "test-b \(siteB.hex.prefix(12))",
            port: 40_002,
            txt: ["site": siteB.hex, "hint": "t", "proto": "1"],
            interface: "lo"
        )
        try a.start()
        try b.start()
        defer {
            a.stop()
            b.stop()
        }
        let found = await nextEvent(a, within: 20) { event in
            if case .found(let service) = event { return service.siteID == siteB } else { return false }
        }
        guard case .found(let service) = found else {
            Issue.record("node a did not discover node b")
            return
        }
        #expect(service.host == "127.0.0.1" && service.port == 40_002)
        #expect(service.clusterHint == "t" && service.protocolVersion == "1")
        #expect(service.instance == "test-b \(siteB.hex.prefix(12))")

        // avahi-browse, an independent client of the daemon, lists it with its TXT fields. It can wait on a
        // resolution that never ends (another service that just went away): each try is ended after 15 s, and it is
        // asked again a bounded number of times.
        var listing = ""
        for _ in 0..<5 where !listing.contains("site=\(siteB.hex)") {
            listing = try await browse(within: 15)
        }
        #expect(listing.contains("site=\(siteB.hex)"))

        // When b leaves, a hears about it.
        b.stop()
        let lost = await nextEvent(a, within: 20) { event in
            if case .lost(let instance) = event { return instance.contains(siteB.hex.prefix(12)) } else { return false }
        }
        #expect(lost != nil)
    }

    @Test func asAServiceItAnnouncesUntilItsGroupShutsDownThenWithdraws() async throws {
        let watcherSite = SiteID.random()
        let serviceSite = SiteID.random()
        let watcher = MDNSDiscovery(
            instanceName: "watcher \(watcherSite.hex.prefix(12))",
            port: 40_003,
            txt: ["site": watcherSite.hex, "hint": "s", "proto": "1"],
            interface: "lo"
        )
        try watcher.start()
        defer { watcher.stop() }
        let service = MDNSDiscovery(
            instanceName: "service \(serviceSite.hex.prefix(12))",
            port: 40_004,
            txt: ["site": serviceSite.hex, "hint": "s", "proto": "1"],
            interface: "lo"
        )
        let group = ServiceGroup(
            configuration: .init(services: [service], logger: Logger(label: "test"))
        )
        let running = Task { try await group.run() }
        let found = await nextEvent(watcher, within: 20) { event in
            if case .found(let found) = event { found.siteID == serviceSite } else { false }
        }
        #expect(found != nil)
        await group.triggerGracefulShutdown()
        try await running.value
        let lost = await nextEvent(watcher, within: 20) { event in
            if case .lost(let instance) = event { instance.contains(serviceSite.hex.prefix(12)) } else { false }
        }
        #expect(lost != nil)
    }

    @Test func theInterfaceOfAListeningAddressIsTheOneThatHoldsIt() {
        #expect(MDNSDiscovery.interfaceName(owning: "127.0.0.1") == "lo")
        #expect(MDNSDiscovery.interfaceName(owning: "::1") == "lo")
        #expect(MDNSDiscovery.interfaceName(owning: "localhost") == "lo")
        #expect(MDNSDiscovery.interfaceName(owning: "0.0.0.0") == nil)
        #expect(MDNSDiscovery.interfaceName(owning: "::") == nil)
        #expect(MDNSDiscovery.interfaceName(owning: "192.0.2.77") == nil)  // documentation range: held by none
        #expect(MDNSDiscovery.interfaceName(owning: "not an address") == nil)
    }
}

/// What `avahi-browse -rpt` lists, ending it after `seconds` (its output so far is kept), off the cooperative pool.
private func browse(within seconds: Double) async throws -> String {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            let browse = Process()
            browse.executableURL = URL(fileURLWithPath: "/usr/bin/avahi-browse")
            browse.arguments = ["-rpt", MDNSDiscovery.serviceType]
            let output = Pipe()
            browse.standardOutput = output
            do {
                try browse.run()
            } catch {
                continuation.resume(throwing: error)
                return
            }
            // SIGKILL: avahi-browse waiting on a resolution does not stop on SIGTERM.
            let watchdog = DispatchWorkItem { if browse.isRunning { kill(browse.processIdentifier, SIGKILL) } }
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: watchdog)
            let listing = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            browse.waitUntilExit()
            watchdog.cancel()
            continuation.resume(returning: listing)
        }
    }
}
