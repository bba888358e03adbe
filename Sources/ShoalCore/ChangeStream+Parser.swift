import Foundation

extension ChangeStream {
    /// Parses a stream one line at a time, as it arrives, so reading and parsing overlap with the sender.
    ///
    /// Feed every line (without its newline) to ``consume(line:)``, then call ``finish()``. Errors name the
    /// line; a line that is not JSON at all is reported as a truncated stream when it turns out to be the last
    /// one (the stream was cut inside it), and as malformed otherwise.
    public struct Parser {
        private var lineNumber = 0
        private var header: Header?
        /// What the header says, once its line was read.
        public private(set) var start: (site: SiteID, since: VersionVector, claim: VersionVector)?
        /// The sender's schema fingerprint, once the header is read (if it carries one).
        public var schema: String? { header?.schema }
        /// The header's heads (``Header/heads``), once it is read.
        public var heads: [Stamp] {
            (header?.heads ?? [:]).compactMap { site, head in
                SiteID(hex: site).map { Stamp(hlc: HLC(rawValue: head.hlc), site: $0, seq: head.seq) }
            }
        }
        private var changes: [Change] = []
        /// Changes read so far, including those already handed over by ``takeChanges()``.
        private var count = 0
        private var ended = false
        /// A line that was not JSON: fatal, but which error it is depends on whether anything follows it.
        private var brokenLine: (number: Int, detail: String)?
        // The previous line's site, table and columns, which the next line almost always repeats.
        private var lastSiteBytes: [UInt8] = []
        private var lastSite = SiteID(high: 0, low: 0)
        private var lastTableBytes: [UInt8] = []
        private var lastTable = ""
        private var columnNames: [(bytes: [UInt8], name: String)] = []

        /// A parser that has read nothing yet.
        public init() {}

        /// How many changes were read so far.
        public var changeCount: Int { count }

        /// How many changes were read and not yet handed over.
        public var pendingCount: Int { changes.count }

        /// Hands over the changes read since the last call, to apply them while the rest is read.
        public mutating func takeChanges() -> [Change] {
            defer { changes.removeAll(keepingCapacity: true) }
            return changes
        }

        /// Parses one line (without its newline).
        public mutating func consume(line: UnsafeBufferPointer<UInt8>) throws(ShoalError) {
            lineNumber += 1
            var scanner = JSONScanner(line)
            scanner.skipWhitespace()
            if scanner.isAtEnd { return }
            if let brokenLine {
                throw ShoalError.malformedStream(line: brokenLine.number, "not a change: \(brokenLine.detail)")
            }
            if ended { throw ShoalError.malformedStream(line: lineNumber, "content after the end-of-stream line") }
            guard header != nil else {
                let parsed = try Self.header(Data(line), lineNumber: lineNumber)
                guard let site = SiteID(hex: parsed.site) else {
                    throw ShoalError.malformedStream(line: lineNumber, "bad site id \"\(parsed.site)\"")
                }
                start = (site, try Self.vector(parsed.since), try Self.vector(parsed.claim))
                header = parsed
                return
            }
            do throws(JSONScanner.Failure) {
                if let change = try parseLine(&scanner) {
                    changes.append(change)
                    count += 1
                } else {
                    ended = true
                }
            } catch {
                switch error {
                case .syntax(let detail): brokenLine = (lineNumber, detail)
                case .content(let detail): throw ShoalError.malformedStream(line: lineNumber, detail)
                }
            }
        }

        /// The whole stream, once every line was given.
        public mutating func finish() throws(ShoalError) -> Contents {
            if let brokenLine {
                throw ShoalError(
                    code: .truncatedStream,
                    message: "the stream ends in the middle of line \(brokenLine.number) (was it cut short?); "
                        + "nothing was applied"
                )
            }
            guard let start else {
                throw ShoalError(
                    code: .truncatedStream,
                    message: "the stream is empty: no header line; nothing was applied"
                )
            }
            guard ended else {
                throw ShoalError(
                    code: .truncatedStream,
                    message: "the stream ends after line \(lineNumber) without its end-of-stream line "
                        + "(was it cut short?); nothing was applied"
                )
            }
            return Contents(
                site: start.site, since: start.since, claim: start.claim, schema: header?.schema, changes: changes
            )
        }

        private static func header(_ data: Data, lineNumber: Int) throws(ShoalError) -> Header {
            guard let parsed = try? JSONDecoder().decode(Header.self, from: data), parsed.format == "shoal-changes"
            else { throw ShoalError.malformedStream(line: lineNumber, "expected a shoal-changes header") }
            guard parsed.version == formatVersion else {
                throw ShoalError.malformedStream(
                    line: lineNumber,
                    "stream format version \(parsed.version) is not supported (this build reads version "
                        + "\(formatVersion))"
                )
            }
            return parsed
        }

