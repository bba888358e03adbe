import Foundation
import Testing
import ShoalTestSupport

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalTransport

@Suite struct ForeignWriterNodeTests {
    /// Periodic rounds are off (60 s): only the node noticing the sqlite3 shell's commit can start one.
    @Test func aWriteMadeWithTheSqlite3ShellReachesThePeer() async throws {
        let directory = try temporaryDirectory("shell-writer")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = try await startNode(in: directory, name: "a")
        let b = try await startNode(in: directory, name: "b", peers: [a.port])
        #expect(await b.log.seen(within: 30) { if case .peerConnected = $0 { true } else { false } })

        let shell = try sqlite3Shell(
            a.path,
            "BEGIN; INSERT INTO kv(k, v, n) VALUES ('shell', x'00ff', 3), ('other', 2.5, 0); "
                + "UPDATE kv SET n = n + 4 WHERE k = 'shell'; DELETE FROM kv WHERE k = 'other'; COMMIT"
        )
        #expect(shell.status == 0, "\(shell.stderr)")

        // Only b is asked (asking a for its digest would capture the write on the spot).
        let expected: [[SQLValue]] = [[.text("shell"), .blob([0x00, 0xff]), .integer(7)]]
        let deadline = Date().addingTimeInterval(30)
        var seen: [[SQLValue]] = []
        while Date() < deadline {
            seen = try await b.node.execute("SELECT k, v, n FROM kv ORDER BY k").rows
            if seen == expected { break }
            _ = await b.log.next(within: 0.5) { if case .roundFinished = $0 { true } else { false } }
        }
        #expect(seen == expected)
        #expect(try await converge(a, b))
        await b.stop()
        await a.stop()
    }
}
