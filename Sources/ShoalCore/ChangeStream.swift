import Foundation

/// The JSON-lines form of a change set, for `shoal changes | shoal apply` and for files.
///
/// Line 1 is a header (format version, sender site, the version the stream was cut for, what the receiver
/// may claim after applying all of it); then one change per line, ordered by (site, seq); the last line is
/// a trailer with the change count, so a truncated stream is detected rather than half applied.
///
/// A change line is an object with the keys `t` (table), `k` (the primary key's values), `cl` (causal
/// length), `h` (HLC), `s` (site), `q` (seq), and for a column write `c` (column) with `v` (its value), or
/// for a counter `c` with `inc`/`dec` (the site's totals); `p` names the write it overwrote ("site:seq").
///
/// Values are exact, bit for bit:
///
/// | SQLite value | JSON |
/// |---|---|
/// | NULL | `null` |
/// | INTEGER | a number without fraction or exponent (the full Int64 range) |
/// | REAL | `{"real": number}`, printed with the shortest digits that read back to the same bits (`-0.0`, `5e-324`, `1.7976931348623157e+308`); `{"real": "inf"}`, `{"real": "-inf"}` |
/// | TEXT, valid UTF-8 | a string; NUL and other control characters are escaped (`\u0000`) |
/// | TEXT, not valid UTF-8 | `{"text_base64": "<base64 of its bytes>"}` |
/// | BLOB | `{"blob": "<base64>"}` |
///
/// Strings that are not valid UTF-8 (after their escapes) are refused, never replaced with U+FFFD.
public enum ChangeStream {
    /// The stream format version this build writes and reads.
    public static let formatVersion = 1

    /// The first line of a stream.
    public struct Header: Codable, Hashable, Sendable {
        /// Always "shoal-changes".
        public var format: String
        /// The stream format version (``ChangeStream/formatVersion``).
        public var version: Int
        /// The sending database's site id.
        public var site: String
        /// The version vector the stream was cut for: it holds exactly the changes that vector lacks.
        public var since: [String: UInt64]
        /// The version the receiver holds once it has applied the whole stream. The receiver takes it only as
        /// far as the stream proves it (see `Store.apply`).
        public var claim: [String: UInt64]
        /// The sender's schema fingerprint (`Store.schemaFingerprint()`), when it wrote one: a receiver whose
        /// replicated tables would store other rows for the same changes refuses the stream.
        public var schema: String?
        /// Per site `since` names, the latest transaction the sender holds of it within `since`, with its clock (when
        /// it wrote them): a receiver that holds that transaction of its own site with another clock wrote other
        /// content under a number the sender holds (it was restored from an older copy), and refuses the stream.
        public var heads: [String: Head]?

        /// A transaction's number and clock (``heads``).
        public struct Head: Codable, Hashable, Sendable {
            /// Its sequence number.
            public var seq: UInt64
            /// Its clock (``HLC/rawValue``).
            public var hlc: UInt64
        }

        /// The header of a stream from `site`, cut for `since`, that lets the receiver claim `claim`.
        public init(site: SiteID, since: VersionVector, claim: VersionVector, schema: String? = nil, heads: [Stamp] = []) {
            self.schema = schema
            self.heads =
                heads.isEmpty
                ? nil : Dictionary(heads.map { ($0.site.hex, Head(seq: $0.seq, hlc: $0.hlc.rawValue)) }) { $1 }
            self.format = "shoal-changes"
            self.version = ChangeStream.formatVersion
            self.site = site.hex
            self.since = Dictionary(uniqueKeysWithValues: since.entries.map { ($0.key.hex, $0.value) })
            self.claim = Dictionary(uniqueKeysWithValues: claim.entries.map { ($0.key.hex, $0.value) })
        }
    }

