import ShoalCore

/// The join exchange, between a device with an invite code (the joiner) and the member that made the invite.
///
/// It runs on a TLS connection of its own (the joiner's certificate says it comes to join), and never shares a
/// connection with a sync session. The code never travels: both sides run CPace, a password-authenticated key
/// exchange keyed by the invite's secret and bound to both TLS keys, and prove the shared key to each other
/// before the member hands over anything. In order:
///
/// 1. joiner → member: ``JoinRequest`` (which invite, who the joiner is, its CPace share);
/// 2. member → joiner: ``challenge(share:tag:)`` (its share and its proof of the key), or ``refused(_:_:)``;
/// 3. joiner → member: ``confirm(tag:)`` (its proof), or nothing when the member's proof was wrong;
/// 4. member → joiner: ``welcome(sealed:)`` (the cluster's id, secret and roster, sealed with the exchanged
///    key), or ``refused(_:_:)``. A wrong proof burns the invite.
public enum JoinMessage: Hashable, Sendable {
    /// The joiner asks to join with invite `inviteID`.
    case request(JoinRequest)
    /// The member's CPace share and key confirmation tag.
    case challenge(share: [UInt8], tag: [UInt8])
    /// The joiner's key confirmation tag.
    case confirm(tag: [UInt8])
    /// The cluster's credentials and roster, sealed (ChaChaPoly) with the key both sides derived.
    case welcome(sealed: [UInt8])
    /// The member refuses: why, for programs and for people.
    case refused(JoinRefusal, String)

    /// The largest sealed welcome accepted (a roster of thousands of members fits).
    public static let maximumWelcomeBytes = 4 * 1024 * 1024

    enum Kind: UInt8 {
        case request = 1
        case challenge = 2
        case confirm = 3
        case welcome = 4
        case refused = 5
    }
}

/// The first message of a join.
public struct JoinRequest: Hashable, Sendable {
    /// The invite's id: the first two characters of the code (not secret).
    public var inviteID: String
    /// The joiner's name, for the roster.
    public var name: String
    /// The joiner's site id, which the roster will bind to its key.
    public var siteID: SiteID
    /// The joiner's CPace share (32 bytes).
    public var share: [UInt8]

    /// A request to join with invite `inviteID`.
    public init(inviteID: String, name: String, siteID: SiteID, share: [UInt8]) {
        self.inviteID = inviteID
        self.name = name
        self.siteID = siteID
        self.share = share
    }
}

/// Why a member refused a join.
public enum JoinRefusal: UInt8, Hashable, Sendable {
    /// Anything else, and reasons this build does not know.
    case other = 0
    /// This member holds no invite with that id (another member may).
    case unknownInvite = 1
    /// The invite expired.
    case expired = 2
    /// The invite was used, or burnt by a wrong guess.
    case used = 3
    /// The code was wrong: the invite is burnt.
    case wrongCode = 4
    /// Too many failed attempts lately: the member takes no joins for a while.
    case tooManyAttempts = 5
}

extension JoinMessage {
    func encode(into bytes: inout [UInt8]) {
        switch self {
        case .request(let request):
            bytes.append(Kind.request.rawValue)
            bytes.appendString(request.inviteID)
            bytes.appendString(request.name)
            bytes.append(contentsOf: request.siteID.bytes)
            bytes.appendBlob(request.share)
        case .challenge(let share, let tag):
            bytes.append(Kind.challenge.rawValue)
            bytes.appendBlob(share)
            bytes.appendBlob(tag)
        case .confirm(let tag):
            bytes.append(Kind.confirm.rawValue)
            bytes.appendBlob(tag)
        case .welcome(let sealed):
            bytes.append(Kind.welcome.rawValue)
            bytes.appendBlob(sealed)
        case .refused(let reason, let message):
            bytes.append(Kind.refused.rawValue)
            bytes.append(reason.rawValue)
            bytes.appendString(message)
        }
    }

    static func decode(_ reader: inout ByteReader) throws(ShoalError) -> JoinMessage {
        let type = try reader.readByte()
        guard let kind = Kind(rawValue: type) else {
            throw ShoalError(code: .malformedMessage, message: "unknown join message \(type)")
        }
        switch kind {
        case .request:
            let invite = try reader.readString()
            let name = try reader.readString()
            guard invite.utf8.count <= 16, name.utf8.count <= 256 else {
                throw ShoalError(code: .malformedMessage, message: "a join request with an overlong field")
            }
            guard let site = SiteID(bytes: try reader.readBytes(16)) else {
                throw ShoalError(code: .malformedMessage, message: "bad site id")
            }
            return .request(JoinRequest(inviteID: invite, name: name, siteID: site, share: try reader.readBlob(max: 32)))
        case .challenge:
            return .challenge(share: try reader.readBlob(max: 32), tag: try reader.readBlob(max: 64))
        case .confirm:
            return .confirm(tag: try reader.readBlob(max: 64))
        case .welcome:
            return .welcome(sealed: try reader.readBlob(max: maximumWelcomeBytes))
        case .refused:
            let reason = JoinRefusal(rawValue: try reader.readByte()) ?? .other
            return .refused(reason, try reader.readString())
        }
    }
}

extension Array where Element == UInt8 {
    mutating func appendBlob(_ blob: [UInt8]) {
        appendVarint(UInt64(blob.count))
        append(contentsOf: blob)
    }
}

extension ByteReader {
    mutating func readBlob(max: Int) throws(ShoalError) -> [UInt8] {
        let count = try readVarint()
        guard count <= UInt64(Swift.min(max, remaining)) else {
            throw ShoalError(code: .malformedMessage, message: "a field of \(count) bytes (at most \(max))")
        }
        return Array(try readBytes(Int(count)))
    }
}
