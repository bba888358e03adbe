import CDNSSD
import ServiceLifecycle
import ShoalCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Registers this node as `_shoal._tcp` through Avahi's Bonjour-compatible API, browses for the same
/// type, and resolves what it finds.
///
/// The dns_sd calls block, so one dedicated thread owns every `DNSServiceRef`: it polls their sockets and
/// calls `DNSServiceProcessResult` only when one is readable (a blocking call on Avahi's compat layer
/// never delivers callbacks), so neither NIO's event loops nor the cooperative pool ever wait on it.
public final class MDNSDiscovery: @unchecked Sendable {
    // @unchecked: every DNSServiceRef and the maps below are touched only by the discovery thread (or before
    // it starts); other threads only read `events` and set `stopping`, which is atomic.
    /// The DNS-SD service type every Shoal node registers and browses.
    public static let serviceType = "_shoal._tcp"

    /// What discovery finds, as it finds it.
    public let events: AsyncStream<DiscoveryEvent>
    private let sink: AsyncStream<DiscoveryEvent>.Continuation
    private let instanceName: String
    private let port: UInt16
    private let txt: [UInt8]
    /// The one interface to advertise and browse on (0: every interface).
    private let interfaceIndex: UInt32
    private let stopping = Atomic<Bool>(false)
    private var registration: DNSServiceRef?
    private var browser: DNSServiceRef?
    private var resolving: [DNSServiceRef] = []
    /// Address queries in flight: the service found, waiting for its host's IPv4 address, and when asked.
    private var querying: [DNSServiceRef: (service: DiscoveredService, since: ContinuousClock.Instant)] = [:]
    private var finished: [DNSServiceRef] = []
    /// Instance → interfaces it is currently seen on (each service arrives once per interface and family).
    private var seen: [String: Set<UInt32>] = [:]
    private var thread: pthread_t?

    /// - Parameters:
    ///   - interface: the name of the one network interface to advertise and browse on, or nil for every
    ///     interface. A node listening on one address should name that address's interface (see
    ///     ``interfaceName(owning:)``): a peer could not connect to it through any other, and "lo" keeps a node
    ///     listening on 127.0.0.1 from announcing anything to the network.
    public init(instanceName: String, port: Int, txt: [String: String], interface: String?) {
        self.instanceName = instanceName
        self.port = UInt16(port)
        self.interfaceIndex = interface.map { if_nametoindex($0) } ?? 0
        var record: [UInt8] = []
        for (key, value) in txt.sorted(by: { $0.key < $1.key }) {
            let entry = Array("\(key)=\(value)".utf8.prefix(255))
            record.append(UInt8(entry.count))
            record.append(contentsOf: entry)
        }
        self.txt = record
        (events, sink) = AsyncStream.makeStream(of: DiscoveryEvent.self, bufferingPolicy: .bufferingNewest(1_000))
    }

