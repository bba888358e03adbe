/// Reads one JSON text from bytes, one token at a time, for the change stream's lines (fast, no allocation
/// per token beyond the strings it returns).
///
/// Strings must be valid UTF-8 once their escapes are resolved: a string that is not (or a lone surrogate
/// escape) is an error, never replaced. Errors are ``JSONScanner/Failure`` values: `syntax` when the text is
/// not JSON at all (so a line cut short can be told from a wrong field), `content` otherwise.
struct JSONScanner {
    enum Failure: Error {
        case syntax(String)
        case content(String)
    }

    private let base: UnsafePointer<UInt8>
    private let end: Int
    private(set) var position = 0

    init(_ buffer: UnsafeBufferPointer<UInt8>) {
        // An empty buffer may have no base address; nothing is read from it then (every read checks `end`).
        self.base = buffer.baseAddress ?? UnsafePointer(bitPattern: 1)!
        self.end = buffer.count
    }

    var isAtEnd: Bool { position >= end }

    mutating func skipWhitespace() {
        while position < end {
            switch base[position] {
            case 0x20, 0x09, 0x0A, 0x0D: position += 1
            default: return
            }
        }
    }

    /// The next byte that is not whitespace, without consuming it (`nil` at the end).
    mutating func peek() -> UInt8? {
        skipWhitespace()
        return position < end ? base[position] : nil
    }

    mutating func expect(_ byte: UInt8) throws(Failure) {
        guard peek() == byte else { throw unexpected("\"\(Character(Unicode.Scalar(byte)))\"") }
        position += 1
    }

    /// Consumes `byte` if it comes next.
    mutating func consume(_ byte: UInt8) -> Bool {
        guard peek() == byte else { return false }
        position += 1
        return true
    }

    /// After an object's `{` (or a value), whether another member follows: consumes `,` or the closing `}`.
    mutating func nextMember(first: inout Bool) throws(Failure) -> Bool {
        if first {
            first = false
            if consume(0x7D) { return false }
            return true
        }
        if consume(0x2C) { return true }
        try expect(0x7D)
        return false
    }

    /// Like ``nextMember(first:)`` for arrays (`,` or `]`).
    mutating func nextElement(first: inout Bool) throws(Failure) -> Bool {
        if first {
            first = false
            if consume(0x5D) { return false }
            return true
        }
        if consume(0x2C) { return true }
        try expect(0x5D)
        return false
    }

    /// An object key and its colon.
    mutating func key() throws(Failure) -> [UInt8] {
        let name = try stringBytes()
        try expect(0x3A)
        return name
    }

    func unexpected(_ wanted: String) -> Failure {
        position < end
            ? .syntax("expected \(wanted) at column \(position + 1)")
            : .syntax("expected \(wanted), the line ends")
    }

    mutating func null() throws(Failure) {
        try literal("null")
    }

    mutating func bool() throws(Failure) -> Bool {
        switch peek() {
        case 0x74:
            try literal("true")
            return true
        case 0x66:
            try literal("false")
            return false
        default: throw .content("expected true or false at column \(position + 1)")
        }
    }

    private mutating func literal(_ text: StaticString) throws(Failure) {
        skipWhitespace()
        let count = text.utf8CodeUnitCount
        guard end - position >= count else { throw unexpected("\(text)") }
        for index in 0..<count where base[position + index] != text.utf8Start[index] {
            throw unexpected("\(text)")
        }
        position += count
    }

