import ShoalCore

/// One sealed change set as the relay stores it: a clear header the relay reads (cluster, site, the range of the
/// site's sequence numbers it belongs to, its place in that range) and a body sealed with the cluster's key, which
/// the relay cannot read.
///
/// A site's changes reach the relay as *ranges*: the changes of its transactions after `from` up to and including
/// `to` that still have an effect. A range travels as one or more chunks (``index`` 0, 1, …); the last chunk has
/// ``Flags/rangeEnd`` and names `to`. Chunks concatenated up to one with ``Flags/batchEnd`` are the sealed bodies of
/// one encoded change batch. The relay keeps, per site, one chain of ranges, each starting where the one before
/// ended: a range is taken only when `from` is the relay's head for that site, so a pull can hand them out in order.
///
/// Byte layout (big-endian):
/// ```
/// "SHRL" version:u8 flags:u8 cluster-length:u8 cluster:UTF-8 epoch:u32 site:16 from:u64 to:u64 upload:u64
/// index:u32 sealed-length:u32 sealed
/// ```
/// Everything before `sealed` is the header, which the seal authenticates (``header``): a body moved to another
/// cluster, site, range or place fails its seal.
public struct RelayEnvelope: Hashable, Sendable {
    /// The first four bytes: "SHRL".
    public static let magic: [UInt8] = Array("SHRL".utf8)
    /// The envelope format this build writes and reads.
    public static let formatVersion: UInt8 = 1
    /// The longest cluster id an envelope carries, in bytes.
    public static let maximumClusterBytes = 64
    /// The header's size without the cluster id.
    public static let fixedHeaderBytes = 4 + 1 + 1 + 1 + 4 + 16 + 8 + 8 + 8 + 4
    /// The smallest sealed body: a 12-byte nonce and a 16-byte tag around no bytes.
    public static let minimumSealedBytes = 28

    /// Where a chunk stands in its batch and range.
    public struct Flags: OptionSet, Hashable, Sendable {
        /// The flag byte.
        public let rawValue: UInt8
        /// Flags from their byte.
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// The last chunk of an encoded change batch.
        public static let batchEnd = Flags(rawValue: 1)
        /// The last chunk of the range: it names ``RelayEnvelope/to``.
        public static let rangeEnd = Flags(rawValue: 2)
        /// Every flag this build knows.
        public static let known: Flags = [.batchEnd, .rangeEnd]
    }

    /// The cluster the changes belong to.
    public var cluster: String
    /// Which of the cluster's sealing keys sealed the body.
    public var epoch: UInt32
    /// The site whose transactions these are.
    public var site: SiteID
    /// The range starts after this sequence number (the relay's head for the site when the range was cut).
    public var from: UInt64
    /// The range's last sequence number: set on the chunk with ``Flags/rangeEnd``, 0 on the others.
    public var to: UInt64
    /// A random number the uploader picks per range, so that chunks of two uploads of one range never mix.
    public var upload: UInt64
    /// The chunk's place in its range, from 0.
    public var index: UInt32
    /// Where the chunk stands in its batch and range.
    public var flags: Flags
    /// The sealed body: nonce, ciphertext and tag.
    public var sealed: [UInt8]

    /// An envelope; ``validate()`` checks that its fields agree.
    public init(
        cluster: String,
        epoch: UInt32,
        site: SiteID,
        from: UInt64,
        to: UInt64,
        upload: UInt64,
        index: UInt32,
        flags: Flags,
        sealed: [UInt8]
    ) {
        self.cluster = cluster
        self.epoch = epoch
        self.site = site
        self.from = from
        self.to = to
        self.upload = upload
        self.index = index
        self.flags = flags
        self.sealed = sealed
    }

    /// Whether this chunk ends its range.
    public var endsRange: Bool { flags.contains(.rangeEnd) }

