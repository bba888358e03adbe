import ServiceLifecycle
import ShoalDashboard

/// Feeds the demo's dashboard: follows every node's change sets (for propagation and the list of change sets) and
/// publishes the cluster's state five times a second (the nodes are other processes: their status is read, not
/// pushed); a state equal to the last is not sent again.
struct DemoDashboardFeed: Service {
    let cluster: DemoCluster
    let hub: DashboardHub

    func run() async throws {
        try? await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                for index in cluster.paths.indices {
                    group.addTask { await cluster.follow(index) }
                }
                group.addTask {
                    while !Task.isCancelled {
                        hub.publish(await cluster.state())
                        try? await Task.sleep(for: .milliseconds(200))  // the period of the status reads
                    }
                }
            }
        }
        hub.finish()
    }
}

/// The demo's own run as a service beside the dashboard: it runs once, then waits for the group's shutdown, so the
/// nodes keep running until SIGINT or SIGTERM.
struct DemoRun: Service {
    let body: @Sendable () async throws -> Void

    init(_ body: @escaping @Sendable () async throws -> Void) {
        self.body = body
    }

    func run() async throws {
        try await body()
        try await gracefulShutdown()
    }
}
