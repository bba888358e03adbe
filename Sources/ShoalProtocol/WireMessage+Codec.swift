import ShoalCore

#if canImport(Glibc)
import Glibc
#endif

extension WireMessage {
    /// Encodes the message as a frame payload: a type byte, then its fields.
    public func encoded() -> [UInt8] {
        var bytes: [UInt8] = []
        switch self {
        case .encoded(let encoded):
            return encoded.payload
        case .hello(let hello):
            bytes.append(Kind.hello.rawValue)
            Self.encode(hello, into: &bytes)
        case .inspect(let hello):
            bytes.append(Kind.inspect.rawValue)
            Self.encode(hello, into: &bytes)
        case .inspectionRequest(let request):
            bytes.append(Kind.inspectionRequest.rawValue)
            Self.encode(request, into: &bytes)
        case .inspectionAnswer(let answer):
            bytes.append(Kind.inspectionAnswer.rawValue)
            Self.encode(answer, into: &bytes)
        case .syncRequest(let request):
            bytes.append(Kind.syncRequest.rawValue)
            bytes.appendBigEndian(request.requestID)
            bytes.appendVersionVector(request.versionVector)
            // Version 4's fields, all present or none (an older peer refuses trailing bytes).
            if let wall = request.wallClockMilliseconds, let site = request.writingSite {
                bytes.appendBigEndian(wall)
                bytes.append(contentsOf: site.bytes)
                if let head = request.answererHead {
                    bytes.append(1)
                    bytes.append(contentsOf: head.site.bytes)
                    bytes.appendBigEndian(head.seq)
                    bytes.appendBigEndian(head.hlc.rawValue)
                } else {
                    bytes.append(0)
                }
            }
        case .changeBatch(let message):
            bytes.append(Kind.changeBatch.rawValue)
            bytes.appendBigEndian(message.requestID)
            bytes.appendBigEndian32(message.sequence)
            bytes.append(message.isLast ? 1 : 0)
            bytes.appendVarint(message.estimatedRemaining)
            bytes.appendVersionVector(message.batch.claim)
            Self.encode(message.batch.changes, pieced: message.piecedValues, into: &bytes)
        case .ack(let ack):
            bytes.append(Kind.ack.rawValue)
            bytes.appendBigEndian(ack.requestID)
            bytes.appendVersionVector(ack.versionVector)
            if let digest = ack.digest {
                bytes.append(1)
                bytes.appendVarint(UInt64(digest.count))
                bytes.append(contentsOf: digest)
            } else {
                bytes.append(0)
            }
        case .holding(let vector):
            bytes.append(Kind.holding.rawValue)
            bytes.appendVersionVector(vector)
        case .freshState(let vector):
            bytes.append(Kind.freshState.rawValue)
            bytes.appendVersionVector(vector)
        case .members(let reports):
            bytes.append(Kind.members.rawValue)
            bytes.appendVarint(UInt64(reports.count))
            for report in reports {
                bytes.append(contentsOf: report.site.bytes)
                bytes.appendString(String(report.name.utf8.prefix(MemberGossip.maximumNameBytes)) ?? "")
                bytes.appendVarint(report.ageMilliseconds)
                bytes.appendVersionVector(report.versionVector)
            }
        case .ping(let nonce):
            bytes.append(Kind.ping.rawValue)
            bytes.appendBigEndian(nonce)
        case .pong(let nonce):
            bytes.append(Kind.pong.rawValue)
            bytes.appendBigEndian(nonce)
        case .reject(let rejection):
            bytes.append(Kind.reject.rawValue)
            bytes.appendBigEndian16(rejection.reason.rawValue)
            bytes.appendString(rejection.message)
        case .valuePiece(let piece):
            bytes.reserveCapacity(piece.bytes.count + 40)
            bytes.append(Kind.valuePiece.rawValue)
            bytes.appendBigEndian(piece.requestID)
            bytes.appendBigEndian32(piece.sequence)
            bytes.appendVarint(UInt64(piece.change))
            bytes.appendVarint(piece.totalLength)
            bytes.appendVarint(piece.offset)
            bytes.appendVarint(UInt64(piece.bytes.count))
            bytes.append(contentsOf: piece.bytes)
        case .join(let message):
            bytes.append(Kind.join.rawValue)
            message.encode(into: &bytes)
        }
        return bytes
    }