    /// The bytes of a number token, and whether it is a plain integer (no fraction, no exponent).
    mutating func numberToken() throws(Failure) -> (bytes: UnsafeBufferPointer<UInt8>, isInteger: Bool) {
        skipWhitespace()
        let start = position
        var isInteger = true
        if position < end, base[position] == 0x2D { position += 1 }
        let digitsStart = position
        while position < end, base[position] >= 0x30, base[position] <= 0x39 { position += 1 }
        guard position > digitsStart else { throw unexpected("a number") }
        if base[digitsStart] == 0x30, position - digitsStart > 1 { throw .syntax("a number with a leading zero") }
        if position < end, base[position] == 0x2E {
            isInteger = false
            position += 1
            let fraction = position
            while position < end, base[position] >= 0x30, base[position] <= 0x39 { position += 1 }
            guard position > fraction else { throw unexpected("digits after the decimal point") }
        }
        if position < end, base[position] == 0x65 || base[position] == 0x45 {
            isInteger = false
            position += 1
            if position < end, base[position] == 0x2B || base[position] == 0x2D { position += 1 }
            let exponent = position
            while position < end, base[position] >= 0x30, base[position] <= 0x39 { position += 1 }
            guard position > exponent else { throw unexpected("exponent digits") }
        }
        return (UnsafeBufferPointer(start: base + start, count: position - start), isInteger)
    }

    mutating func uint64() throws(Failure) -> UInt64 {
        let (bytes, isInteger) = try numberToken()
        guard isInteger, bytes.first != 0x2D, let value = Self.parseUnsigned(bytes) else {
            throw .content("expected a whole number from 0 to \(UInt64.max)")
        }
        return value
    }

    mutating func int64() throws(Failure) -> Int64 {
        let (bytes, isInteger) = try numberToken()
        guard isInteger, let value = Self.parseSigned(bytes) else {
            throw .content("expected a whole number from \(Int64.min) to \(Int64.max)")
        }
        return value
    }

    static func parseUnsigned(_ digits: UnsafeBufferPointer<UInt8>) -> UInt64? {
        var value: UInt64 = 0
        for digit in digits {
            let (times10, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(digit &- 0x30))
            guard !overflow1, !overflow2 else { return nil }
            value = sum
        }
        return value
    }