    /// The interface that holds `address` (an IPv4 or IPv6 literal): "lo" for loopback addresses, nil for the
    /// wildcard addresses (every interface) or an address no interface holds.
    public static func interfaceName(owning address: String) -> String? {
        if address == "localhost" { return "lo" }
        var ipv4 = in_addr()
        var ipv6 = in6_addr()
        let isIPv4 = inet_pton(AF_INET, address, &ipv4) == 1
        let isIPv6 = !isIPv4 && inet_pton(AF_INET6, address, &ipv6) == 1
        guard isIPv4 || isIPv6 else { return nil }
        if isIPv4 && ipv4.s_addr == 0 { return nil }
        if isIPv6 && withUnsafeBytes(of: ipv6, { $0.allSatisfy { $0 == 0 } }) { return nil }
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0 else { return nil }
        defer { freeifaddrs(list) }
        var entry = list
        while let current = entry {
            defer { entry = current.pointee.ifa_next }
            guard let socketAddress = current.pointee.ifa_addr else { continue }
            let holds: Bool
            switch Int32(socketAddress.pointee.sa_family) {
            case AF_INET where isIPv4:
                holds = socketAddress.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                    $0.pointee.sin_addr.s_addr == ipv4.s_addr
                }
            case AF_INET6 where isIPv6:
                holds = socketAddress.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin6_addr) { held in
                        withUnsafeBytes(of: ipv6) { held.elementsEqual($0) }
                    }
                }
            default:
                holds = false
            }
            if holds { return String(cString: current.pointee.ifa_name) }
        }
        return nil
    }

    /// Registers and starts browsing; throws when the daemon cannot be reached.
    public func start() throws(ShoalError) {
        setenv("AVAHI_COMPAT_NOWARN", "1", 1)
        let context = Unmanaged.passUnretained(self).toOpaque()
        var registration: DNSServiceRef?
        let registered = txt.withUnsafeBytes { bytes in
            DNSServiceRegister(
                &registration,
                0,
                interfaceIndex,
                instanceName,
                Self.serviceType,
                nil,
                nil,
                port.bigEndian,
                UInt16(bytes.count),
                bytes.baseAddress,
                registerCallback,
                context
            )
        }
        guard registered == kDNSServiceErr_NoError, let registration else {
            throw Self.error(registered, "register \(Self.serviceType)")
        }
        var browser: DNSServiceRef?
        let browsing = DNSServiceBrowse(&browser, 0, interfaceIndex, Self.serviceType, nil, browseCallback, context)
        guard browsing == kDNSServiceErr_NoError, let browser else {
            DNSServiceRefDeallocate(registration)
            throw Self.error(browsing, "browse \(Self.serviceType)")
        }
        self.registration = registration
        self.browser = browser
        let retained = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        pthread_create(
            &thread,
            nil,
            { context in
                let discovery = Unmanaged<MDNSDiscovery>.fromOpaque(context!).takeRetainedValue()
                discovery.loop()
                return nil
            },
            retained
        )
        self.thread = thread
    }

    /// Withdraws the registration and stops; returns once the discovery thread has ended.
    public func stop() {
        guard stopping.exchange(true, ordering: .acquiringAndReleasing) == false, let thread else { return }
        pthread_join(thread, nil)
        sink.finish()
    }

    private static func error(_ code: DNSServiceErrorType, _ action: String) -> ShoalError {
        let reason =
            switch code {
            case DNSServiceErrorType(kDNSServiceErr_Unknown), DNSServiceErrorType(kDNSServiceErr_NotInitialized),
                -65563:  // kDNSServiceErr_ServiceNotRunning, missing from Avahi's header
                "\(missingDaemon()) (dns_sd error \(code)). Fix: start the daemons (Tools/start-daemons.sh does so "
                    + "idempotently). Until then static peers (--peer) keep working; --no-mdns silences this"
            case DNSServiceErrorType(kDNSServiceErr_NameConflict):
                "another service on the network already has this name, which holds this node's site id and port: "
                    + "is a copy of this database file running elsewhere? Copies must not share a site id"
            default: "dns_sd error \(code)"
            }
        return ShoalError(code: .discoveryUnavailable, message: "mDNS: cannot \(action): \(reason)")
    }

    /// Which daemon is missing, for the message: Avahi is reached through the system D-Bus, so a bus that does
    /// not answer comes first.
    static func missingDaemon() -> String {
        // libdbus honours this variable before the default path; only its unix:path= form is probed here.
        var address = "/run/dbus/system_bus_socket"
        if let variable = getenv("DBUS_SYSTEM_BUS_ADDRESS").map({ String(cString: $0) }),
            let path = variable.split(separator: ",").first(where: { $0.hasPrefix("unix:path=") })
        {
            address = String(path.dropFirst("unix:path=".count))
        }
        return canConnect(toUnixSocket: address)
            ? "the Avahi daemon is not running"
            : "the system D-Bus is not running (no answer on \(address)), so neither is Avahi"
    }

    /// Whether something accepts connections on the Unix socket at `path`.
    private static func canConnect(toUnixSocket path: String) -> Bool {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8.prefix(MemoryLayout.size(ofValue: address.sun_path) - 1)) + [0]
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }

    private func loop() {
        while !stopping.load(ordering: .acquiring) {
            var refs: [DNSServiceRef] = []
            if let registration { refs.append(registration) }
            if let browser { refs.append(browser) }
            refs += resolving
            refs += querying.keys
            var fds = refs.map { pollfd(fd: DNSServiceRefSockFD($0), events: Int16(POLLIN), revents: 0) }
            let ready = poll(&fds, nfds_t(fds.count), 100)
            guard ready > 0 else { continue }
            for (index, descriptor) in fds.enumerated() where descriptor.revents & Int16(POLLIN) != 0 {
                let code = DNSServiceProcessResult(refs[index])
                if code != kDNSServiceErr_NoError && refs[index] == browser {
                    sink.yield(.unavailable("mDNS browsing stopped: dns_sd error \(code)"))
                }
            }
            // An address that does not come within two seconds: fall back on the host name (the system resolver
            // may still know it).
            for (ref, pending) in querying where ContinuousClock.now - pending.since > .seconds(2) {
                sink.yield(.found(pending.service))
                querying[ref] = nil
                finished.append(ref)
            }
            for ref in finished {
                resolving.removeAll { $0 == ref }
                querying[ref] = nil
                DNSServiceRefDeallocate(ref)
            }
            finished.removeAll()
        }
        for ref in resolving { DNSServiceRefDeallocate(ref) }
        resolving.removeAll()
        for ref in querying.keys { DNSServiceRefDeallocate(ref) }
        querying.removeAll()
        if let browser { DNSServiceRefDeallocate(browser) }
        if let registration { DNSServiceRefDeallocate(registration) }
        browser = nil
        registration = nil
    }

    // MARK: - Callbacks (on the discovery thread)

    func registered(_ error: DNSServiceErrorType, name: String) {
        if error != kDNSServiceErr_NoError {
            sink.yield(.unavailable(Self.error(error, "register \(name)").message))
        }
    }

    func browsed(
        flags: DNSServiceFlags,
        interface: UInt32,
        error: DNSServiceErrorType,
        name: String,
        type: String,
        domain: String
    ) {
        guard error == kDNSServiceErr_NoError else { return }
        if flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0 {
            seen[name, default: []].insert(interface)
            var resolver: DNSServiceRef?
            let context = Unmanaged.passUnretained(self).toOpaque()
            if DNSServiceResolve(&resolver, 0, interface, name, type, domain, resolveCallback, context)
                == kDNSServiceErr_NoError, let resolver
            {
                resolving.append(resolver)
            }
        } else {
            seen[name]?.remove(interface)
            if seen[name]?.isEmpty ?? true {
                seen[name] = nil
                sink.yield(.lost(instance: name))
            }
        }
    }

    func resolved(
        ref: DNSServiceRef?,
        interface: UInt32,
        error: DNSServiceErrorType,
        fullName: String,
        host: String,
        port: UInt16,
        txt: UnsafeRawBufferPointer
    ) {
        if let ref { finished.append(ref) }
        guard error == kDNSServiceErr_NoError else { return }
        func value(_ key: String) -> String? {
            var length: UInt8 = 0
            guard let pointer = TXTRecordGetValuePtr(UInt16(txt.count), txt.baseAddress, key, &length) else {
                return nil
            }
            return String(decoding: UnsafeRawBufferPointer(start: pointer, count: Int(length)), as: UTF8.self)
        }
        let instance = fullName.split(separator: ".").first.map(String.init) ?? fullName
        let onLoopback = interface == if_nametoindex("lo")
        let hostName = String(host.dropLast(host.hasSuffix(".") ? 1 : 0))
        let service = DiscoveredService(
            instance: Self.unescape(instance),
            txt: Dictionary(
                uniqueKeysWithValues: ShoalServiceRecord.Key.all.compactMap { key in value(key).map { (key, $0) } }
            ),
            host: onLoopback ? "127.0.0.1" : hostName,
            hostName: hostName,
            port: Int(UInt16(bigEndian: port)),
            interfaceIndex: interface
        )
        if onLoopback {
            sink.yield(.found(service))
            return
        }
        // Ask mDNS itself for the host's IPv4 address on that interface, rather than relying on the system
        // resolver knowing `.local` names (nss-mdns).
        var query: DNSServiceRef?
        let context = Unmanaged.passUnretained(self).toOpaque()
        let asked = DNSServiceQueryRecord(
            &query,
            0,
            interface,
            host,
            UInt16(kDNSServiceType_A),
            UInt16(kDNSServiceClass_IN),
            queryCallback,
            context
        )
        guard asked == kDNSServiceErr_NoError, let query else {
            sink.yield(.found(service))
            return
        }
        querying[query] = (service, ContinuousClock.now)
    }

    func answered(ref: DNSServiceRef?, flags: DNSServiceFlags, error: DNSServiceErrorType, rdata: [UInt8]) {
        guard let ref, var service = querying[ref]?.service, error == kDNSServiceErr_NoError,
            flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0, rdata.count == 4
        else { return }
        service.host = rdata.map(String.init).joined(separator: ".")
        sink.yield(.found(service))
        querying[ref] = nil
        finished.append(ref)
    }

    /// DNS-SD full names escape spaces and dots as `\032`, `\.`.
    static func unescape(_ name: String) -> String {
        var result = ""
        var characters = Substring(name)
        while let first = characters.first {
            if first == "\\", characters.count >= 4, let code = UInt8(characters.dropFirst().prefix(3)) {
                result.unicodeScalars.append(Unicode.Scalar(code))
                characters = characters.dropFirst(4)
            } else if first == "\\", characters.count >= 2 {
                result.append(characters.dropFirst().first!)
                characters = characters.dropFirst(2)
            } else {
                result.append(first)
                characters = characters.dropFirst()
            }
        }
        return result
    }
}

extension MDNSDiscovery: Service {
    /// Registers and browses until the task is cancelled or its service group shuts down gracefully, then
    /// withdraws the registration and returns; events arrive on ``events`` meanwhile. Throws only when
    /// discovery cannot start (see ``start()``).
    public func run() async throws {
        try start()
        defer { stop() }
        try? await gracefulShutdown()
    }
}