    /// Decodes one frame payload; throws ``ShoalError`` (`.unknownMessageType`, `.malformedMessage`,
    /// `.frameTooLarge`) and never reads past `payload`. A compressed frame (type 13) decodes as the message it holds,
    /// which may not be longer than `maximumInflatedLength` (the receiver's frame maximum: compression never lets a
    /// peer send more than a frame's worth in one message).
    public static func decode(
        _ payload: [UInt8],
        maximumInflatedLength: Int = WireProtocol.defaultMaximumFrameLength
    ) throws(ShoalError) -> WireMessage {
        guard payload.first != Kind.compressed.rawValue else {
            return try decode(compressed: payload, maximumInflatedLength: maximumInflatedLength)
        }
        return try decodePlain(payload)
    }

    /// Decodes one frame payload that is not compressed.
    static func decodePlain(_ payload: [UInt8]) throws(ShoalError) -> WireMessage {
        var reader = ByteReader(payload)
        do throws(ShoalError) {
            let message = try decodeFields(&reader)
            guard reader.isAtEnd else { throw malformed("\(payload.count - reader.offset) unexpected trailing bytes") }
            return message
        } catch {
            // The byte reader reports truncation as corrupt metadata; on the wire it is a malformed message.
            guard error.code == .corruptMetadata else { throw error }
            throw malformed(error.message.replacingPrefix("Shoal metadata is corrupt: ", with: ""))
        }
    }

    private static func decodeFields(_ reader: inout ByteReader) throws(ShoalError) -> WireMessage {
        let type = try reader.readByte()
        guard let kind = Kind(rawValue: type) else {
            throw ShoalError(code: .unknownMessageType, message: "unknown message type \(type)")
        }
        switch kind {
        case .hello:
            return .hello(try decodeHello(&reader))
        case .inspect:
            return .inspect(try decodeHello(&reader))
        case .inspectionRequest:
            return .inspectionRequest(try decodeInspectionRequest(&reader))
        case .inspectionAnswer:
            return .inspectionAnswer(try decodeInspectionAnswer(&reader))
        case .compressed:
            throw malformed("a compressed frame inside a compressed frame")
        case .syncRequest:
            var request = SyncRequest(requestID: try reader.readBigEndianUInt64(), versionVector: try reader.readVersionVector())
            if !reader.isAtEnd {
                request.wallClockMilliseconds = try reader.readBigEndianUInt64()
                guard let site = SiteID(bytes: try reader.readBytes(16)) else { throw malformed("bad site id") }
                request.writingSite = site
                switch try reader.readByte() {
                case 0: break
                case 1:
                    guard let headSite = SiteID(bytes: try reader.readBytes(16)) else { throw malformed("bad site id") }
                    let seq = try reader.readBigEndianUInt64()
                    request.answererHead = Stamp(hlc: HLC(rawValue: try reader.readBigEndianUInt64()), site: headSite, seq: seq)
                case let flag: throw malformed("unknown head flag \(flag)")
                }
            }
            return .syncRequest(request)
        case .changeBatch:
            let requestID = try reader.readBigEndianUInt64()
            let sequence = try reader.readBigEndian32()
            let flags = try reader.readByte()
            guard flags <= 1 else { throw malformed("unknown batch flags \(flags)") }
            let remaining = try reader.readVarint()
            let claim = try reader.readVersionVector()
            let (changes, pieced) = try decodeChanges(&reader)
            return .changeBatch(
                ChangeBatchMessage(
                    requestID: requestID,
                    sequence: sequence,
                    isLast: flags == 1,
                    estimatedRemaining: remaining,
                    batch: ChangeBatch(changes: changes, claim: claim),
                    piecedValues: pieced
                )
            )
        case .ack:
            let requestID = try reader.readBigEndianUInt64()
            let vector = try reader.readVersionVector()
            var digest: [UInt8]?
            switch try reader.readByte() {
            case 0: break
            case 1:
                let count = try reader.readVarint()
                guard count <= 64 else { throw malformed("digest of \(count) bytes") }
                digest = Array(try reader.readBytes(Int(count)))
            default: throw malformed("bad digest flag")
            }
            return .ack(Ack(requestID: requestID, versionVector: vector, digest: digest))
        case .holding:
            return .holding(try reader.readVersionVector())
        case .freshState:
            return .freshState(try reader.readVersionVector())
        case .members:
            let count = try reader.readVarint()
            guard count <= UInt64(MemberGossip.maximumCount) else { throw malformed("\(count) member reports") }
            var reports: [MemberGossip] = []
            for _ in 0..<Int(count) {
                guard let site = SiteID(bytes: try reader.readBytes(16)) else { throw malformed("bad site id") }
                let name = try reader.readString()
                guard name.utf8.count <= MemberGossip.maximumNameBytes else { throw malformed("a member name too long") }
                let age = try reader.readVarint()
                reports.append(
                    MemberGossip(site: site, name: name, ageMilliseconds: age, versionVector: try reader.readVersionVector())
                )
            }
            return .members(reports)
        case .ping:
            return .ping(try reader.readBigEndianUInt64())
        case .pong:
            return .pong(try reader.readBigEndianUInt64())
        case .reject:
            let code = try reader.readBigEndian16()
            return .reject(Rejection(Rejection.Reason(rawValue: code) ?? .other, try reader.readString()))
        case .join:
            return .join(try JoinMessage.decode(&reader))
        case .valuePiece:
            let requestID = try reader.readBigEndianUInt64()
            let sequence = try reader.readBigEndian32()
            let change = try reader.readVarint()
            guard change <= UInt64(UInt32.max) else { throw malformed("a value piece for change \(change)") }
            let total = try reader.readVarint()
            let offset = try reader.readVarint()
            let count = try reader.readVarint()
            guard count > 0, count <= UInt64(reader.remaining) else {
                throw malformed("a value piece of \(count) bytes in a frame with \(reader.remaining) left")
            }
            guard offset <= total, count <= total - offset else {
                throw malformed("a value piece at \(offset)+\(count) beyond the value's \(total) bytes")
            }
            return .valuePiece(
                ValuePiece(
                    requestID: requestID,
                    sequence: sequence,
                    change: UInt32(change),
                    totalLength: total,
                    offset: offset,
                    bytes: Array(try reader.readBytes(Int(count)))
                )
            )
        }
    }

