import Foundation

/// The JSON-lines form of a change set, for `shoal changes | shoal apply` and for files.
///
/// Line 1 is a header (format version, sender site, the version the stream was cut for, what the receiver
/// may claim after applying all of it); then one change per line, ordered by (site, seq); the last line is
/// a trailer with the change count, so a truncated stream is detected rather than half applied.
public enum ChangeStream {
    /// The stream format version this build writes and reads.
    public static let formatVersion = 1

    /// The first line of a stream.
    public struct Header: Codable, Hashable, Sendable {
        /// Always "shoal-changes".
        public var format: String
        public var version: Int
        /// The sending database's site id.
        public var site: String
        /// The version vector the stream was cut for: it holds exactly the changes that vector lacks.
        public var since: [String: UInt64]
        /// The version the receiver holds once it has applied the whole stream.
        public var claim: [String: UInt64]

        public init(site: SiteID, since: VersionVector, claim: VersionVector) {
            self.format = "shoal-changes"
            self.version = ChangeStream.formatVersion
            self.site = site.hex
            self.since = Dictionary(uniqueKeysWithValues: since.entries.map { ($0.key.hex, $0.value) })
            self.claim = Dictionary(uniqueKeysWithValues: claim.entries.map { ($0.key.hex, $0.value) })
        }
    }

    /// A parsed stream.
    public struct Contents: Sendable {
        public var site: SiteID
        public var since: VersionVector
        public var claim: VersionVector
        public var changes: [Change]
    }

    private struct Trailer: Codable {
        var end: Bool
        var count: Int
    }

    /// One change, as a JSON object.
    private struct Line: Codable {
        var t: String  // table
        var k: [JSONValue]  // primary key values
        var cl: UInt64  // causal length
        var h: UInt64  // HLC
        var s: String  // site
        var q: UInt64  // seq
        var c: String?  // column (absent for a row change)
        var v: JSONValue?  // value of a column write
        var inc: UInt64?  // counter contribution
        var dec: UInt64?
        var p: String?  // previous write, "site:seq"

        init(t: String, k: [JSONValue], cl: UInt64, h: UInt64, s: String, q: UInt64) {
            (self.t, self.k, self.cl, self.h, self.s, self.q) = (t, k, cl, h, s, q)
        }