        private static func vector(_ entries: [String: UInt64]) throws(ShoalError) -> VersionVector {
            var result = VersionVector()
            for (key, seq) in entries {
                guard let site = SiteID(hex: key) else {
                    throw ShoalError.malformedStream(line: 1, "bad site id \"\(key)\" in a version vector")
                }
                result.advance(site, to: seq)
            }
            return result
        }

        /// One change, or `nil` for the end-of-stream line (whose count is checked).
        private mutating func parseLine(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> Change? {
            var table: String?
            var key: [SQLValue]?
            var causalLength: UInt64?
            var hlc: UInt64?
            var site: SiteID?
            var seq: UInt64?
            var column: String?
            var value: SQLValue?
            var increments: UInt64?
            var decrements: UInt64?
            var previous: Dot?
            var end: Bool?
            var count: UInt64?
            try scanner.expect(0x7B)
            var first = true
            while try scanner.nextMember(first: &first) {
                let name = try scanner.key()
                switch name.count {
                case 1:
                    switch name[0] {
                    case 0x74: table = try tableName(&scanner)
                    case 0x6B: key = try keyValues(&scanner)
                    case 0x68: hlc = try scanner.uint64()
                    case 0x73: site = try siteID(&scanner)
                    case 0x71: seq = try scanner.uint64()
                    case 0x63: column = try columnName(&scanner)
                    case 0x76: value = try Self.value(&scanner)
                    case 0x70: previous = try dot(&scanner)
                    default: try scanner.skipValue()
                    }
                case 2 where name == [0x63, 0x6C]: causalLength = try scanner.uint64()
                case 3 where name == [0x69, 0x6E, 0x63]: increments = try scanner.uint64()
                case 3 where name == [0x64, 0x65, 0x63]: decrements = try scanner.uint64()
                case 3 where name == [0x65, 0x6E, 0x64]: end = try scanner.bool()
                case 5 where name == Array("count".utf8): count = try scanner.uint64()
                default: try scanner.skipValue()
                }
            }
            scanner.skipWhitespace()
            guard scanner.isAtEnd else { throw .syntax("text after the object at column \(scanner.position + 1)") }
            if let end {
                guard end, let count, count == self.count else {
                    throw .content(
                        "the end-of-stream line counts \(count.map(String.init) ?? "no") changes, the stream has "
                            + "\(self.count)"
                    )
                }
                return nil
            }
            guard let table else { throw .content("not a change: missing field \"t\"") }
            guard let key else { throw .content("not a change: missing field \"k\"") }
            guard let causalLength else { throw .content("not a change: missing field \"cl\"") }
            guard let hlc else { throw .content("not a change: missing field \"h\"") }
            guard let site else { throw .content("not a change: missing field \"s\"") }
            guard let seq else { throw .content("not a change: missing field \"q\"") }
            guard seq > 0 else { throw .content("seq must be at least 1") }
            guard causalLength > 0 else { throw .content("causal length must be at least 1") }
            guard !key.isEmpty else { throw .content("empty primary key") }
            let payload: Change.Payload
            switch (column, value, increments, decrements) {
            case (nil, nil, nil, nil):
                payload = .row
            case (let column?, let value?, nil, nil):
                payload = .column(column, value)
            case (let column?, nil, let increments?, let decrements?):
                payload = .counter(column, increments: increments, decrements: decrements)
            default:
                throw .content("a change sets either nothing (row), a value \"v\", or counter totals \"inc\"/\"dec\"")
            }
            if column != nil, causalLength % 2 == 0 {
                throw .content("a column change for a deleted row (even causal length)")
            }
            return Change(
                table: table,
                primaryKey: key,
                payload: payload,
                causalLength: causalLength,
                stamp: Stamp(hlc: HLC(rawValue: hlc), site: site, seq: seq),
                previous: previous
            )
        }

        /// A string's bytes, or `nil` when they equal `known` (checked without a copy when it has no escapes).
        private static func bytes(
            _ scanner: inout JSONScanner,
            unlessEqualTo known: [UInt8]
        ) throws(JSONScanner.Failure) -> [UInt8]? {
            if let plain = try scanner.plainString() {
                return plain.elementsEqual(known) ? nil : Array(plain)
            }
            let bytes = try scanner.stringBytes()
            return bytes == known ? nil : bytes
        }

        private mutating func tableName(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> String {
            guard let bytes = try Self.bytes(&scanner, unlessEqualTo: lastTableBytes) else { return lastTable }
            guard let name = String(validating: bytes, as: UTF8.self) else {
                throw .content("a table name that is not valid UTF-8")
            }
            (lastTableBytes, lastTable) = (bytes, name)
            return name
        }

        private mutating func columnName(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> String {
            if let plain = try scanner.plainString() {
                if let known = columnNames.first(where: { plain.elementsEqual($0.bytes) }) { return known.name }
                return try newColumnName(Array(plain))
            }
            let bytes = try scanner.stringBytes()
            if let known = columnNames.first(where: { $0.bytes == bytes }) { return known.name }
            return try newColumnName(bytes)
        }

        private mutating func newColumnName(_ bytes: [UInt8]) throws(JSONScanner.Failure) -> String {
            guard let name = String(validating: bytes, as: UTF8.self) else {
                throw .content("a column name that is not valid UTF-8")
            }
            if columnNames.count < 256 { columnNames.append((bytes, name)) }
            return name
        }

        private mutating func siteID(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> SiteID {
            guard let bytes = try Self.bytes(&scanner, unlessEqualTo: lastSiteBytes) else { return lastSite }
            guard let site = Self.site(hex: bytes[...]) else {
                throw .content("bad site id \"\(String(decoding: bytes, as: UTF8.self))\"")
            }
            (lastSiteBytes, lastSite) = (bytes, site)
            return site
        }

        private mutating func dot(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> Dot {
            let bytes = try scanner.stringBytes()
            let bad = JSONScanner.Failure.content("bad previous write \"\(String(decoding: bytes, as: UTF8.self))\"")
            guard bytes.count > 33, bytes[32] == 0x3A, let site = Self.site(hex: bytes[..<32]) else { throw bad }
            let digits = bytes[33...]
            guard digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                let seq = digits.withUnsafeBufferPointer({ JSONScanner.parseUnsigned($0) })
            else { throw bad }
            return Dot(site: site, seq: seq)
        }

        private static func site(hex: ArraySlice<UInt8>) -> SiteID? {
            guard hex.count == 32 else { return nil }
            var high: UInt64 = 0
            var low: UInt64 = 0
            for (index, byte) in hex.enumerated() {
                let digit: UInt8
                switch byte {
                case 0x30...0x39: digit = byte - 0x30
                case 0x61...0x66: digit = byte - 0x61 + 10
                case 0x41...0x46: digit = byte - 0x41 + 10
                default: return nil
                }
                if index < 16 { high = high << 4 | UInt64(digit) } else { low = low << 4 | UInt64(digit) }
            }
            return SiteID(high: high, low: low)
        }

        private func keyValues(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> [SQLValue] {
            try scanner.expect(0x5B)
            var values: [SQLValue] = []
            var first = true
            while try scanner.nextElement(first: &first) { values.append(try Self.value(&scanner)) }
            return values
        }

        /// One value in its exact JSON form (see ``ChangeStream``).
        static func value(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> SQLValue {
            switch scanner.peek() {
            case 0x6E:
                try scanner.null()
                return .null
            case 0x22:
                return .text(try scanner.string())
            case 0x7B:
                try scanner.expect(0x7B)
                var result: SQLValue?
                var first = true
                while try scanner.nextMember(first: &first) {
                    let name = String(decoding: try scanner.key(), as: UTF8.self)
                    guard result == nil else { throw .content("a value object with more than one key") }
                    switch name {
                    case "real": result = .real(try real(&scanner))
                    case "blob": result = .blob(try base64(&scanner))
                    case "text_base64": result = .text(bytes: try base64(&scanner))
                    default: throw .content("\"\(name)\" is not a kind of SQLite value")
                    }
                }
                guard let result else { throw .content("an empty value object") }
                return result
            default:
                return .integer(try scanner.int64())
            }
        }

        private static func real(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> Double {
            if scanner.peek() == 0x22 {
                switch try scanner.string() {
                case "inf": return .infinity
                case "-inf": return -.infinity
                case "nan": return .nan
                default: throw .content("a real is a number, \"inf\", \"-inf\" or \"nan\"")
                }
            }
            let token = try scanner.numberToken().bytes
            guard let real = Double(String(decoding: token, as: UTF8.self)) else {
                throw .content("a real that cannot be read")
            }
            return real
        }

        private static func base64(_ scanner: inout JSONScanner) throws(JSONScanner.Failure) -> [UInt8] {
            guard let data = Data(base64Encoded: try scanner.string()) else { throw .content("bad base64") }
            return Array(data)
        }
    }
}