    /// The header bytes: what the seal authenticates besides the body.
    public var header: [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.fixedHeaderBytes + cluster.utf8.count)
        bytes += Self.magic
        bytes.append(Self.formatVersion)
        bytes.append(flags.rawValue)
        bytes.append(UInt8(truncatingIfNeeded: cluster.utf8.count))
        bytes += cluster.utf8
        Self.append(UInt64(epoch), bytes: 4, to: &bytes)
        bytes += site.bytes
        Self.append(from, bytes: 8, to: &bytes)
        Self.append(to, bytes: 8, to: &bytes)
        Self.append(upload, bytes: 8, to: &bytes)
        Self.append(UInt64(index), bytes: 4, to: &bytes)
        return bytes
    }

    /// The whole envelope's bytes.
    public func encoded() -> [UInt8] {
        var bytes = header
        Self.append(UInt64(sealed.count), bytes: 4, to: &bytes)
        bytes += sealed
        return bytes
    }

    /// The envelope's encoded size.
    public var encodedCount: Int { Self.fixedHeaderBytes + cluster.utf8.count + 4 + sealed.count }

    /// Checks that the fields agree: a cluster id of 1 to 64 bytes, known flags, `to` named only by the range's
    /// last chunk and beyond `from`, a range end that also ends its batch, a sealed body at least nonce and tag long.
    public func validate() throws(ShoalError) {
        func refuse(_ why: String) -> ShoalError {
            ShoalError(code: .malformedMessage, message: "malformed change set: \(why)")
        }
        guard (1...Self.maximumClusterBytes).contains(cluster.utf8.count) else {
            throw refuse("the cluster id must be 1 to \(Self.maximumClusterBytes) bytes")
        }
        guard Self.Flags.known.isSuperset(of: flags) else { throw refuse("unknown flags \(flags.rawValue)") }
        if endsRange {
            guard to > from else { throw refuse("the range ends at \(to), not after its start \(from)") }
            guard flags.contains(.batchEnd) else { throw refuse("the range's last chunk must end its batch") }
        } else {
            guard to == 0 else { throw refuse("only the range's last chunk names its end") }
        }
        guard sealed.count >= Self.minimumSealedBytes else { throw refuse("the sealed body is shorter than its seal") }
    }

    /// Decodes one envelope that fills `bytes` exactly, and validates it.
    public static func decode(_ bytes: ArraySlice<UInt8>) throws(ShoalError) -> RelayEnvelope {
        var reader = ByteReader(bytes)
        guard try reader.bytes(4) == ArraySlice(magic) else {
            throw ShoalError(code: .malformedMessage, message: "malformed change set: it does not start with SHRL")
        }
        let version = try reader.integer(1)
        guard version == UInt64(formatVersion) else {
            throw ShoalError(
                code: .versionMismatch,
                message: "change set format \(version) is not one this build reads (it reads \(formatVersion))"
            )
        }
        let flags = Flags(rawValue: UInt8(try reader.integer(1)))
        let clusterLength = Int(try reader.integer(1))
        guard let cluster = String(validating: try reader.bytes(clusterLength), as: UTF8.self) else {
            throw ShoalError(code: .malformedMessage, message: "malformed change set: the cluster id is not UTF-8")
        }
        let epoch = UInt32(try reader.integer(4))
        let site = SiteID(bytes: try reader.bytes(16))!
        let from = try reader.integer(8)
        let to = try reader.integer(8)
        let upload = try reader.integer(8)
        let index = UInt32(try reader.integer(4))
        let sealedLength = Int(try reader.integer(4))
        let sealed = Array(try reader.bytes(sealedLength))
        guard reader.isAtEnd else {
            throw ShoalError(code: .malformedMessage, message: "malformed change set: bytes after its sealed body")
        }
        let envelope = RelayEnvelope(
            cluster: cluster,
            epoch: epoch,
            site: site,
            from: from,
            to: to,
            upload: upload,
            index: index,
            flags: flags,
            sealed: sealed
        )
        try envelope.validate()
        return envelope
    }

    /// The site an encoded envelope's header names, if its header reads that far (the rest may be malformed).
    public static func site(ofEncoded bytes: ArraySlice<UInt8>) -> SiteID? {
        var reader = ByteReader(bytes)
        guard (try? reader.bytes(4)) == ArraySlice(magic), (try? reader.integer(1)) == UInt64(formatVersion),
            (try? reader.integer(1)) != nil, let clusterLength = try? reader.integer(1),
            (try? reader.bytes(Int(clusterLength))) != nil, (try? reader.integer(4)) != nil,
            let site = try? reader.bytes(16)
        else { return nil }
        return SiteID(bytes: site)
    }

    static func append(_ value: UInt64, bytes count: Int, to bytes: inout [UInt8]) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) {
            bytes.append(UInt8(truncatingIfNeeded: value >> UInt64(shift)))
        }
    }
}