        private enum Keys: String, CodingKey {
            case t, k, cl, h, s, q, c, v, inc, dec, p
        }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: Keys.self)
            t = try container.decode(String.self, forKey: .t)
            k = try container.decode([JSONValue].self, forKey: .k)
            cl = try container.decode(UInt64.self, forKey: .cl)
            h = try container.decode(UInt64.self, forKey: .h)
            s = try container.decode(String.self, forKey: .s)
            q = try container.decode(UInt64.self, forKey: .q)
            c = try container.decodeIfPresent(String.self, forKey: .c)
            // A JSON null here is the SQL value NULL, not an absent value.
            v = container.contains(.v) ? try container.decode(JSONValue.self, forKey: .v) : nil
            inc = try container.decodeIfPresent(UInt64.self, forKey: .inc)
            dec = try container.decodeIfPresent(UInt64.self, forKey: .dec)
            p = try container.decodeIfPresent(String.self, forKey: .p)
        }
    }

    /// Encodes the header line.
    public static func headerLine(_ header: Header) -> String {
        encode(header)
    }

    /// Encodes one change as a line.
    public static func line(for change: Change) -> String {
        var line = Line(
            t: change.table,
            k: change.primaryKey.map(JSONValue.init),
            cl: change.causalLength,
            h: change.stamp.hlc.rawValue,
            s: change.stamp.site.hex,
            q: change.stamp.seq
        )
        switch change.payload {
        case .row:
            break
        case .column(let name, let value):
            line.c = name
            line.v = JSONValue(value)
        case .counter(let name, let increments, let decrements):
            line.c = name
            line.inc = increments
            line.dec = decrements
        }
        if let previous = change.previous { line.p = "\(previous.site.hex):\(previous.seq)" }
        return encode(line)
    }

    /// Encodes the trailer line for a stream of `count` changes.
    public static func trailerLine(count: Int) -> String {
        encode(Trailer(end: true, count: count))
    }

    /// Parses a whole stream; throws ``ShoalError`` naming the first bad line. Blank lines are ignored.
    public static func parse(lines: [Substring]) throws(ShoalError) -> Contents {
        // The last line that holds anything: a stream cut inside it is truncated, not malformed.
        let lastContentLine = (lines.lastIndex { !$0.allSatisfy(\.isWhitespace) } ?? -1) + 1
        let decoder = JSONDecoder()
        var header: Header?
        var changes: [Change] = []
        var trailer: Trailer?
        var lineNumber = 0
        for rawLine in lines {
            lineNumber += 1
            let text = rawLine.trimmingCharacters(in: .whitespaces)
            if text.isEmpty { continue }
            let data = Data(text.utf8)
            if trailer != nil {
                throw ShoalError.malformedStream(line: lineNumber, "content after the end-of-stream line")
            }
            guard header != nil else {
                guard let parsed = try? decoder.decode(Header.self, from: data), parsed.format == "shoal-changes"
                else { throw ShoalError.malformedStream(line: lineNumber, "expected a shoal-changes header") }
                guard parsed.version == formatVersion else {
                    throw ShoalError.malformedStream(
                        line: lineNumber,
                        "stream format version \(parsed.version) is not supported "
                            + "(this build reads version \(formatVersion))"
                    )
                }
                header = parsed
                continue
            }
            if let end = try? decoder.decode(Trailer.self, from: data) {
                guard end.end, end.count == changes.count else {
                    throw ShoalError.malformedStream(
                        line: lineNumber,
                        "the end-of-stream line counts \(end.count) changes, the stream has "
                            + "\(changes.count)"
                    )
                }
                trailer = end
                continue
            }
            let line: Line
            do {
                line = try decoder.decode(Line.self, from: data)
            } catch {
                if lineNumber == lastContentLine, (try? JSONSerialization.jsonObject(with: data)) == nil {
                    throw ShoalError(
                        code: .truncatedStream,
                        message: "the stream ends in the middle of line \(lineNumber) (was it cut short?); nothing "
                            + "was applied"
                    )
                }
                throw ShoalError.malformedStream(line: lineNumber, "not a change: \(describe(error))")
            }
            changes.append(try change(from: line, lineNumber: lineNumber))
        }
        guard let header else {
            throw ShoalError(
                code: .truncatedStream,
                message: "the stream is empty: no header line; nothing was applied"
            )
        }
        guard trailer != nil else {
            throw ShoalError(
                code: .truncatedStream,
                message: "the stream ends after line \(lineNumber) without its end-of-stream line "
                    + "(was it cut short?); nothing was applied"
            )
        }
        guard let site = SiteID(hex: header.site) else {
            throw ShoalError.malformedStream(line: 1, "bad site id \"\(header.site)\"")
        }
        return Contents(
            site: site,
            since: try vector(header.since, lineNumber: 1),
            claim: try vector(header.claim, lineNumber: 1),
            changes: changes
        )
    }

    private static func change(from line: Line, lineNumber: Int) throws(ShoalError) -> Change {
        guard let site = SiteID(hex: line.s) else {
            throw ShoalError.malformedStream(line: lineNumber, "bad site id \"\(line.s)\"")
        }
        guard line.q > 0 else { throw ShoalError.malformedStream(line: lineNumber, "seq must be at least 1") }
        guard line.cl > 0 else {
            throw ShoalError.malformedStream(line: lineNumber, "causal length must be at least 1")
        }
        guard !line.k.isEmpty else { throw ShoalError.malformedStream(line: lineNumber, "empty primary key") }
        let payload: Change.Payload
        switch (line.c, line.v, line.inc, line.dec) {
        case (nil, nil, nil, nil):
            payload = .row
        case (let column?, let value?, nil, nil):
            payload = .column(column, value.sqlValue)
        case (let column?, nil, let increments?, let decrements?):
            payload = .counter(column, increments: increments, decrements: decrements)
        default:
            throw ShoalError.malformedStream(
                line: lineNumber,
                "a change sets either nothing (row), a value \"v\", or counter totals \"inc\"/\"dec\""
            )
        }
        if line.c != nil, line.cl % 2 == 0 {
            throw ShoalError.malformedStream(line: lineNumber, "a column change for a deleted row (even causal length)")
        }
        var previous: Dot?
        if let text = line.p {
            let parts = text.split(separator: ":")
            guard parts.count == 2, let site = SiteID(hex: parts[0]), let seq = UInt64(parts[1]) else {
                throw ShoalError.malformedStream(line: lineNumber, "bad previous write \"\(text)\"")
            }
            previous = Dot(site: site, seq: seq)
        }
        return Change(
            table: line.t,
            primaryKey: line.k.map(\.sqlValue),
            payload: payload,
            causalLength: line.cl,
            stamp: Stamp(hlc: HLC(rawValue: line.h), site: site, seq: line.q),
            previous: previous
        )
    }

    private static func vector(_ entries: [String: UInt64], lineNumber: Int) throws(ShoalError) -> VersionVector {
        var result = VersionVector()
        for (key, seq) in entries {
            guard let site = SiteID(hex: key) else {
                throw ShoalError.malformedStream(line: lineNumber, "bad site id \"\(key)\" in a version vector")
            }
            result.advance(site, to: seq)
        }
        return result
    }

    /// Parses a version vector given as JSON (`{"<site hex>": seq, ...}`) or as a stream header.
    public static func parseVersionVector(json: String) throws(ShoalError) -> VersionVector {
        let data = Data(json.utf8)
        let invalid = ShoalError(
            code: .invalidArgument,
            message: "expected a version vector as JSON, like {\"<site id: 32 hex digits>\": 12}, or a stream header"
        )
        if let header = try? JSONDecoder().decode(Header.self, from: data) {
            guard let vector = try? vector(header.claim, lineNumber: 1) else { throw invalid }
            return vector
        }
        guard let entries = try? JSONDecoder().decode([String: UInt64].self, from: data),
            let vector = try? vector(entries, lineNumber: 1)
        else { throw invalid }
        return vector
    }

    /// The JSON form of a version vector.
    public static func json(_ vector: VersionVector) -> String {
        encode(Dictionary(uniqueKeysWithValues: vector.entries.map { ($0.key.hex, $0.value) }))
    }

    private static func encode(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Encoding these plain structs cannot fail.
        return String(decoding: (try? encoder.encode(value)) ?? Data(), as: UTF8.self)
    }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, _): "missing field \"\(key.stringValue)\""
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            "wrong type at \"\(context.codingPath.map(\.stringValue).joined(separator: "."))\""
        case DecodingError.dataCorrupted(let context): context.debugDescription
        default: "invalid JSON"
        }
    }
}