    static func parseSigned(_ bytes: UnsafeBufferPointer<UInt8>) -> Int64? {
        let negative = bytes.first == 0x2D
        guard let magnitude = parseUnsigned(UnsafeBufferPointer(rebasing: bytes[(negative ? 1 : 0)...])) else {
            return nil
        }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? .min : -Int64(magnitude)
        }
        guard magnitude <= UInt64(Int64.max) else { return nil }
        return Int64(magnitude)
    }

    /// A string as a Swift `String`; its bytes must be valid UTF-8.
    mutating func string() throws(Failure) -> String {
        let start = position
        if let plain = try plainString() {
            guard let string = String(validating: plain, as: UTF8.self) else {
                position = start
                throw .content("a string that is not valid UTF-8")
            }
            return string
        }
        let bytes = try stringBytes()
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw .content("a string that is not valid UTF-8")
        }
        return string
    }

    /// A string without escapes, as the bytes between its quotes (consumed); `nil` (nothing consumed) when it
    /// has escapes.
    mutating func plainString() throws(Failure) -> UnsafeBufferPointer<UInt8>? {
        skipWhitespace()
        guard position < end, base[position] == 0x22 else { throw unexpected("a string") }
        var scan = position + 1
        while scan < end {
            let byte = base[scan]
            if byte == 0x22 {
                let result = UnsafeBufferPointer(start: base + position + 1, count: scan - position - 1)
                position = scan + 1
                return result
            }
            if byte == 0x5C { return nil }
            if byte < 0x20 { throw .syntax("a control character inside a string at column \(scan + 1)") }
            scan += 1
        }
        position = end
        throw .syntax("a string that never ends")
    }

    /// A string's bytes with its escapes resolved (UTF-8 is not checked here).
    mutating func stringBytes() throws(Failure) -> [UInt8] {
        if let plain = try plainString() { return Array(plain) }
        position += 1
        var result: [UInt8] = []
        while position < end {
            let byte = base[position]
            position += 1
            switch byte {
            case 0x22:
                return result
            case 0x5C:
                guard position < end else { break }
                let escape = base[position]
                position += 1
                switch escape {
                case 0x22, 0x5C, 0x2F: result.append(escape)
                case 0x62: result.append(0x08)
                case 0x66: result.append(0x0C)
                case 0x6E: result.append(0x0A)
                case 0x72: result.append(0x0D)
                case 0x74: result.append(0x09)
                case 0x75:
                    var scalar = try hex4()
                    if (0xD800..<0xDC00).contains(scalar) {
                        guard end - position >= 6, base[position] == 0x5C, base[position + 1] == 0x75 else {
                            throw .content("a lone surrogate escape in a string")
                        }
                        position += 2
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else {
                            throw .content("a lone surrogate escape in a string")
                        }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00..<0xE000).contains(scalar) {
                        throw .content("a lone surrogate escape in a string")
                    }
                    result.append(contentsOf: String(Character(Unicode.Scalar(scalar)!)).utf8)
                default:
                    throw .syntax("a bad escape in a string at column \(position)")
                }
            default:
                if byte < 0x20 { throw .syntax("a control character inside a string at column \(position)") }
                result.append(byte)
            }
        }
        throw .syntax("a string that never ends")
    }

    private mutating func hex4() throws(Failure) -> UInt32 {
        guard end - position >= 4 else { throw .syntax("a \\u escape cut short") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = base[position]
            position += 1
            let digit: UInt8
            switch byte {
            case 0x30...0x39: digit = byte - 0x30
            case 0x41...0x46: digit = byte - 0x41 + 10
            case 0x61...0x66: digit = byte - 0x61 + 10
            default: throw .syntax("a bad \\u escape")
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }

    /// Skips any JSON value.
    mutating func skipValue(depth: Int = 0) throws(Failure) {
        guard depth < 64 else { throw .content("nesting too deep") }
        switch peek() {
        case 0x22: _ = try stringBytes()
        case 0x7B:
            position += 1
            var first = true
            while try nextMember(first: &first) {
                _ = try key()
                try skipValue(depth: depth + 1)
            }
        case 0x5B:
            position += 1
            var first = true
            while try nextElement(first: &first) { try skipValue(depth: depth + 1) }
        case 0x74, 0x66: _ = try bool()
        case 0x6E: try null()
        default: _ = try numberToken()
        }
    }
}

/// Appends JSON tokens to a byte buffer.
extension Array where Element == UInt8 {
    /// Appends `string` as a JSON string: quotes, backslashes and control characters escaped (NUL as
    /// `\u0000`), everything else as its UTF-8 bytes.
    mutating func appendJSONString(_ string: String) {
        append(0x22)
        var string = string
        string.withUTF8 { bytes in
            var runStart = 0
            for (index, byte) in bytes.enumerated() where byte < 0x20 || byte == 0x22 || byte == 0x5C {
                append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<index]))
                runStart = index + 1
                switch byte {
                case 0x22: append(contentsOf: [0x5C, 0x22])
                case 0x5C: append(contentsOf: [0x5C, 0x5C])
                case 0x0A: append(contentsOf: [0x5C, 0x6E])
                case 0x0D: append(contentsOf: [0x5C, 0x72])
                case 0x09: append(contentsOf: [0x5C, 0x74])
                default:
                    let digits: [UInt8] = Array("0123456789abcdef".utf8)
                    append(contentsOf: [0x5C, 0x75, 0x30, 0x30, digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
                }
            }
            append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart...]))
        }
        append(0x22)
    }

    mutating func appendDecimal(_ value: UInt64) {
        if value < 10 {
            append(0x30 + UInt8(value))
            return
        }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var remaining = value
            var count = 0
            while remaining > 0 {
                digits[19 - count] = 0x30 + UInt8(remaining % 10)
                remaining /= 10
                count += 1
            }
            append(contentsOf: UnsafeBufferPointer(rebasing: digits[(20 - count)...]))
        }
    }

    mutating func appendDecimal(_ value: Int64) {
        if value < 0 { append(0x2D) }
        appendDecimal(value.magnitude)
    }

    mutating func appendASCII(_ text: StaticString) {
        append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }
}