    /// Changes: a table of the site ids they mention, then each change with sites as indexes into it.
    /// Changes listed in `pieced` (ascending indexes of column changes) are written as kind 3, without their
    /// value, which travels in ``ValuePiece``s.
    static func encode(_ changes: [Change], pieced: [UInt32], into bytes: inout [UInt8]) {
        var sites: [SiteID] = []
        var indexes: [SiteID: UInt64] = [:]
        func index(_ site: SiteID) -> UInt64 {
            if let index = indexes[site] { return index }
            indexes[site] = UInt64(sites.count)
            sites.append(site)
            return UInt64(sites.count - 1)
        }
        var body: [UInt8] = []
        var lastTable = ""
        var nextPieced = pieced.makeIterator()
        var piecedIndex = nextPieced.next()
        for (position, change) in changes.enumerated() {
            // Consecutive changes of one table name it once: an empty name means "the same table".
            body.appendString(change.table == lastTable ? "" : change.table)
            lastTable = change.table
            body.appendVarint(UInt64(change.primaryKey.count))
            for value in change.primaryKey { value.encode(into: &body) }
            switch change.payload {
            case .row:
                body.append(0)
            case .column(let name, _) where piecedIndex.map({ Int($0) == position }) ?? false:
                body.append(3)
                body.appendString(name)
                piecedIndex = nextPieced.next()
            case .column(let name, let value):
                body.append(1)
                body.appendString(name)
                value.encode(into: &body)
            case .counter(let name, let increments, let decrements):
                body.append(2)
                body.appendString(name)
                body.appendVarint(increments)
                body.appendVarint(decrements)
            }
            body.appendVarint(change.causalLength)
            body.appendBigEndian(change.stamp.hlc.rawValue)
            body.appendVarint(index(change.stamp.site))
            body.appendVarint(change.stamp.seq)
            if let previous = change.previous {
                body.append(1)
                body.appendVarint(index(previous.site))
                body.appendVarint(previous.seq)
            } else {
                body.append(0)
            }
        }
        bytes.appendVarint(UInt64(sites.count))
        for site in sites { bytes.append(contentsOf: site.bytes) }
        bytes.appendVarint(UInt64(changes.count))
        bytes.append(contentsOf: body)
    }

