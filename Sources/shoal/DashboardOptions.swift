import ArgumentParser
import ShoalCore
import ShoalDashboard
import ShoalTransport

/// `--dashboard HOST:PORT` and `--dashboard-token`, as `shoal serve` and `shoal demo` take them.
struct DashboardOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Serve a live web dashboard at http://HOST:PORT/ (loopback; elsewhere only with --dashboard-token). `shoal demo` then keeps its nodes running after they converge, until interrupted; there --dashboard alone listens at \(Self.defaultAddress).",
            valueName: "HOST:PORT"
        )
    )
    var dashboard: String?
    @Option(
        help: ArgumentHelp(
            "A token the dashboard's every request must carry (?token=…); needed to listen beyond loopback.",
            valueName: "TOKEN"
        )
    )
    var dashboardToken: String?

    /// Where `shoal demo --dashboard` given alone listens.
    static let defaultAddress = "127.0.0.1:7480"

    /// Where to serve the dashboard (nil: nowhere), checked: `HOST:PORT`, and a loopback address unless a token
    /// guards it; `exposing` says what the page would show or let anyone do, in the refusal.
    func address(exposing: String) throws(ShoalError) -> PeerAddress? {
        guard let dashboard else { return nil }
        guard let parsed = PeerAddress(parsing: dashboard) else {
            throw ShoalError(code: .invalidArgument, message: "--dashboard wants HOST:PORT, got \"\(dashboard)\"")
        }
        guard DashboardServer.isLoopback(parsed.host) || !(dashboardToken ?? "").isEmpty else {
            throw ShoalError(
                code: .invalidArgument,
                message: "--dashboard \(dashboard) is not a loopback address: give --dashboard-token too (\(exposing))"
            )
        }
        return parsed
    }
}
