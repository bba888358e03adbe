import Foundation
import ShoalTestSupport
import Testing

import ShoalDiscovery

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

/// Runs a command to completion and returns its standard output.
private func run(_ executable: String, _ arguments: [String]) throws -> String {
    try runProcess(URL(fileURLWithPath: executable), arguments).stdout
}

/// These need the Avahi daemon, which the test command starts: they fail, not skip, without it.
@Suite(.serialized) struct DiscoveryTests {
    private func mdnsNode(_ directory: URL, _ name: String, cluster: String) async throws -> RunningNode {
        try await startNode(in: directory, name: name) { configuration in
            configuration.mdns = true
            configuration.clusterID = cluster
            configuration.nodeName = name
        }
    }

    @Test func threeNodesWithNoPeersDiscoverEachOtherAndConverge() async throws {
        let directory = try temporaryDirectory("mdns3")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cluster = "mdns-\(UInt32.random(in: 0...UInt32.max))"
        let nodes = [
            try await mdnsNode(directory, "one", cluster: cluster),
            try await mdnsNode(directory, "two", cluster: cluster),
            try await mdnsNode(directory, "three", cluster: cluster),
        ]
        // Every node connects to both others (each pair once: the smaller site id dials).
        for node in nodes {
            for other in nodes where other.node.siteID != node.node.siteID {
                let site = other.node.siteID
                #expect(
                    await node.log.seen(within: 30) { if case .peerConnected(site, _, _) = $0 { true } else { false } }
                )
            }
        }
        for (index, node) in nodes.enumerated() {
            try await node.node.execute(
                "INSERT INTO kv(k, v) VALUES (?, ?)",
                [.text("from \(index)"), .integer(Int64(index))]
            )
        }
        #expect(try await converge(nodes[0], nodes[1], within: 30))
        #expect(try await converge(nodes[1], nodes[2], within: 30))
        #expect(try await converge(nodes[0], nodes[2], within: 30))
        for node in nodes {
            let unavailable = await node.log.events.contains {
                if case .discoveryUnavailable = $0 { true } else { false }
            }
            #expect(!unavailable, "mDNS unavailable: is avahi-daemon running? (Tools/start-daemons.sh)")
            let peers = await node.node.peerStatuses().filter(\.isConnected)
            #expect(peers.count == 2)
            #expect(peers.allSatisfy { $0.foundBy == .mdns || $0.foundBy == .inbound })
        }