    static func decodeChanges(_ reader: inout ByteReader) throws(ShoalError) -> ([Change], [UInt32]) {
        let siteCount = try reader.readVarint()
        guard siteCount <= UInt64(reader.remaining / 16) else { throw malformed("site table longer than the frame") }
        var sites: [SiteID] = []
        for _ in 0..<siteCount { sites.append(SiteID(bytes: try reader.readBytes(16))!) }
        func site(_ index: UInt64) throws(ShoalError) -> SiteID {
            guard index < sites.count else { throw malformed("site index \(index) outside the site table") }
            return sites[Int(index)]
        }
        let count = try reader.readVarint()
        // Every change takes at least 13 bytes: a bound before reserving anything.
        guard count <= UInt64(reader.remaining / 13) else {
            throw malformed("\(count) changes cannot fit in the frame")
        }
        var changes: [Change] = []
        var pieced: [UInt32] = []
        changes.reserveCapacity(Int(count))
        var table = ""
        // Every change names its column (and a new run its table): the few names of a batch are decoded once each.
        var names = NameCache()
        for _ in 0..<count {
            let name = try names.read(&reader)
            if !name.isEmpty { table = name }
            guard !table.isEmpty else { throw malformed("a change without a table") }
            let keyCount = try reader.readVarint()
            guard keyCount > 0, keyCount <= 64 else { throw malformed("a primary key of \(keyCount) values") }
            var key: [SQLValue] = []
            for _ in 0..<keyCount { key.append(try SQLValue.decode(from: &reader)) }
            let payload: Change.Payload
            switch try reader.readByte() {
            case 0: payload = .row
            case 1: payload = .column(try names.read(&reader), try SQLValue.decode(from: &reader))
            case 3:
                // The value comes in pieces; NULL stands for it until the session puts it back.
                payload = .column(try names.read(&reader), .null)
                pieced.append(UInt32(changes.count))
            case 2:
                payload = .counter(
                    try names.read(&reader),
                    increments: try reader.readVarint(),
                    decrements: try reader.readVarint()
                )
            case let kind: throw malformed("unknown change kind \(kind)")
            }
            let causalLength = try reader.readVarint()
            let hlc = HLC(rawValue: try reader.readBigEndianUInt64())
            let stampSite = try site(try reader.readVarint())
            let seq = try reader.readVarint()
            var previous: Dot?
            switch try reader.readByte() {
            case 0: break
            case 1: previous = Dot(site: try site(try reader.readVarint()), seq: try reader.readVarint())
            default: throw malformed("bad previous-write flag")
            }
            guard causalLength > 0, seq > 0 else { throw malformed("a change with a zero causal length or seq") }
            if case .row = payload {
            } else if causalLength % 2 == 0 {
                throw malformed("a column change for a deleted row")
            }
            changes.append(
                Change(
                    table: table,
                    primaryKey: key,
                    payload: payload,
                    causalLength: causalLength,
                    stamp: Stamp(hlc: hlc, site: stampSite, seq: seq),
                    previous: previous
                )
            )
        }
        return (changes, pieced)
    }

    static func malformed(_ detail: String) -> ShoalError {
        ShoalError(code: .malformedMessage, message: "malformed message: \(detail)")
    }
}

extension ChangeBatchMessage {
    /// An upper bound of the message's encoded size, cheap to compute.
    public var maximumEncodedSize: Int {
        var size = 64 + 27 * batch.claim.entries.count
        var pieced = Set(piecedValues)
        for (index, change) in batch.changes.enumerated() {
            size += 60 + change.table.utf8.count
            for value in change.primaryKey { size += value.encodedSizeBound }
            switch change.payload {
            case .row: break
            case .column(let name, let value):
                size += name.utf8.count + (pieced.remove(UInt32(index)) != nil ? 0 : value.encodedSizeBound)
            case .counter(let name, _, _): size += name.utf8.count + 20
            }
        }
        return size
    }
}

