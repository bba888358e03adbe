import ShoalCore

/// A column's type affinity, from its declared type by SQLite's rules (https://sqlite.org/datatype3.html, 3.1).
///
/// SQLite converts some values as it stores them (a REAL into a TEXT column becomes TEXT, the text `'12'` into
/// an INTEGER column becomes 12). A value captured from a local write is already in its stored form; a remote
/// value that the column would convert can only come from a peer whose column is declared differently, and
/// storing it would leave the cell different from what the merge metadata and the digest record. Apply refuses
/// such values (see ``converts(_:)``).
enum ColumnAffinity: Sendable, Hashable {
    case text, numeric, integer, real, blob

    init(declaredType: String) {
        let type = declaredType.uppercased()
        if type.contains("INT") {
            self = .integer
        } else if type.contains("CHAR") || type.contains("CLOB") || type.contains("TEXT") {
            self = .text
        } else if type.contains("BLOB") || type.isEmpty {
            self = .blob
        } else if type.contains("REAL") || type.contains("FLOA") || type.contains("DOUB") {
            self = .real
        } else {
            self = .numeric
        }
    }

    /// Whether SQLite would store `value` in a column of this affinity as something else (another type, or a
    /// REAL with other bits). Mirrors `applyAffinity` and `sqlite3VdbeIntegerAffinity` of SQLite's VDBE, and
    /// that binding a NaN stores NULL.
    func converts(_ value: SQLValue) -> Bool {
        switch value {
        case .null, .blob: return false
        case .real(let real) where real.isNaN: return true
        case .integer: return self == .text || self == .real
        case .real(let real):
            switch self {
            case .blob: return false
            case .text: return true
            // Stored as an integer when it is one; read back as a REAL, which loses only the sign of -0.0.
            case .real: return real == 0 && real.sign == .minus
            case .integer, .numeric:
                guard let integer = Int64(exactly: real) else { return false }
                return integer != .min && integer != .max
            }
        case .text, .invalidText:
            switch self {
            case .blob, .text: return false
            case .integer, .numeric, .real: return Self.looksNumeric(value.textBytes ?? [])
            }
        }
    }

    /// Whether text is a number as SQLite's `sqlite3AtoF` reads one in full: optional spaces, a sign, digits
    /// with at most one point (at least one digit), an optional exponent with digits, optional spaces.
    static func looksNumeric(_ bytes: [UInt8]) -> Bool {
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || (0x09...0x0D).contains(byte) }
        func isDigit(_ byte: UInt8) -> Bool { (0x30...0x39).contains(byte) }
        var index = 0
        let end = bytes.count
        while index < end, isSpace(bytes[index]) { index += 1 }
        if index < end, bytes[index] == 0x2B || bytes[index] == 0x2D { index += 1 }
        var digits = 0
        while index < end, isDigit(bytes[index]) { index += 1; digits += 1 }
        if index < end, bytes[index] == 0x2E {
            index += 1
            while index < end, isDigit(bytes[index]) { index += 1; digits += 1 }
        }
        guard digits > 0 else { return false }
        if index < end, bytes[index] == 0x65 || bytes[index] == 0x45 {
            index += 1
            if index < end, bytes[index] == 0x2B || bytes[index] == 0x2D { index += 1 }
            var exponentDigits = 0
            while index < end, isDigit(bytes[index]) { index += 1; exponentDigits += 1 }
            guard exponentDigits > 0 else { return false }
        }
        while index < end, isSpace(bytes[index]) { index += 1 }
        return index == end
    }
}