/// A SQLite value in JSON: `null`, an integer number, a string, `{"real": number}` or `{"blob": "base64"}`.
struct JSONValue: Codable {
    let sqlValue: SQLValue

    init(_ value: SQLValue) {
        self.sqlValue = value
    }

    private enum Keys: String, CodingKey {
        case real, blob
    }

    init(from decoder: any Decoder) throws {
        if let container = try? decoder.singleValueContainer() {
            if container.decodeNil() {
                sqlValue = .null
                return
            }
            if let integer = try? container.decode(Int64.self) {
                sqlValue = .integer(integer)
                return
            }
            if let text = try? container.decode(String.self) {
                sqlValue = .text(text)
                return
            }
        }
        let keyed = try decoder.container(keyedBy: Keys.self)
        if let real = try? keyed.decode(Double.self, forKey: .real) {
            sqlValue = .real(real)
        } else if let special = try? keyed.decode(String.self, forKey: .real) {
            switch special {
            case "inf": sqlValue = .real(.infinity)
            case "-inf": sqlValue = .real(-.infinity)
            default:
                throw DecodingError.dataCorruptedError(forKey: .real, in: keyed, debugDescription: "bad real")
            }
        } else if let base64 = try? keyed.decode(String.self, forKey: .blob), let data = Data(base64Encoded: base64) {
            sqlValue = .blob(Array(data))
        } else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "not a SQLite value")
            )
        }
    }

    func encode(to encoder: any Encoder) throws {
        switch sqlValue {
        case .null:
            var container = encoder.singleValueContainer()
            try container.encodeNil()
        case .integer(let value):
            var container = encoder.singleValueContainer()
            try container.encode(value)
        case .text(let value):
            var container = encoder.singleValueContainer()
            try container.encode(value)
        case .real(let value):
            var container = encoder.container(keyedBy: Keys.self)
            if value.isInfinite {
                try container.encode(value > 0 ? "inf" : "-inf", forKey: .real)
            } else {
                try container.encode(value, forKey: .real)
            }
        case .blob(let bytes):
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(Data(bytes).base64EncodedString(), forKey: .blob)
        }
    }
}