extension Array where Element == UInt8 {
    mutating func appendBigEndian16(_ value: UInt16) {
        append(UInt8(value >> 8))
        append(UInt8(truncatingIfNeeded: value))
    }

    mutating func appendBigEndian32(_ value: UInt32) {
        for shift in stride(from: 24, through: 0, by: -8) { append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) }
    }

    mutating func appendString(_ string: String) {
        appendVarint(UInt64(string.utf8.count))
        append(contentsOf: string.utf8)
    }

    mutating func appendVersionVector(_ vector: VersionVector) {
        let entries = vector.sorted
        appendVarint(UInt64(entries.count))
        for (site, seq) in entries {
            append(contentsOf: site.bytes)
            appendVarint(seq)
        }
    }
}

extension ByteReader {
    var remaining: Int { count - offset }

    mutating func readBigEndian16() throws(ShoalError) -> UInt16 {
        UInt16(try readByte()) << 8 | UInt16(try readByte())
    }

    mutating func readBigEndian32() throws(ShoalError) -> UInt32 {
        var value: UInt32 = 0
        for _ in 0..<4 { value = value << 8 | UInt32(try readByte()) }
        return value
    }

    mutating func readString() throws(ShoalError) -> String {
        try Self.string(try readStringBytes())
    }

    /// The bytes of a string (its length, then them), not decoded.
    mutating func readStringBytes() throws(ShoalError) -> ArraySlice<UInt8> {
        let count = try readVarint()
        guard count <= UInt64(remaining) else { throw ShoalError.corruptMetadata("string longer than the frame") }
        return try readBytes(Int(count))
    }

    /// `bytes` as a string, refused unless they are UTF-8.
    static func string(_ bytes: ArraySlice<UInt8>) throws(ShoalError) -> String {
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw ShoalError.corruptMetadata("a string that is not UTF-8")
        }
        return string
    }

    mutating func readVersionVector() throws(ShoalError) -> VersionVector {
        let count = try readVarint()
        guard count <= UInt64(remaining / 17) else {
            throw ShoalError.corruptMetadata("version vector longer than the frame")
        }
        var vector = VersionVector()
        for _ in 0..<count {
            guard let site = SiteID(bytes: try readBytes(16)) else { throw ShoalError.corruptMetadata("bad site id") }
            vector.advance(site, to: try readVarint())
        }
        return vector
    }
}

/// The table and column names a batch's changes repeat, each decoded (and checked as UTF-8) once: the same name is then
/// the same string, which later comparisons of it find equal at once.
///
/// Bounded so that a hostile frame costs little more than decoding every name: at most ``capacity`` names of at most
/// ``longestName`` bytes are kept, and a longer name is decoded each time.
struct NameCache {
    private var entries: [(bytes: ArraySlice<UInt8>, name: String)] = []
    /// Beyond this many names, the rest are decoded each time (a batch of a few tables has far fewer).
    static let capacity = 16
    /// Names longer than this are decoded each time.
    static let longestName = 64

    /// Reads a string (its length, then its bytes), the one decoded before when the bytes are the same.
    mutating func read(_ reader: inout ByteReader) throws(ShoalError) -> String {
        let bytes = try reader.readStringBytes()
        guard bytes.count <= Self.longestName else { return try ByteReader.string(bytes) }
        for entry in entries where entry.bytes.count == bytes.count {
            if bytes.isEmpty { return entry.name }
            let same = entry.bytes.withUnsafeBytes { cached in
                bytes.withUnsafeBytes { read in memcmp(cached.baseAddress!, read.baseAddress!, read.count) == 0 }
            }
            if same { return entry.name }
        }
        let name = try ByteReader.string(bytes)
        if entries.count < Self.capacity { entries.append((bytes, name)) }
        return name
    }
}

extension String {
    fileprivate func replacingPrefix(_ prefix: String, with replacement: String) -> String {
        hasPrefix(prefix) ? replacement + dropFirst(prefix.count) : self
    }
}
