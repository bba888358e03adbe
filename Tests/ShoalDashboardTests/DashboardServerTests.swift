import Foundation
import Logging
import NIOCore
import ShoalTestSupport
import Testing

@testable import ShoalDashboard

/// The server over real TCP on loopback: the page, the event stream and its resumption, the controls' refusals, the
/// token. A plain blocking socket client, on threads of its own.
@Suite struct DashboardServerTests {
    /// Runs a server for `body`, then stops it.
    private func withServer(
        token: String? = nil,
        requestDeadline: TimeAmount = .seconds(10),
        controls: (@Sendable (DashboardControl) async throws -> String)? = nil,
        _ body: (Int, DashboardHub) async throws -> Void
    ) async throws {
        let hub = DashboardHub()
        let (ports, bound) = AsyncStream.makeStream(of: Int.self)
        let server = DashboardServer(
            host: "127.0.0.1",
            port: 0,
            hub: hub,
            token: token,
            logger: Logger(label: "test"),
            requestDeadline: requestDeadline,
            controls: controls,
            onListening: { port in bound.yield(port) }
        )
        let running = Task { try await server.run() }
        defer { running.cancel() }
        var iterator = ports.makeAsyncIterator()
        let port = try #require(await iterator.next())
        try await body(port, hub)
    }

    /// Sends `request` and reads until `enough` says so, the server closes, or 5 s pass.
    private func exchange(
        _ port: Int,
        _ request: String,
        until enough: @escaping @Sendable (String) -> Bool
    ) async
        -> String
    {
        await withCheckedContinuation { continuation in
            // A thread of its own: blocked reads on Dispatch's few workers would hold up the other tests' reads.
            Thread {
                continuation.resume(returning: Self.blockingExchange(port, request, until: enough))
            }.start()
        }
    }

    private static func blockingExchange(_ port: Int, _ request: String, until enough: (String) -> Bool) -> String {
        // Bounds only an exchange that fails: a loaded run of the whole suite on two cores answered after more than 5 s.
        guard let socket = connectToLoopback(port: port, receiveTimeoutSeconds: 30) else { return "" }
        defer { close(socket) }
        let bytes = Array(request.utf8)
        guard send(socket, bytes, bytes.count, 0) == bytes.count else { return "" }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while !enough(String(decoding: received, as: UTF8.self)) {
            let count = recv(socket, &buffer, buffer.count, 0)
            if count <= 0 { break }
            received += buffer[0..<count]
        }
        return String(decoding: received, as: UTF8.self)
    }

    private func get(_ path: String, headers: String = "") -> String {
        "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\(headers)\r\n"
    }

