import ServiceLifecycle
import ShoalDashboard

/// Feeds the demo's dashboard: follows every node's change sets (for propagation and the list of change sets) and
/// publishes the cluster's state five times a second while a browser watches, every 2 s while none does (the nodes
/// are other processes: their status is read, not pushed, and each read has every node write its status file); a
/// state equal to the last is not sent again.
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
                    var last = ContinuousClock.now - .seconds(10)
                    while !Task.isCancelled {
                        if hub.isWatched || ContinuousClock.now - last >= .seconds(2) {
                            hub.publish(await cluster.state())
                            last = .now
                        }
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
        do {
            // Interrupted before the nodes converge: the demo stops where it is.
            try await cancelWhenGracefulShutdown { try await body() }
        } catch is CancellationError {
            return
        }
        try await gracefulShutdown()
    }
}
