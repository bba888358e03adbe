import NIOCore
import ShoalCore
import ShoalProtocol
import ShoalSecurity
import ShoalTransport

extension ShoalFuzzing {
    /// The local side of every handshake the `hello` target runs.
    static let handshakeLocal = Hello(
        clusterID: "0123456789abcdef0123456789abcdef",
        siteID: SiteID(high: 0x1111, low: 0x2222),
        nodeName: "fuzz",
        schemaFingerprint: "kv",
        listenPort: 7400
    )

    /// A connection's first frame (held to the hello limit) through the frame decoder, then the session's handshake
    /// with whatever it decodes to. The session must end established (and only with a hello it may accept: a
    /// shared version, the same cluster, another site, and the same schema unless both carry schema changes) or closed
    /// with a typed refusal, never otherwise.
    public static func fuzzHello(_ bytes: UnsafeRawBufferPointer) {
        var buffer = ByteBuffer(bytes: bytes)
        let message: WireMessage
        do throws(ShoalError) {
            guard
                let first = try WireMessageDecoder.nextMessage(
                    from: &buffer,
                    maximumFrameLength: WireProtocol.maximumHelloFrameLength
                )
            else { return }
            message = first
        } catch {
            expectWireError(error, "the first frame")
            return
        }
        checkRoundTrip(message)
        var session = SyncSession(local: handshakeLocal, now: 0)
        _ = session.start()
        let actions = session.receive(message, now: 1)
        switch session.phase {
        case .established:
            guard case .hello(let hello) = message, hello.clusterID == handshakeLocal.clusterID,
                hello.siteID != handshakeLocal.siteID,
                let version = WireProtocol.negotiate(handshakeLocal.versions, hello.versions),
                // Peers that carry schema changes keep syncing across schemas; older ones need the same schema.
                hello.schemaFingerprint == handshakeLocal.schemaFingerprint || version >= WireProtocol.schemaChangeVersion
            else { fatalError("the session accepted a first message it must refuse: \(message)") }
        case .closed, .lingering:
            let refused = actions.contains { action in
                if case .send(.reject) = action { return true }
                if case .peerRefused = action { return true }
                return false
            }
            guard refused else { fatalError("the session closed without a refusal after \(message)") }
        case .handshaking:
            fatalError("the session still waits for a hello after \(message)")
        }
    }

    /// What a joining device and a member read from each other, chosen by the first byte: a join message (as a
    /// frame payload), the member's welcome, a roster record, an invite code typed by a person. Each must decode
    /// or fail with a typed error, and what decodes must encode back to the same bytes.
    public static func fuzzJoin(_ bytes: UnsafeRawBufferPointer) {
        guard let selector = bytes.first else { return }
        let rest = Array(bytes.dropFirst())
        switch selector % 4 {
        case 0:
            do throws(ShoalError) {
                let message = try WireMessage.decode([9] + rest)
                guard case .join = message else { fatalError("a join payload decoded as \(message)") }
                checkRoundTrip(message)
            } catch {
                expectWireError(error, "the join decoder")
            }
        case 1:
            do throws(ShoalError) {
                let welcome = try JoinWelcome(decoding: rest)
                guard try JoinWelcome(decoding: welcome.encoded).encoded == welcome.encoded else {
                    fatalError("a welcome changes when re-encoded")
                }
            } catch {
                guard error.code == .invite || error.code == .corruptMetadata else {
                    fatalError("the welcome decoder refused input with an unexpected error: \(error)")
                }
            }
        case 2:
            do throws(ShoalError) {
                let record = try RosterRecord(decoding: rest)
                guard record.encoded == rest else { fatalError("a roster record changes when re-encoded") }
                // Forged or not, a decoded record may be weighed: it never crashes the roster.
                _ = Roster(records: [record], clusterID: record.clusterID)
            } catch {
                guard error.code == .corruptMetadata else {
                    fatalError("the roster record decoder refused input with an unexpected error: \(error)")
                }
            }
        default:
            let text = String(decoding: rest.prefix(64), as: UTF8.self)
            do {
                let code = try InviteCode(parsing: text)
                guard (try? InviteCode(parsing: code.description)) == code else {
                    fatalError("an invite code does not parse back from its own text")
                }
            } catch {
                // A typed refusal: InviteCodeError.
            }
        }
    }
}