        // avahi-browse lists every node with its TXT fields. It prints what it has resolved so far and exits,
        // so ask again (a bounded number of times) until all three are resolved.
        var listing = ""
        for _ in 0..<20 {
            listing = try run("/usr/bin/avahi-browse", ["-rpt", "_shoal._tcp"])
            if nodes.allSatisfy({ listing.contains("\"site=\($0.node.siteID.hex)\"") }) { break }
        }
        for node in nodes {
            #expect(listing.contains("\"site=\(node.node.siteID.hex)\""))
            // The cluster's hint, never its id in clear.
            #expect(listing.contains("\"hint=\(NodeConfiguration.plainHint(cluster))\""))
            #expect(!listing.contains(cluster))
        }
        for node in nodes { await node.stop() }
    }

    @Test func servicesOfOurClusterAreDialledAndOthersIgnored() async throws {
        let directory = try temporaryDirectory("mdnspub")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cluster = "mdns-\(UInt32.random(in: 0...UInt32.max))"
        let node = try await mdnsNode(directory, "watcher", cluster: cluster)
        // A site id larger than any real one: the watcher, the smaller, is the side that dials.
        let ours = SiteID(high: .max, low: .max - 1)
        let theirs = SiteID(high: .max, low: .max)
        func publish(_ site: SiteID, cluster: String) throws -> Process {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/avahi-publish")
            process.arguments = [
                "-s", "fake \(site.hex.suffix(4))", "_shoal._tcp", "9", "site=\(site.hex)",
                "hint=\(NodeConfiguration.plainHint(cluster))", "proto=1",
            ]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            return process
        }
        let other = try publish(theirs, cluster: "somebody-else")
        let same = try publish(ours, cluster: cluster)
        defer {
            // avahi-publish may inherit an ignored SIGTERM: stop it for sure.
            for process in [other, same] {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
        }
        #expect(
            await node.log.seen(within: 30) {
                if case .peerDiscovered(let site, _) = $0 { site == ours } else { false }
            }
        )
        let events = await node.log.events
        #expect(!events.contains { if case .peerDiscovered(let site, _) = $0 { site == theirs } else { false } })
        await node.stop()
    }

    @Test func aNodeThatLeavesIsDroppedAndCatchesUpWhenItReturns() async throws {
        let directory = try temporaryDirectory("mdnsback")
        defer { try? FileManager.default.removeItem(at: directory) }
        let cluster = "mdns-\(UInt32.random(in: 0...UInt32.max))"
        let a = try await mdnsNode(directory, "stays", cluster: cluster)
        var b = try await mdnsNode(directory, "leaves", cluster: cluster)
        let siteB = b.node.siteID
        #expect(
            await a.log.seen(within: 30) {
                if case .peerConnected(let site, _, _) = $0 { site == siteB } else { false }
            }
        )
        await b.stop()
        #expect(
            await a.log.seen(within: 30) {
                if case .peerDisconnected(let site, _) = $0 { site == siteB } else { false }
            }
        )
        #expect(await a.node.peerStatuses().filter(\.isConnected).isEmpty)

        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('while away', 1)")
        b = try await mdnsNode(directory, "leaves", cluster: cluster)
        #expect(b.node.siteID == siteB)
        let converged = try await converge(a, b, within: 30)
        if !converged {
            print("a (\(a.node.siteID.hex.prefix(8))) saw: \(await a.log.events)")
            print("b (\(siteB.hex.prefix(8))) saw: \(await b.log.events)")
        }
        #expect(converged)
        #expect(await a.node.peerStatuses().filter(\.isConnected).count == 1)
        await b.stop()
        await a.stop()
    }

    @Test func withoutTheSystemBusANodeSaysDiscoveryIsOffOnceAndSyncsOverAStaticPeer() async throws {
        let directory = try temporaryDirectory("nobus")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        try await a.node.execute("INSERT INTO kv(k, v) VALUES ('from a', 1)")
        let path = directory.appendingPathComponent("b.db").path
        let siteB: SiteID
        do {
            let store = try Store(path: path)
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v, n INTEGER DEFAULT 0)")
            try store.replicate(table: "kv", counters: ["n"])
            try store.execute("INSERT INTO kv(k, v) VALUES ('from b', 2)")
            siteB = store.siteID
        }
        // b runs as a process whose system bus address leads nowhere: to it, D-Bus (and so Avahi) is not running.
        let process = Process()
        process.executableURL = try shoalExecutable()
        process.arguments = [
            // The node in this process runs without TLS (transport tests), so this one does too.
            "serve", "--db", path, "--insecure-plaintext", "--cluster", "test", "--listen", "127.0.0.1:0",
            "--peer", "127.0.0.1:\(a.port)",
            "--no-remembered",
        ]
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = "unix:path=\(directory.path)/no-bus"
        process.environment = environment
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let synced = await a.log.seen(within: 30) {
            if case .roundFinished(let peer, let applied) = $0 { peer == siteB && applied > 0 } else { false }
        }
        #expect(synced)
        #expect(try await a.node.execute("SELECT v FROM kv WHERE k = 'from b'").rows == [[.integer(2)]])
        let pushed = await a.log.seen(within: 30) {
            if case .peerConnected(let peer, _, _) = $0 { peer == siteB } else { false }
        }
        #expect(pushed)
        // And b holds a's row once it acknowledges it (acknowledgements come with finished rounds).
        var acknowledged = false
        for _ in 0..<60 where !acknowledged {
            acknowledged = await a.node.pendingLocalChanges() == 0
            if !acknowledged {
                _ = await a.log.next(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
            }
        }
        #expect(acknowledged)
        process.terminate()
        let log = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let off = log.split(separator: "\n").filter { $0.contains("mDNS discovery is off") }
        #expect(off.count == 1, "\(log)")
        #expect(off.first?.contains("the system D-Bus is not running") == true, "\(log)")
        #expect(off.first?.contains("--peer") == true, "\(log)")
        #expect(log.contains("changes from \(a.node.siteID.hex.prefix(8))"), "\(log)")
        await a.stop()
    }

    @Test func aNodeWhoseNameIsTakenSaysWhyDiscoveryIsOff() async throws {
        let directory = try temporaryDirectory("mdnsname")
        defer { try? FileManager.default.removeItem(at: directory) }
        let site = try Store(path: directory.appendingPathComponent("copy.db").path).siteID
        let port = try await freePort()
        // Something else already announces the name this node would take: what a copied database running on
        // another machine, on the same port, looks like.
        let squatter = Process()
        squatter.executableURL = URL(fileURLWithPath: "/usr/bin/avahi-publish")
        squatter.arguments = [
            "-s", "copy \(site.hex.prefix(12)) \(port)", "_shoal._tcp", "\(port)", "site=\(site.hex)",
        ]
        let announced = Pipe()
        squatter.standardOutput = FileHandle.nullDevice
        squatter.standardError = announced
        try squatter.run()
        defer {
            kill(squatter.processIdentifier, SIGKILL)
            squatter.waitUntilExit()
        }
        // avahi-publish says "Established under name …" once the name is its own.
        var said = ""
        while !said.contains("Established") {
            let chunk = announced.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            said += String(decoding: chunk, as: UTF8.self)
        }
        #expect(said.contains("Established"), "\(said)")
        let node = try await startNode(in: directory, name: "copy") { configuration in
            configuration.mdns = true
            configuration.nodeName = "copy"
            configuration.listenPort = port
        }
        let off = await node.log.seen(within: 30) {
            if case .discoveryUnavailable(let reason) = $0 { reason.contains("copy of this database") } else { false }
        }
        let events = await node.log.events
        #expect(off, "\(events)")
        await node.stop()
    }
}
