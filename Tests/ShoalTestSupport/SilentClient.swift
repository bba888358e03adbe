import Foundation

/// Connects to `127.0.0.1:port`, sends `bytes` (nothing by default) and no more, and waits up to 30 s for the server
/// to close the connection: true when it did, false when the wait ran out or the connection failed. On a thread of
/// its own, so a blocked receive holds up no other test's work.
public func serverClosesAStalledClient(port: Int, sending bytes: [UInt8] = []) async -> Bool {
    await withCheckedContinuation { continuation in
        Thread {
            guard let socket = connectToLoopback(port: port, receiveTimeoutSeconds: 30) else {
                return continuation.resume(returning: false)
            }
            defer { close(socket) }
            guard bytes.isEmpty || send(socket, bytes, bytes.count, 0) == bytes.count else {
                return continuation.resume(returning: false)
            }
            // Whatever the server sends before it closes (an alert) is read past; 0 is the close, -1 the timeout.
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = recv(socket, &buffer, buffer.count, 0)
                if count <= 0 { return continuation.resume(returning: count == 0) }
            }
        }.start()
    }
}

/// A blocking TCP socket connected to `127.0.0.1:port`, whose receives give up after `receiveTimeoutSeconds`; nil if
/// it could not connect. The caller closes it.
public func connectToLoopback(port: Int, receiveTimeoutSeconds: Int) -> Int32? {
    let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard socket >= 0 else { return nil }
    var timeout = timeval(tv_sec: receiveTimeoutSeconds, tv_usec: 0)
    setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    guard connected == 0 else {
        close(socket)
        return nil
    }
    return socket
}
