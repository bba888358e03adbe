// The README's embedding example, as an app would paste it (the README shows the lines between the markers, and a
// test checks that they match). EmbeddingExampleTests runs it against a relay and a node, and stops it with SIGTERM.
// README-EXAMPLE-BEGIN
import Foundation
import Logging
import ServiceLifecycle
import Shoal

let environment = ProcessInfo.processInfo.environment
var options = ShoalNodeOptions(database: environment["APP_DB"] ?? "app.db")  // made if missing, with its node key
options.peers = environment["APP_PEER"].flatMap(PeerAddress.init(parsing:)).map { [$0] } ?? []  // mDNS finds the rest
if let url = environment["APP_RELAY"] { options.relay = .init(url: url, token: environment["APP_RELAY_TOKEN"] ?? "") }
let node = try await ShoalNode(options: options)
let group = ServiceGroup(services: [node], gracefulShutdownSignals: [.sigterm, .sigint], logger: Logger(label: "app"))
try await group.run()  // until SIGTERM or SIGINT; then the app exits with status 0
// README-EXAMPLE-END