    private func post(_ body: String, headers: String = "Content-Type: application/json\r\n") -> String {
        "POST /control HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\(headers)Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }

    @Test func servesThePageAndTheLatestState() async throws {
        try await withServer { port, hub in
            let page = await exchange(port, get("/"), until: { $0.contains("</html>") })
            #expect(page.hasPrefix("HTTP/1.1 200 OK"))
            #expect(page.lowercased().contains("content-type: text/html; charset=utf-8"))
            #expect(page.lowercased().contains("content-security-policy: default-src 'self'"))
            #expect(page.contains("new EventSource"))
            // One self-contained file: no script, style sheet or image fetched from anywhere.
            #expect(!page.contains("<script src") && !page.contains("rel=\"stylesheet\"") && !page.contains("https://"))
            let none = await exchange(port, get("/state"), until: { _ in false })
            #expect(none.hasPrefix("HTTP/1.1 503"))
            hub.publish(DashboardState(title: "t", mode: "demo", controls: false))
            let state = await exchange(port, get("/state"), until: { $0.contains("}") })
            #expect(state.hasPrefix("HTTP/1.1 200 OK"))
            #expect(state.contains("\"title\":\"t\""))
            let missing = await exchange(port, get("/nothing"), until: { _ in false })
            #expect(missing.hasPrefix("HTTP/1.1 404"))
        }
    }

    @Test func streamsStatesAndResumesAfterTheLastEventID() async throws {
        try await withServer { port, hub in
            for title in ["a", "b", "c"] { hub.publish(DashboardState(title: title, mode: "demo", controls: false)) }
            let resumed = await exchange(
                port,
                get("/events", headers: "Last-Event-ID: 1\r\n"),
                until: { $0.contains("id: 3\n") && $0.contains("\"title\":\"c\"") }
            )
            #expect(resumed.hasPrefix("HTTP/1.1 200 OK"))
            #expect(resumed.lowercased().contains("content-type: text/event-stream"))
            #expect(resumed.contains("id: 2\nevent: state\ndata: {"))
            #expect(!resumed.contains("id: 1\n"))
        }
    }

    @Test func aConnectionWithoutARequestIsClosedAtItsDeadlineAndAStreamStaysOpen() async throws {
        try await withServer(requestDeadline: .seconds(2)) { port, hub in
            hub.publish(DashboardState(title: "early", mode: "demo", controls: false))
            let (seen, saw) = AsyncStream.makeStream(of: Void.self)
            let stream = Task {
                let text = await exchange(port, get("/events")) { text in
                    if text.contains("\"title\":\"early\"") { saw.yield() }
                    return text.contains("\"title\":\"late\"")
                }
                // An exchange that failed ends the wait below instead of leaving it waiting forever.
                saw.finish()
                return text
            }
            var iterator = seen.makeAsyncIterator()
            guard await iterator.next() != nil else {
                let text = await stream.value
                Issue.record("the stream never showed the first state: \(text)")
                return
            }
            // A client that connects and says nothing is let go at the deadline, not after the 60 s idle time...
            #expect(await serverClosesAStalledClient(port: port))
            // ...while the stream, whose request came at once, stays open past it and gets the next state.
            hub.publish(DashboardState(title: "late", mode: "demo", controls: false))
            let events = await stream.value
            #expect(events.contains("\"title\":\"late\""))
        }
    }

    @Test func takesControlsOnlyAsJSONFromItsOwnPage() async throws {
        let controls: @Sendable (DashboardControl) async throws -> String = { control in
            guard control.node == 0 else { throw DashboardControlError("no such node") }
            return "did \(control.action.rawValue)"
        }
        try await withServer(controls: controls) { port, _ in
            let done = await exchange(port, post(#"{"action":"burst","node":0}"#), until: { $0.contains("}") })
            #expect(done.hasPrefix("HTTP/1.1 200 OK"))
            #expect(done.contains(#""message":"did burst""#))
            let refused = await exchange(port, post(#"{"action":"stop","node":7}"#), until: { $0.contains("}") })
            #expect(refused.hasPrefix("HTTP/1.1 409"))
            let form = await exchange(
                port,
                post(#"{"action":"burst","node":0}"#, headers: "Content-Type: text/plain\r\n"),
                until: { $0.contains("}") }
            )
            #expect(form.hasPrefix("HTTP/1.1 415"))
            let elsewhere = await exchange(
                port,
                post(
                    #"{"action":"burst","node":0}"#,
                    headers: "Content-Type: application/json\r\nOrigin: http://example.com\r\n"
                ),
                until: { $0.contains("}") }
            )
            #expect(elsewhere.hasPrefix("HTTP/1.1 403"))
            let nonsense = await exchange(port, post("nonsense"), until: { $0.contains("}") })
            #expect(nonsense.hasPrefix("HTTP/1.1 400"))
        }
        try await withServer { port, _ in
            let none = await exchange(port, post(#"{"action":"burst","node":0}"#), until: { $0.contains("}") })
            #expect(none.hasPrefix("HTTP/1.1 404"))
        }
    }

    @Test func aRequestNotCompleteByItsDeadlineIsClosed() async throws {
        try await withServer(requestDeadline: .seconds(1)) { port, _ in
            // A head that promises a body never sent, and a head sent without its blank line: both let go.
            let head = "POST /control HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            #expect(await serverClosesAStalledClient(port: port, sending: Array((head + "Content-Length: 100\r\n\r\n{").utf8)))
            #expect(await serverClosesAStalledClient(port: port, sending: Array(head.utf8)))
        }
    }

    @Test func withoutATokenOnlyRequestsToALoopbackNameAreAnswered() async throws {
        // DNS rebinding: a page of another site whose name now resolves to 127.0.0.1 is same-origin to the browser,
        // and its requests name that site.
        let elsewhere = "GET /state HTTP/1.1\r\nHost: rebound.example:8080\r\nConnection: close\r\n\r\n"
        let control =
            "POST /control HTTP/1.1\r\nHost: rebound.example:8080\r\nOrigin: http://rebound.example:8080\r\n"
            + "Content-Type: application/json\r\nConnection: close\r\nContent-Length: 27\r\n\r\n"
            + #"{"action":"burst","node":0}"#
        let controls: @Sendable (DashboardControl) async throws -> String = { _ in "did it" }
        try await withServer(controls: controls) { port, hub in
            hub.publish(DashboardState(title: "t", mode: "demo", controls: true))
            #expect(await exchange(port, elsewhere, until: { _ in false }).hasPrefix("HTTP/1.1 421"))
            let posted = await exchange(port, control, until: { _ in false })
            #expect(posted.hasPrefix("HTTP/1.1 421") && !posted.contains("did it"))
            let local = await exchange(port, get("/state", headers: ""), until: { $0.contains("}") })
            #expect(local.hasPrefix("HTTP/1.1 200"))
            let named = "GET /state HTTP/1.1\r\nHost: localhost:\(port)\r\nConnection: close\r\n\r\n"
            #expect(await exchange(port, named, until: { $0.contains("}") }).hasPrefix("HTTP/1.1 200"))
        }
        // With a token, a request to any name that carries it is answered (the token is what a rebound page lacks).
        try await withServer(token: "s3cret") { port, hub in
            hub.publish(DashboardState(title: "t", mode: "demo", controls: false))
            let withToken = "GET /state?token=s3cret HTTP/1.1\r\nHost: dashboard.lan:8080\r\nConnection: close\r\n\r\n"
            #expect(await exchange(port, withToken, until: { $0.contains("}") }).hasPrefix("HTTP/1.1 200"))
        }
    }

    @Test func aTokenIsAskedOfEveryRequest() async throws {
        try await withServer(token: "s3cret") { port, _ in
            #expect(await exchange(port, get("/"), until: { _ in false }).hasPrefix("HTTP/1.1 401"))
            #expect(await exchange(port, get("/?token=wrong"), until: { _ in false }).hasPrefix("HTTP/1.1 401"))
            #expect(
                await exchange(port, get("/?token=s3cret"), until: { $0.contains("</html>") }).hasPrefix("HTTP/1.1 200")
            )
            #expect(
                await exchange(
                    port,
                    get("/", headers: "Authorization: Bearer s3cret\r\n"),
                    until: { $0.contains("</html>") }
                )
                .hasPrefix("HTTP/1.1 200")
            )
        }
    }
}
