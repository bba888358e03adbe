import Foundation
import ShoalTestSupport
import Testing

/// Runs `shoal` (outside the hosts: the databases are plain files both sides can reach) and returns its output.
@discardableResult
private func shoal(_ arguments: [String]) throws -> String {
    let result = try ShoalTestSupport.shoal(arguments: arguments)
    guard result.status == 0 else {
        throw HostError(message: "shoal \(arguments.joined(separator: " ")) exited \(result.status): \(result.stderr)")
    }
    return result.stdout
}

/// The last line of a command's output.
private func lastLine(_ output: String) -> String {
    output.split(separator: "\n").last.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
}

/// A database with a replicated `notes` table holding `rows` notes keyed "<prefix>-<n>"; returns its site id.
private func makeDatabase(_ path: String, name: String, rows: Int) throws -> String {
    let site = try shoal(["init", "--db", path, "--name", name]).trimmingCharacters(in: .whitespacesAndNewlines)
    try shoal(["sql", "--db", path, "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)"])
    try shoal(["replicate", "--db", path, "notes"])
    try shoal([
        "sql", "--db", path,
        """
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(rows))
        INSERT INTO notes (id, body) SELECT '\(name)-' || i, 'written on \(name)' FROM n
        """,
    ])
    return site
}

/// The Python interpreter itself (not a wrapper script, so a signal reaches it): the one the test command
/// installed zeroconf into.
private let python: String = {
    let found = try? runProcess(
        URL(fileURLWithPath: "/usr/bin/env"),
        ["python3", "-c", "import sys; print(sys.executable)"]
    )
    return (found?.stdout ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
}()

/// Two real hosts as far as mDNS can tell: network namespaces joined by a veth link, each with its own D-Bus
/// and Avahi daemon (Tools/netns.sh). Needs root to create them; the README's test command runs as root.
@Suite(
    .serialized,
    .enabled(if: canCreateNetworkNamespaces, "this machine does not allow network namespaces (needs root)")
)
struct TwoHostsTests {
    @Test func nodesOnTwoHostsDiscoverEachOtherOverTheLinkAndConverge() async throws {
        let hosts = try HostPair("conv")
        defer { hosts.down() }
        let a = hosts.directory.appendingPathComponent("a.db").path
        let b = hosts.directory.appendingPathComponent("b.db").path
        let siteA = try makeDatabase(a, name: "host-a", rows: 20)
        let siteB = try makeDatabase(b, name: "host-b", rows: 1)
        // Host b's system resolver knows no `.local` names (no nss-mdns): discovery must not need it.
        let nsswitch = hosts.directory.appendingPathComponent("nsswitch.conf").path
        try "hosts: files\n".write(toFile: nsswitch, atomically: true, encoding: .utf8)
        #expect(try hosts.run(.b, ["mount", "--bind", nsswitch, "/etc/nsswitch.conf"]).status == 0)
        let nodeA = try await hosts.serve(.a, database: a, name: "host-a")
        defer { nodeA.stop() }
        #expect(try hosts.run(.b, ["getent", "hosts", "\(hosts.prefix)-a.local"]).status != 0)
        // Host b joins host a's cluster with an invite code, across the link.
        let code = try lastLine(shoal(["invite", "--db", a]))
        let joined = try hosts.run(
            .b,
            [shoalExecutable().path, "join", code, "--db", b, "--peer", "\(HostPair.Host.a.address):7400"]
        )
        #expect(joined.status == 0, "\(joined.output)\n\(nodeA.output)")
        let started = ContinuousClock.now
        let nodeB = try await hosts.serve(.b, database: b, name: "host-b")
        defer { nodeB.stop() }

        // No address was given to either: each finds the other by mDNS, over the veth link.
        #expect(await nodeB.line(within: 30) { $0.contains("found \(siteA.prefix(8)) at") } != nil, "\(nodeB.output)")
        #expect(await nodeA.line(within: 30) { $0.contains("found \(siteB.prefix(8)) at") } != nil, "\(nodeA.output)")
        // a's 20 notes (and the roster row that admitted b, if b has not had it from a's answer to the join).
        let synced = await nodeB.line(within: 30) { $0.contains("changes from \(siteA.prefix(8))") }
        #expect(synced != nil, "\(nodeB.output)")
        print("second node to its first sync across the link: \(ContinuousClock.now - started)")
        // b's note, and the roster rows b wrote when it joined.
        #expect(await nodeA.line(within: 30) { $0.contains("changes from \(siteB.prefix(8))") } != nil)
        #expect(try shoal(["digest", "--db", a]) == shoal(["digest", "--db", b]))

        // `shoal status` names the peer, how it was found and its addresses: the advertised host name and the IP.
        // The running node rewrites its status file four times a second: ask again (bounded) until it shows the peer.
        var status = ""
        let deadline = ContinuousClock.now + .seconds(10)
        repeat {
            status = try shoal(["status", "--db", b])
        } while !status.contains(": live,") && ContinuousClock.now < deadline
        let peerLine = status.split(separator: "\n").first { $0.contains("host-a") }.map(String.init) ?? ""
        #expect(peerLine.contains("(mdns)") || peerLine.contains("(inbound)"), "\(status)")
        #expect(peerLine.contains("\(HostPair.Host.a.address):7400"), "\(status)")
        #expect(peerLine.contains(": live,"), "\(status)")

        // Seen over IPv4 and IPv6 and by both sides at once, the pair still keeps one TCP connection.
        let sockets = try hosts.run(.b, ["ss", "-Htn", "state", "established"]).output
        let toA = sockets.split(separator: "\n").filter { $0.contains(HostPair.Host.a.address) }
        #expect(toA.count == 1, "\(sockets)")
    }

    @Test func zeroconfSeesANodeWithItsTXTRecord() async throws {
        let hosts = try HostPair("zcsee")
        defer { hosts.down() }
        let a = hosts.directory.appendingPathComponent("a.db").path
        let siteA = try makeDatabase(a, name: "host-a", rows: 1)
        let node = try await hosts.serve(.a, database: a, name: "host-a")
        defer { node.stop() }
        let identity = try shoal(["id", "--db", a])
        let cluster = identity.split(separator: "\n").first { $0.hasPrefix("cluster: ") }.map { String($0.dropFirst(9)) }
        let nodeID = lastLine(identity).replacingOccurrences(of: "-", with: "")
        let probe = repositoryRoot.appendingPathComponent("Tools/zeroconf-probe.py").path
        let (status, output) = try hosts.run(
            .b,
            [python, probe, "browse", "--interface", HostPair.Host.b.address, "--site", siteA]
        )
        #expect(status == 0, "\(output)")
        let service = try ZeroconfService(probeOutput: output)
        #expect(service.txt["site"] == siteA)
        // The node id, and a keyed hint of the cluster: never the cluster id in clear.
        #expect(service.txt["node"] == nodeID)
        #expect(service.txt["hint"]?.count == 16)
        #expect(service.txt["cluster"] == nil)
        #expect(cluster?.count == 32)
        #expect(!service.txt.values.contains { value in cluster.map { value.contains($0.prefix(8)) } ?? true }, "\(service.txt)")
        #expect(service.txt["proto"] == "10")  // the newest wire protocol version (10: columns hashed by name)
        #expect(service.port == 7400)
        #expect(service.addresses.contains(HostPair.Host.a.address))
        #expect(service.instance.contains("host-a"))
    }

    @Test func aSpoofedRecordWithOurHintIsDialledButGetsNoDataAndOtherHintsAreIgnored() async throws {
        let hosts = try HostPair("zcpub")
        defer { hosts.down() }
        let a = hosts.directory.appendingPathComponent("a.db").path
        let siteA = try makeDatabase(a, name: "host-a", rows: 1)
        let node = try await hosts.serve(.a, database: a, name: "host-a")
        defer { node.stop() }
        let probe = repositoryRoot.appendingPathComponent("Tools/zeroconf-probe.py").path
        // An attacker on the link copies the hint the node announces (mDNS is public) into records of its own.
        let (browsed, seen) = try hosts.run(
            .b,
            [python, probe, "browse", "--interface", HostPair.Host.b.address, "--site", siteA]
        )
        #expect(browsed == 0, "\(seen)")
        let hint = try ZeroconfService(probeOutput: seen).txt["hint"] ?? ""
        #expect(hint.count == 16)
        let theirs = String(repeating: "e", count: 32)
        let spoof = String(repeating: "d", count: 32)
        // The other cluster's service is published first, so the node sees it before the spoof.
        let publisher = try hosts.spawn(
            .b,
            [
                python, probe, "publish", "--interface", HostPair.Host.b.address,
                "--service", "\(theirs):0123456789abcdef", "--service", "\(spoof):\(hint)",
            ]
        )
        defer { publisher.stop() }
        // mDNS is only a hint: the node dials the spoof, and all it sends is the start of a TLS handshake (22), which
        // the spoof cannot finish without a key on the roster.
        #expect(await publisher.line(within: 30) { $0 == "dialled \(spoof)" } != nil, "\(publisher.output)")
        let received = await publisher.line(within: 30) { $0.hasPrefix("received \(spoof) ") }
        #expect(received?.hasSuffix(" 22") == true, "\(publisher.output)")
        #expect(await node.line(within: 30) { $0.contains("found \(spoof.prefix(8)) at") } != nil, "\(node.output)")
        #expect(!node.output.contains(theirs.prefix(8)), "\(node.output)")
        #expect(!publisher.output.contains("dialled \(theirs)"), "\(publisher.output)")

        // Status lists the spoof as found by mDNS and failing, never live; the other cluster's not at all.
        var status = ""
        let deadline = ContinuousClock.now + .seconds(10)
        repeat {
            status = try shoal(["status", "--db", a])
        } while !status.contains("failing") && ContinuousClock.now < deadline
        let peerLine = status.split(separator: "\n").first { $0.contains(spoof.prefix(8)) }.map(String.init) ?? ""
        #expect(peerLine.contains("(mdns)") && peerLine.contains("failing: "), "\(status)")
        #expect(!peerLine.contains(": live,"), "\(status)")
        #expect(!status.contains(theirs.prefix(8)), "\(status)")
    }

    @Test func withAvahiStoppedANodeSaysDiscoveryIsOffOnceSyncsOverAStaticPeerAndResumesWhenAvahiDoes() async throws {
        let hosts = try HostPair("noavahi")
        defer { hosts.down() }
        let a = hosts.directory.appendingPathComponent("a.db").path
        let b = hosts.directory.appendingPathComponent("b.db").path
        let siteA = try makeDatabase(a, name: "host-a", rows: 5)
        _ = try makeDatabase(b, name: "host-b", rows: 1)
        try shoal(["join", lastLine(shoal(["invite", "--db", a])), "--db", b, "--member-db", a])
        let nodeA = try await hosts.serve(.a, database: a, name: "host-a")
        defer { nodeA.stop() }
        // Stop host b's Avahi daemon (its D-Bus stays up): `-k` returns once the daemon has been signalled, and
        // `-c` says whether one still runs.
        try hosts.run(.b, ["avahi-daemon", "-k"])
        var stopped = false
        for _ in 0..<100 where !stopped {
            stopped = try hosts.run(.b, ["avahi-daemon", "-c"]).status != 0
        }
        #expect(stopped, "host b's avahi-daemon is still running")

        let nodeB = try await hosts.serve(
            .b,
            database: b,
            name: "host-b",
            ["--peer", "\(HostPair.Host.a.address):7400"]
        )
        defer { nodeB.stop() }
        let off = await nodeB.line(within: 30) { $0.contains("mDNS discovery is off") }
        #expect(off?.contains("the Avahi daemon is not running") == true, "\(nodeB.output)")
        #expect(off?.contains("Tools/start-daemons.sh") == true)
        #expect(off?.contains("--peer") == true)
        #expect(await nodeB.line(within: 30) { $0.contains("synced 5 changes from \(siteA.prefix(8))") } != nil)
        #expect(await nodeA.line(within: 30) { $0.contains("changes from") } != nil, "\(nodeA.output)")
        #expect(try shoal(["digest", "--db", a]) == shoal(["digest", "--db", b]))

        // Avahi comes back: the node notices by itself (it retries with backoff), announces itself, and finds a.
        #expect(try hosts.run(.b, ["avahi-daemon", "-D"]).status == 0)
        let on = await nodeB.line(within: 30) { $0.contains("mDNS discovery is on") }
        #expect(on != nil, "\(nodeB.output)")
        #expect(await nodeB.line(within: 30) { $0.contains("found \(siteA.prefix(8)) at") } != nil, "\(nodeB.output)")
        let offLines = nodeB.output.split(separator: "\n").filter { $0.contains("discovery is off") }
        #expect(offLines.count == 1, "\(nodeB.output)")
    }
}

/// What `zeroconf-probe.py browse` found: its line "found JSON".
private struct ZeroconfService: Decodable {
    let instance: String
    let addresses: [String]
    let port: Int
    let txt: [String: String]

    /// The service in the probe's output (standard output and error together: warnings may come before or after
    /// the line).
    init(probeOutput output: String) throws {
        guard let line = output.split(separator: "\n").last(where: { $0.hasPrefix("found {") }) else {
            throw HostError(message: "zeroconf-probe.py browse printed no \"found\" line:\n\(output)")
        }
        self = try JSONDecoder().decode(ZeroconfService.self, from: Data(line.dropFirst("found ".count).utf8))
    }
}
