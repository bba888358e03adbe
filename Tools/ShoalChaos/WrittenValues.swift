import ArgumentParser
import Shoal

/// Every value the harness tried to write, per key and column, as SQLite renders it (`typeof(x) || ':' || hex(x)`,
/// which is how ``SQLiteConnection/applicationTableContents()`` reads rows): a row read outside Shoal may hold only
/// what some write put there. Nothing altered on the way (a flipped byte, a chunk of another cluster) can pass.
struct WrittenValues {
    /// "key|column" → the renderings' hashes (the values may be megabytes).
    private var cells: [String: Set<Int>] = [:]
    /// Increments tried per key: a counter never exceeds them.
    private var increments: [Int64: Int] = [:]
    private let scratch: Store

    init() throws {
        scratch = try Store(path: ":memory:")
    }

    /// Notes that `value` may be written to `column` of row `key`.
    mutating func record(key: Int64, column: String, value: ChaosValue) throws {
        let rows = try scratch.execute(
            "SELECT typeof(x) || ':' || coalesce(hex(x), '') FROM (SELECT \(value.expression) AS x)",
            [value.argument]
        ).rows
        guard case .text(let rendering) = rows.first?.first else { throw ChaosError("cannot render \(value.summary)") }
        cells["\(key)|\(column)", default: []].insert(rendering.hashValue)
    }

    /// Notes an increment tried on row `key`'s counter.
    mutating func recordIncrement(key: Int64) {
        increments[key, default: 0] += 1
    }

    /// Checks node `node`'s rows of table `t`, read with a plain SQLite connection (columns k, a, b, n, and the
    /// column `note` the run's app update adds, which holds its default or the one value the update writes).
    func check(node: Int, rows: [String]) throws {
        let noteValues: Set<String> = ["text:6E6F6E65", "text:7570646174656420617070"]  // 'none', 'updated app'
        for row in rows {
            // Each field is `column=rendering`, the columns in the order of their names.
            var named: [String: String] = [:]
            for field in row.split(separator: "|", omittingEmptySubsequences: false) {
                let parts = field.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                if parts.count == 2 { named[String(parts[0])] = String(parts[1]) }
            }
            let expected: Set<String> = ["k", "a", "b", "n"]
            let fields = ["k", "a", "b", "n"].map { named[$0] ?? "" }
            guard Set(named.keys) == expected || (Set(named.keys) == expected.union(["note"])
                    && noteValues.contains(named["note"] ?? "")),
                let key = Self.integer(fields[0]), (0..<12).contains(key)
            else {
                print("FAILED: node\(node) holds a row no write made: \(row.prefix(120))")
                throw ExitCode(1)
            }
            for (column, field, defaults) in [("a", fields[1], ["null:"]), ("b", fields[2], ["null:", "text:6E6577"])] {
                guard defaults.contains(field) || cells["\(key)|\(column)"]?.contains(field.hashValue) == true else {
                    print("FAILED: node\(node)'s row \(key) holds in \(column) a value no write put there: \(field.prefix(120))")
                    throw ExitCode(1)
                }
            }
            guard let counter = Self.integer(fields[3]), counter >= 0, counter <= increments[key] ?? 0 else {
                print(
                    "FAILED: node\(node)'s row \(key) counts \(fields[3]), beyond the \(increments[key] ?? 0) increments made"
                )
                throw ExitCode(1)
            }
        }
    }

    /// The integer a rendering `integer:HEX` holds (hex of its decimal text).
    private static func integer(_ field: String) -> Int64? {
        guard field.hasPrefix("integer:") else { return nil }
        let hex = Array(field.dropFirst("integer:".count).utf8)
        guard hex.count % 2 == 0 else { return nil }
        var text: [UInt8] = []
        for index in stride(from: 0, to: hex.count, by: 2) {
            guard let byte = UInt8(String(decoding: hex[index..<index + 2], as: UTF8.self), radix: 16) else { return nil }
            text.append(byte)
        }
        return Int64(String(decoding: text, as: UTF8.self))
    }
}
