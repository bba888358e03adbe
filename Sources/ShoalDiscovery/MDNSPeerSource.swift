import ShoalCore
import ShoalProtocol
import ShoalTransport

/// mDNS/DNS-SD as a peer source: announces the node as `_shoal._tcp`, browses for the same type, and reports
/// the nodes of its cluster it finds.
///
/// It advertises and browses where peers can reach the node: on the interface of the address it listens on (the
/// loopback interface for 127.0.0.1), or on every interface when it listens on all of them. When the Avahi daemon
/// is missing, or goes away, it says so once (``PeerSighting/unavailable(_:)``) and tries again with backoff, so
/// discovery comes back by itself once the daemon does.
public struct MDNSPeerSource: PeerSource {
    /// How long to wait before trying again after discovery became unavailable.
    public var retry = Backoff(initialMilliseconds: 1_000, maximumMilliseconds: 30_000)

    /// A source with the default retry.
    public init() {}

    /// Announces the node described by `context` and reports the peers of its cluster, until cancelled.
    public func sightings(_ context: PeerSourceContext) -> AsyncStream<PeerSighting> {
        let retry = self.retry
        return AsyncStream { continuation in
            let task = Task {
                await Self.discover(context, retry: retry, into: continuation)
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    private static func discover(
        _ context: PeerSourceContext,
        retry: Backoff,
        into sink: AsyncStream<PeerSighting>.Continuation
    ) async {
        let interface = MDNSDiscovery.interfaceName(owning: context.listenHost)
        let record = ShoalServiceRecord(
            name: context.nodeName,
            siteID: context.siteID,
            clusterHint: context.clusterHint,
            nodeID: context.nodeID,
            port: context.listeningPort,
            protocolVersion: "\(WireProtocol.maximumVersion)"
        )
        var saidUnavailable = false
        var retry = retry
        while !Task.isCancelled {
            let discovery = MDNSDiscovery(
                instanceName: record.instanceName,
                port: record.port,
                txt: record.txt,
                interface: interface
            )
            var reason: String?
            do {
                try discovery.start()
                saidUnavailable = false
                retry.reset()
                sink.yield(.available(interface: interface))
                reason = await follow(discovery, context: context, into: sink)
            } catch {
                reason = error.message
            }
            discovery.stop()
            guard let reason, !Task.isCancelled else { return }
            if !saidUnavailable {
                saidUnavailable = true
                sink.yield(.unavailable(reason))
            }
            try? await Task.sleep(for: .milliseconds(retry.next()))
        }
    }

    /// Reports what `discovery` finds until it stops: returns why it became unavailable, or nil when cancelled.
    private static func follow(
        _ discovery: MDNSDiscovery,
        context: PeerSourceContext,
        into sink: AsyncStream<PeerSighting>.Continuation
    ) async -> String? {
        await withTaskCancellationHandler {
            for await event in discovery.events {
                switch event {
                case .found(let service):
                    guard let record = service.record, record.siteID != context.siteID,
                        record.clusterHint == context.clusterHint
                    else { continue }
                    // The advertised host name too, unless the peer was seen on loopback (where its name would lead
                    // to another interface, on which it does not listen).
                    let named = PeerAddress(host: service.hostName, port: service.port)
                    sink.yield(
                        .found(
                            PeerCandidate(
                                siteID: record.siteID,
                                name: record.name,
                                address: PeerAddress(host: service.host, port: service.port),
                                otherAddresses: service.host == "127.0.0.1" ? [] : [named],
                                origin: .mdns
                            )
                        )
                    )
                case .lost(let instance):
                    _ = instance  // the node keeps its dialler: see PeerSighting.lost
                case .unavailable(let reason):
                    return reason
                }
            }
            return nil
        } onCancel: {
            discovery.stop()
        }
    }
}
