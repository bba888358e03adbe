import Foundation
import Shoal
import ShoalProcesses

/// A one-node cluster of another id, for the tampering proxy: it uploads a few change sets to the run's relay through
/// the proxy, which keeps them to inject into this cluster's pull answers, and is stopped.
enum ForeignCluster {
    static func upload(directory: String, relay: RelayServer, through url: String, proxy: Tampering) async throws {
        let path = directory + "/foreign.db"
        var options = StoreOptions()
        options.nodeName = "foreign"
        let store = try Store(path: path, options: options)
        try store.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, a, b, n INTEGER DEFAULT 0)")
        try store.replicate(table: "t", counters: ["n"])
        try Membership.formLocally([path], now: SystemWallClock().nowMilliseconds())
        let cluster = try KeyFile.load(forDatabase: path).cluster.idHex
        let token = try RelayProcess.token(storage: relay.storage, cluster: cluster)
        for key in Int64(1000)..<1004 {
            try store.execute("INSERT INTO t(k, a, b) VALUES (?, 'foreign', 'foreign')", [.integer(key)])
        }
        let node = try ServeProcess.startIsolated(
            database: path,
            name: "foreign",
            peers: [],
            extra: ["--relay", url, "--relay-token", token]
        )
        defer { node.stop() }
        let deadline = Date().addingTimeInterval(30)
        while await proxy.foreign.isEmpty, Date() < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        if await proxy.foreign.isEmpty {
            print("note: the cluster of another id uploaded nothing through the proxy in 30 s; no foreign chunk to inject")
        }
    }
}
