import Shoal
import ShoalProcesses

/// The node processes.
struct Cluster {
    let paths: [String]
    let peerPorts: [[Int]]
    let faults: Faults
    /// The relay's URLs on the relay path (its instances', or the tampering proxies').
    let relayURLs: [String]
    /// The token members are given (a new one after the relay lost its storage).
    var relayToken: String?
    /// A node's relay arguments kept as they were (a removed node is not given a later token).
    private var frozen: [Int: [String]] = [:]
    /// The removed node, once there is one: `shoal serve` refuses to start on its file once it has learnt of its
    /// removal, and from then on it stays down.
    var removedNode: Int?
    /// Whether the removed node refused to start (it learnt of its removal).
    private(set) var removedNodeRefused = false
    private var processes: [Int: ServeProcess] = [:]
    /// Nodes collect deletes without a member silent longer than this (`--gc-horizon`), when set.
    var horizonMilliseconds: UInt64?

    init(paths: [String], peerPorts: [[Int]], faults: Faults, relayURLs: [String] = [], relayToken: String? = nil) {
        self.paths = paths
        self.peerPorts = peerPorts
        self.faults = faults
        self.relayURLs = relayURLs
        self.relayToken = relayToken
    }

    /// `--relay URL --relay-token T` for node `node` on the relay path.
    func relayArguments(_ node: Int) -> [String] {
        if let kept = frozen[node] { return kept }
        guard let relayToken else { return [] }
        return relayURLs.flatMap { ["--relay", $0] } + ["--relay-token", relayToken]
    }

    /// Node `node` keeps the relay arguments it has now.
    mutating func freezeRelayArguments(of node: Int) { frozen[node] = relayArguments(node) }

    /// Stops node `node` (SIGTERM) and starts it again.
    mutating func restart(_ node: Int) async throws {
        processes[node]?.stop()
        processes[node] = nil
        try await start(node)
    }

    func isRunning(_ node: Int) -> Bool { processes[node]?.isRunning ?? false }

    mutating func start(_ node: Int) async throws {
        guard !isRunning(node), !(node == removedNode && removedNodeRefused) else { return }
        // Isolated: no mDNS and no remembered peers, so every byte between nodes goes through the fault proxy.
        let serve: ServeProcess
        do {
            serve = try ServeProcess.startIsolated(
                database: paths[node],
                name: "node\(node)",
                peers: peerPorts[node],
                // Compaction runs often here, so it is exercised amid the faults.
                extra: ["--round-interval", "500", "--compaction-interval", "300"] + relayArguments(node)
                    + (horizonMilliseconds.map { ["--gc-horizon-unchecked-ms", "\($0)"] } ?? [])
            )
        } catch where node == removedNode {
            print("note: node\(node), removed, refuses to start (\(error)); it stays down")
            removedNodeRefused = true
            return
        }
        processes[node] = serve
        await faults.setTarget(node, port: serve.port)
    }

    mutating func kill(_ node: Int) {
        processes[node]?.kill()
        processes[node] = nil
    }

    func stopAll() {
        for serve in processes.values { serve.stop() }
    }
}

