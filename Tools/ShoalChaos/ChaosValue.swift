import Shoal
import ShoalProcesses

/// A value the harness writes, drawn from a realistic mix: every SQLite type, integer and real extremes,
/// TEXT with NUL bytes and invalid UTF-8, and sizes from empty to several megabytes.
enum ChaosValue {
    /// A value written and read back as itself.
    case plain(SQLValue)
    /// TEXT given as raw bytes, which need not be valid UTF-8.
    case text([UInt8])

    /// The SQL expression that stores the value when `argument` is bound to it.
    var expression: String {
        switch self {
        case .plain: "?"
        case .text: "CAST(? AS TEXT)"
        }
    }

    /// What to bind for ``expression``.
    var argument: SQLValue {
        switch self {
        case .plain(let value): value
        case .text(let bytes): .blob(bytes)
        }
    }

    /// A short description for failure messages (never the payload of a large value).
    var summary: String {
        switch self {
        case .plain(.blob(let bytes)): "blob of \(bytes.count) bytes"
        case .plain(.text(let text)): "text of \(text.utf8.count) bytes"
        case .plain(let value): "\(value)"
        case .text(let bytes): "raw text of \(bytes.count) bytes"
        }
    }

    /// Whether column `column` of row `key` in table `t` holds exactly this value.
    func isStored(in store: Store, column: String, key: Int64) throws -> Bool {
        switch self {
        case .plain(let value):
            let rows = try store.execute("SELECT \(column) FROM t WHERE k = ?", [.integer(key)]).rows
            return rows.first?.first == value
        case .text(let bytes):
            let rows = try store.execute("SELECT typeof(\(column)), hex(\(column)) FROM t WHERE k = ?", [.integer(key)])
                .rows
            return rows.first == [.text("text"), .text(Self.hex(bytes))]
        }
    }

    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        var result = [UInt8]()
        result.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            result.append(digits[Int(byte >> 4)])
            result.append(digits[Int(byte & 15)])
        }
        return String(decoding: result, as: UTF8.self)
    }

    /// Draws one value. Large values are rare so that a run stays quick, but every run of a few seconds
    /// meets some.
    static func random(using random: inout SeededRandom) -> ChaosValue {
        switch Int.random(in: 0..<100, using: &random) {
        case 0..<5:
            return .plain(.null)
        case 5..<25:
            let extremes: [Int64] = [.min, .max, 0, -1, 1 << 53, -(1 << 53) - 1]
            return .plain(
                .integer(
                    Bool.random(using: &random)
                        ? extremes.randomElement(using: &random)!
                        : Int64.random(in: -1_000_000...1_000_000, using: &random)
                )
            )
        case 25..<40:
            let extremes: [Double] = [
                -0.0, .infinity, -.infinity, .leastNonzeroMagnitude, -.leastNormalMagnitude, .greatestFiniteMagnitude,
                0.1, 1e300,
            ]
            return .plain(
                .real(
                    Bool.random(using: &random)
                        ? extremes.randomElement(using: &random)!
                        : Double.random(in: -1e6...1e6, using: &random)
                )
            )
        case 40..<60:
            return .plain(.text("v\(Int.random(in: 0...99_999, using: &random))"))
        case 60..<75:
            // TEXT with a NUL inside, or with bytes that are not UTF-8.
            var bytes = Array("text".utf8)
            for _ in 0..<Int.random(in: 1...12, using: &random) {
                bytes.append([0, 0xFF, 0xC3, 0x80, 0xED, 0xA0, 0x80, 65].randomElement(using: &random)!)
            }
            return .text(bytes)
        case 75..<92:
            return .plain(.blob(bytes(count: Int.random(in: 0...8192, using: &random), using: &random)))
        case 92..<99:
            return .text(
                Array(repeating: UInt8(ascii: "x"), count: Int.random(in: 10_000...300_000, using: &random)) + [0, 0xFE]
            )
        default:
            return .plain(.blob(bytes(count: Int.random(in: 1_000_000...4_000_000, using: &random), using: &random)))
        }
    }

    private static func bytes(count: Int, using random: inout SeededRandom) -> [UInt8] {
        var result = [UInt8]()
        result.reserveCapacity(count + 8)
        while result.count < count {
            withUnsafeBytes(of: random.next()) { result.append(contentsOf: $0) }
        }
        return Array(result.prefix(count))
    }
}