/// A list of envelopes as one body: each one's length (u32, big-endian), then its bytes.
public enum RelayEnvelopeList {
    /// The body holding `envelopes`.
    public static func encode(_ envelopes: [RelayEnvelope]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(envelopes.reduce(0) { $0 + 4 + $1.encodedCount })
        for envelope in envelopes { appendEncoded(envelope.encoded(), to: &bytes) }
        return bytes
    }

    /// Appends one already encoded envelope, with its length, to a body.
    public static func appendEncoded(_ encoded: [UInt8], to bytes: inout [UInt8]) {
        RelayEnvelope.append(UInt64(encoded.count), bytes: 4, to: &bytes)
        bytes += encoded
    }

    /// One entry of a body: an envelope, or one that does not decode, with its site when its header names one.
    public enum Entry: Sendable {
        /// A valid envelope.
        case envelope(RelayEnvelope)
        /// Bytes that are no valid envelope (flipped, cut, or of another format), with the site their header names if
        /// that much of it reads, and why.
        case undecodable(site: SiteID?, ShoalError)
    }

    /// The entries of a body, each at most `maximumEnvelopeBytes` long: one envelope that does not decode costs only
    /// itself (and its site), never the rest of the body. A body whose framing is broken (it ends inside an entry, or
    /// an entry is over the limit) is refused whole.
    public static func decodeEntries(_ bytes: [UInt8], maximumEnvelopeBytes: Int) throws(ShoalError) -> [Entry] {
        var reader = ByteReader(bytes[...])
        var entries: [Entry] = []
        while !reader.isAtEnd {
            let length = Int(try reader.integer(4))
            guard length <= reader.remaining else {
                throw ShoalError(code: .truncatedStream, message: "truncated change set list: it ends inside a change set")
            }
            guard length <= maximumEnvelopeBytes else {
                throw ShoalError(
                    code: .frameTooLarge,
                    message: "a change set of \(length) bytes is over the limit of \(maximumEnvelopeBytes)"
                )
            }
            let entry = try reader.bytes(length)
            do {
                entries.append(.envelope(try RelayEnvelope.decode(entry)))
            } catch {
                entries.append(.undecodable(site: RelayEnvelope.site(ofEncoded: entry), error))
            }
        }
        return entries
    }

    /// The envelopes of a body, each validated, each at most `maximumEnvelopeBytes` long; a truncated or malformed
    /// body is refused whole.
    public static func decode(_ bytes: [UInt8], maximumEnvelopeBytes: Int) throws(ShoalError) -> [RelayEnvelope] {
        var reader = ByteReader(bytes[...])
        var envelopes: [RelayEnvelope] = []
        while !reader.isAtEnd {
            let length = Int(try reader.integer(4))
            guard length <= reader.remaining else {
                throw ShoalError(code: .truncatedStream, message: "truncated change set list: it ends inside a change set")
            }
            guard length <= maximumEnvelopeBytes else {
                throw ShoalError(
                    code: .frameTooLarge,
                    message: "a change set of \(length) bytes is over the limit of \(maximumEnvelopeBytes)"
                )
            }
            envelopes.append(try RelayEnvelope.decode(try reader.bytes(length)))
        }
        return envelopes
    }
}

/// Reads big-endian fields from bytes, refusing to read past their end.
struct ByteReader {
    private let bytes: ArraySlice<UInt8>
    private var position: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        position = bytes.startIndex
    }

    var isAtEnd: Bool { position == bytes.endIndex }

    var remaining: Int { bytes.endIndex - position }

    mutating func bytes(_ count: Int) throws(ShoalError) -> ArraySlice<UInt8> {
        guard count >= 0, bytes.endIndex - position >= count else {
            throw ShoalError(code: .truncatedStream, message: "truncated change set: it ends inside a field")
        }
        defer { position += count }
        return bytes[position..<position + count]
    }

    mutating func integer(_ count: Int) throws(ShoalError) -> UInt64 {
        var value: UInt64 = 0
        for byte in try bytes(count) { value = value << 8 | UInt64(byte) }
        return value
    }
}
