import Foundation
import NIOCore
import NIOPosix
import Shoal
import ShoalProcesses

extension RelayBenchmark {
    /// Pulls each slow reader posts at once (pipelined), before reading nothing.
    static let pullsPerSlowReader = 4

    /// Slow readers: `slowReaders` clients connect to a relay holding several pages of change sets, each posts
    /// ``pullsPerSlowReader`` pulls for 4 MiB pages at once and never reads an answer (a receive buffer of 16 KiB,
    /// never drained). The relay's resident memory is sampled for `slowSeconds`: it must stay bounded, not grow with
    /// the pulls posted or the time they wait.
    func slowReaderMemory(_ directory: String, sync: SyncBenchmark) async throws -> [(String, Double)] {
        let uploads = try makeUploads(directory, sync: sync, rows: min(rows, 200_000))
        let storage = ["--data", directory + "/relay"]
        // Every reader's pulls come at once, with one token: over the default rate limit, raised for this part.
        let process = try RelayProcess.start(
            storage: storage,
            log: directory + "/relay.log",
            extra: ["--rate-limit", "100000"]
        )
        defer { process.stop() }
        let pid = process.process.processIdentifier
        let relay = BenchRelay(url: process.url, token: try RelayProcess.token(storage: storage, cluster: "bench"))
        try await post(uploads, to: relay)
        try await Task.sleep(for: .seconds(1))  // the relay settles before its baseline is read
        let baseline = ServeProcess.residentMiB(pid: pid) ?? 0
        let filesBefore = Self.openFiles(pid)

        let json = Array(#"{"vector":{},"maximumBytes":4194304}"#.utf8)
        var request = ByteBuffer()
        for _ in 0..<Self.pullsPerSlowReader {
            request.writeString(
                "POST \(RelayAPI.pullPath) HTTP/1.1\r\nHost: 127.0.0.1:\(process.port)\r\n"
                    + "Authorization: Bearer \(relay.token)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(json.count)\r\n\r\n"
            )
            request.writeBytes(json)
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { Self.shutDown(group) }
        let bootstrap = ClientBootstrap(group: group)
            .connectTimeout(.seconds(20))
            .channelOption(.autoRead, value: false)
            .channelOption(.socketOption(.so_rcvbuf), value: 16 * 1024)
        var channels: [any Channel] = []
        defer { for channel in channels { channel.close(promise: nil) } }
        for _ in 0..<slowReaders {
            let channel = try await bootstrap.connect(host: "127.0.0.1", port: process.port).get()
            channels.append(channel)
            try await channel.writeAndFlush(request)
        }
        var firstHalf = baseline
        var secondHalf = baseline
        let started = ContinuousClock.now
        while ContinuousClock.now - started < .seconds(slowSeconds) {
            try await Task.sleep(for: .milliseconds(500))  // sampling while the readers read nothing
            let resident = ServeProcess.residentMiB(pid: pid) ?? 0
            if ContinuousClock.now - started < .seconds(slowSeconds) / 2 {
                firstHalf = max(firstHalf, resident)
            } else {
                secondHalf = max(secondHalf, resident)
            }
        }
        let resident = ServeProcess.residentMiB(pid: pid) ?? 0
        let stillOpen = Self.openFiles(pid) - filesBefore
        return [
            ("relay_slow_readers", Double(slowReaders)),
            ("relay_slow_base_rss_mb", baseline),
            ("relay_slow_max_rss_first_half_mb", firstHalf),
            ("relay_slow_max_rss_second_half_mb", secondHalf),
            ("relay_slow_end_rss_mb", resident),
            ("relay_slow_peak_rss_mb", ServeProcess.peakResidentMiB(pid: pid) ?? 0),
            ("relay_slow_mb_per_reader", (max(firstHalf, secondHalf) - baseline) / Double(slowReaders)),
            ("relay_slow_connections_open_at_end", Double(stillOpen)),
        ]
    }

    /// Stops `group` (from a synchronous context, as a defer needs).
    static func shutDown(_ group: MultiThreadedEventLoopGroup) {
        try? group.syncShutdownGracefully()
    }

    /// How many files process `pid` has open (its sockets among them).
    static func openFiles(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? 0
    }
}