    /// A parsed stream.
    public struct Contents: Sendable {
        /// The sending database's site id.
        public var site: SiteID
        /// The version vector the stream was cut for.
        public var since: VersionVector
        /// What the receiver may claim once it has applied the whole stream.
        public var claim: VersionVector
        /// The sender's schema fingerprint, if the stream carries one (``Header/schema``).
        public var schema: String? = nil
        /// The stream's changes, in order.
        public var changes: [Change]
    }

    /// Encodes the header line.
    public static func headerLine(_ header: Header) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Encoding this plain struct cannot fail.
        return String(decoding: (try? encoder.encode(header)) ?? Data(), as: UTF8.self)
    }

    /// Encodes one change as a line (without its newline).
    public static func line(for change: Change) -> String {
        var writer = Writer()
        var bytes: [UInt8] = []
        writer.append(change, to: &bytes)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Encodes the trailer line for a stream of `count` changes.
    public static func trailerLine(count: Int) -> String {
        "{\"count\":\(count),\"end\":true}"
    }

    /// Parses a whole stream; throws ``ShoalError`` naming the first bad line. Blank lines are ignored.
    public static func parse(lines: [Substring]) throws(ShoalError) -> Contents {
        var parser = Parser()
        for line in lines {
            var line = line
            var failure: ShoalError?
            line.withUTF8 { bytes in
                do throws(ShoalError) { try parser.consume(line: bytes) } catch { failure = error }
            }
            if let failure { throw failure }
        }
        return try parser.finish()
    }

    /// The JSON form of a version vector.
    public static func json(_ vector: VersionVector) -> String {
        var bytes: [UInt8] = [0x7B]
        for (index, entry) in vector.sorted.enumerated() {
            if index > 0 { bytes.append(0x2C) }
            bytes.appendJSONString(entry.site.hex)
            bytes.append(0x3A)
            bytes.appendDecimal(entry.seq)
        }
        bytes.append(0x7D)
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Parses a version vector given as JSON: a vector (`{"<site hex>": seq, ...}`), a stream header (its
    /// claim), or a whole `shoal status --json` object (its `version_vector`).
    public static func parseVersionVector(json: String) throws(ShoalError) -> VersionVector {
        var json = json
        let result = json.withUTF8 { bytes -> VersionVector? in
            var scanner = JSONScanner(bytes)
            do {
                let vector = try versionVectorObject(&scanner)
                scanner.skipWhitespace()
                return scanner.isAtEnd ? vector : nil
            } catch {
                return nil
            }
        }
        guard let result else {
            throw ShoalError(
                code: .invalidArgument,
                message: "expected a version vector as JSON, like {\"<site id: 32 hex digits>\": 12}, a stream "
                    + "header, or what `shoal status --json` prints"
            )
        }
        return result
    }

    /// One object: a plain vector, or an object holding one under `version_vector` (status) or `claim` (a
    /// stream header).
    private static func versionVectorObject(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> VersionVector {
        try scanner.expect(0x7B)
        var entries = VersionVector()
        var nested: VersionVector?
        var foreignKey = false
        var first = true
        while try scanner.nextMember(first: &first) {
            let key = String(decoding: try scanner.key(), as: UTF8.self)
            if key == "version_vector" || key == "claim" {
                nested = try plainVector(&scanner)
            } else if let site = SiteID(hex: key), scanner.peek() != 0x7B {
                entries.advance(site, to: try scanner.uint64())
            } else {
                foreignKey = true
                try scanner.skipValue()
            }
        }
        if let nested { return nested }
        guard !foreignKey else { throw .content("not a version vector") }
        return entries
    }

    private static func plainVector(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> VersionVector {
        try scanner.expect(0x7B)
        var vector = VersionVector()
        var first = true
        while try scanner.nextMember(first: &first) {
            guard let site = SiteID(hex: String(decoding: try scanner.key(), as: UTF8.self)) else {
                throw .content("a key that is not a site id")
            }
            vector.advance(site, to: try scanner.uint64())
        }
        return vector
    }
}
