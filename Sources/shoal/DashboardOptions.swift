import ArgumentParser
import ShoalCore
import ShoalDashboard
import ShoalTransport

/// `--dashboard HOST:PORT` and `--dashboard-token`, as `shoal serve` and `shoal demo` take them.
struct DashboardOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Serve a live web dashboard at http://HOST:PORT/ (loopback; elsewhere only with --dashboard-token or --dashboard-tls). `shoal demo` then keeps its nodes running after they converge, until interrupted; there --dashboard alone listens at \(Self.defaultAddress).",
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
    @Flag(
        help: "Serve the dashboard over HTTPS with the node's own TLS identity, to clients whose certificate the cluster's roster admits (a member's: `shoal id --write-tls FILE` writes one for curl); may then listen beyond loopback. `shoal serve` only."
    )
    var dashboardTls = false

    /// Where `shoal demo --dashboard` given alone listens.
    static let defaultAddress = "127.0.0.1:7480"

    /// Where to serve the dashboard (nil: nowhere), checked: `HOST:PORT`, and a loopback address unless a token or
    /// TLS guards it; `exposing` says what the page would show or let anyone do, in the refusal.
    func address(exposing: String) throws(ShoalError) -> PeerAddress? {
        guard let dashboard else {
            guard dashboardToken == nil, !dashboardTls else {
                throw ShoalError(code: .invalidArgument, message: "--dashboard-token and --dashboard-tls go with --dashboard HOST:PORT")
            }
            return nil
        }
        guard let parsed = PeerAddress(parsing: dashboard) else {
            throw ShoalError(code: .invalidArgument, message: "--dashboard wants HOST:PORT, got \"\(dashboard)\"")
        }
        guard DashboardServer.isLoopback(parsed.host) || !(dashboardToken ?? "").isEmpty || dashboardTls else {
            throw ShoalError(
                code: .invalidArgument,
                message: "--dashboard \(dashboard) is not a loopback address: give --dashboard-token or --dashboard-tls too (\(exposing))"
            )
        }
        return parsed
    }
}
