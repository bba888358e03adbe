import CDNSSD

/// The C callbacks dns_sd calls on the discovery thread, each handing its answer to the ``MDNSDiscovery`` whose
/// pointer is its context.

func registerCallback(
    _ ref: DNSServiceRef?,
    _ flags: DNSServiceFlags,
    _ error: DNSServiceErrorType,
    _ name: UnsafePointer<CChar>?,
    _ type: UnsafePointer<CChar>?,
    _ domain: UnsafePointer<CChar>?,
    _ context: UnsafeMutableRawPointer?
) {
    guard let context else { return }
    Unmanaged<MDNSDiscovery>.fromOpaque(context).takeUnretainedValue()
        .registered(error, name: name.map { String(cString: $0) } ?? "")
}

func browseCallback(
    _ ref: DNSServiceRef?,
    _ flags: DNSServiceFlags,
    _ interface: UInt32,
    _ error: DNSServiceErrorType,
    _ name: UnsafePointer<CChar>?,
    _ type: UnsafePointer<CChar>?,
    _ domain: UnsafePointer<CChar>?,
    _ context: UnsafeMutableRawPointer?
) {
    guard let context, let name, let type, let domain else { return }
    Unmanaged<MDNSDiscovery>.fromOpaque(context).takeUnretainedValue().browsed(
        flags: flags,
        interface: interface,
        error: error,
        name: String(cString: name),
        type: String(cString: type),
        domain: String(cString: domain)
    )
}

func resolveCallback(
    _ ref: DNSServiceRef?,
    _ flags: DNSServiceFlags,
    _ interface: UInt32,
    _ error: DNSServiceErrorType,
    _ fullName: UnsafePointer<CChar>?,
    _ host: UnsafePointer<CChar>?,
    _ port: UInt16,
    _ txtLength: UInt16,
    _ txt: UnsafePointer<UInt8>?,
    _ context: UnsafeMutableRawPointer?
) {
    guard let context else { return }
    Unmanaged<MDNSDiscovery>.fromOpaque(context).takeUnretainedValue().resolved(
        ref: ref,
        interface: interface,
        error: error,
        fullName: fullName.map { String(cString: $0) } ?? "",
        host: host.map { String(cString: $0) } ?? "",
        port: port,
        txt: UnsafeRawBufferPointer(start: txt, count: Int(txtLength))
    )
}

func queryCallback(
    _ ref: DNSServiceRef?,
    _ flags: DNSServiceFlags,
    _ interface: UInt32,
    _ error: DNSServiceErrorType,
    _ fullName: UnsafePointer<CChar>?,
    _ type: UInt16,
    _ recordClass: UInt16,
    _ length: UInt16,
    _ data: UnsafeRawPointer?,
    _ ttl: UInt32,
    _ context: UnsafeMutableRawPointer?
) {
    guard let context else { return }
    let bytes = data.map { Array(UnsafeRawBufferPointer(start: $0, count: Int(length))) } ?? []
    Unmanaged<MDNSDiscovery>.fromOpaque(context).takeUnretainedValue().answered(
        ref: ref,
        flags: flags,
        error: error,
        rdata: type == UInt16(kDNSServiceType_A) ? bytes : []
    )
}
