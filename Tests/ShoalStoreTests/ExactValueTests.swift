import Foundation
import ShoalTestSupport
import Testing

@testable import ShoalCore
@testable import ShoalStore
@testable import ShoalProtocol

/// Runs the real `shoal` executable (with `input`'s contents on stdin); returns its standard output, and fails on
/// a non-zero exit.
@discardableResult
func shoal(_ arguments: [String], input: URL? = nil) throws -> String {
    let result = try runProcess(try shoalExecutable(), arguments, input: try input.map { try Data(contentsOf: $0) })
    guard result.status == 0 else {
        throw ShoalError(
            code: .invalidArgument,
            message: "shoal \(arguments.joined(separator: " ")) failed: \(result.stderr)"
        )
    }
    return result.stdout
}

/// `shoal changes --db from [--since …] | shoal apply --db to`, two real processes joined by a pipe; returns
/// what apply printed (stdout and stderr).
@discardableResult
func pipeChanges(from: URL, to: URL, since: String? = nil) throws -> String {
    let executable = try shoalExecutable()
    let changes = Process()
    changes.executableURL = executable
    changes.arguments = ["changes", "--db", from.path] + (since.map { ["--since", $0] } ?? [])
    let apply = Process()
    apply.executableURL = executable
    apply.arguments = ["apply", "--db", to.path]
    let pipe = Pipe()
    changes.standardOutput = pipe
    apply.standardInput = pipe
    let report = Pipe()
    apply.standardOutput = report
    apply.standardError = report
    try changes.run()
    try apply.run()
    // The parent's copies of the pipe's ends must close, or apply never sees the end of its input.
    try pipe.fileHandleForWriting.close()
    try pipe.fileHandleForReading.close()
    let said = String(decoding: report.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    changes.waitUntilExit()
    apply.waitUntilExit()
    guard changes.terminationStatus == 0, apply.terminationStatus == 0 else {
        throw ShoalError(code: .invalidArgument, message: "changes | apply failed: \(said)")
    }
    return said
}

@Suite struct ExactValueTests {
    /// Every kind of value, written through `shoal sql` as a user would.
    private static let rows: [(key: String, value: String)] = [
        ("'a'", "'x'||char(0)||'y'"),
        ("'a'||char(0)||'b'", "CAST(x'61ff62' AS TEXT)"),
        ("CAST(x'ff00fe' AS TEXT)", "x''"),
        ("char(0)", "''"),
        ("'neg0'", "-0.0"),
        ("'zero'", "0.0"),
        ("'inf'", "9e999"),
        ("'-inf'", "-9e999"),
        ("'max'", "1.7976931348623157e308"),
        ("'subnormal'", "4.9406564584124654e-324"),
        ("'tenth'", "0.1"),
        ("'imin'", "-9223372036854775808"),
        ("'imax'", "9223372036854775807"),
        ("'null'", "NULL"),
        ("'nan'", "0.0/0"),  // SQLite stores NULL for NaN
        ("'blob'", "randomblob(2000000)"),
        ("'bytes text'", "CAST(randomblob(300000) AS TEXT)"),
        ("'long text'", "replace(hex(zeroblob(200000)), '0', 'é'||char(0))"),
        ("'utf8 in blob'", "CAST('héllo' AS BLOB)"),
    ]

    private static func snapshot(_ path: URL) throws -> [[SQLValue]] {
        let store = try Store(path: path.path)
        return try store.execute("SELECT hex(k), typeof(k), hex(v), typeof(v), k, v FROM t ORDER BY hex(k)").rows
    }

    @Test func everyValueRoundTripsBitForBitThroughThePipe() throws {
        let directory = try temporaryDirectory("exact")
        defer { try? FileManager.default.removeItem(at: directory) }
        let a = directory.appendingPathComponent("a.db")
        let b = directory.appendingPathComponent("b.db")
        for db in [a, b] {
            try shoal(["init", "--db", db.path])
            try shoal(["sql", "--db", db.path, "CREATE TABLE t(k PRIMARY KEY, v)"])
            try shoal(["replicate", "--db", db.path, "t"])
        }
        for row in Self.rows { try shoal(["sql", "--db", a.path, "INSERT INTO t VALUES (\(row.key), \(row.value))"]) }
        try pipeChanges(from: a, to: b)

        let sent = try Self.snapshot(a)
        let received = try Self.snapshot(b)
        #expect(sent.count == Self.rows.count)
        #expect(received.count == sent.count)
        for (mine, theirs) in zip(sent, received) {
            // hex() and typeof() as SQLite reports them, and the values themselves by bit pattern.
            #expect(mine == theirs, "\(mine.prefix(4))")
        }
        let storeB = try Store(path: b.path)
        #expect(try Store(path: a.path).digest() == storeB.digest())
        // 'a' and 'a'||char(0)||'b' are two rows, each with its own value.
        let pair = try storeB.execute("SELECT hex(v) FROM t WHERE k IN ('a', 'a'||char(0)||'b') ORDER BY length(k)")
            .rows
        #expect(pair == [[.text("780079")], [.text("61FF62")]])
        #expect(try storeB.execute("SELECT v FROM t WHERE k = 'a'").rows == [[.text("x\u{0}y")]])
        #expect(
            try storeB.execute("SELECT v FROM t WHERE k = 'neg0'").rows.first?.first.map(Self.bits) == (-0.0).bitPattern
        )
        #expect(try storeB.execute("SELECT v FROM t WHERE k = 'subnormal'").rows == [[.real(.leastNonzeroMagnitude)]])
        #expect(try storeB.execute("SELECT v FROM t WHERE k = 'inf'").rows == [[.real(.infinity)]])
        #expect(try storeB.execute("SELECT v FROM t WHERE k = 'imin'").rows == [[.integer(.min)]])
        #expect(try storeB.execute("SELECT typeof(v) FROM t WHERE k = 'nan'").rows == [[.text("null")]])

        // Back the other way, after edits on b: still exact, and the digests agree.
        try shoal(["sql", "--db", b.path, "UPDATE t SET v = CAST(x'00ff' AS TEXT) WHERE k = 'a'"])
        try shoal(["sql", "--db", b.path, "UPDATE t SET v = -0.0 WHERE k = 'tenth'"])
        try pipeChanges(from: b, to: a)
        #expect(try Self.snapshot(a) == Self.snapshot(b))
        #expect(try Store(path: a.path).digest() == Store(path: b.path).digest())
    }

    private static func bits(_ value: SQLValue) -> UInt64? {
        if case .real(let real) = value { return real.bitPattern }
        return nil
    }

    @Test func differentStoredBytesMeanDifferentDigests() throws {
        var digests: [StateDigest] = []
        for value in [
            "'x'", "'x'||char(0)||'y'", "CAST(x'78ff' AS TEXT)", "CAST(x'78efbfbd' AS TEXT)", "x'78'", "0.0", "-0.0",
        ] {
            let store = try makeStore()
            try store.execute("CREATE TABLE t(k PRIMARY KEY, v)")
            try store.replicate(table: "t")
            try store.execute("INSERT INTO t VALUES (1, \(value))")
            digests.append(try store.digest())
        }
        // -0.0 and 0.0 only differ if SQLite keeps the sign; every other pair must differ.
        #expect(Set(digests.dropLast()).count == digests.count - 1)
    }

    @Test func theLivePathCarriesEveryValueExactly() throws {
        let source = try makeStore()
        let target = try makeStore()
        for store in [source, target] {
            try store.execute("CREATE TABLE t(k PRIMARY KEY, v)")
            try store.replicate(table: "t")
        }
        for row in Self.rows { try source.execute("INSERT INTO t VALUES (\(row.key), \(row.value))") }
        // Through the wire codec, as a batch travels between nodes.
        for batch in try source.changes(since: VersionVector()) {
            let message = WireMessage.changeBatch(ChangeBatchMessage(requestID: 1, isLast: true, batch: batch))
            let decoded = try WireMessage.decode(message.encoded())
            guard case .changeBatch(let received) = decoded else {
                Issue.record("not a batch")
                continue
            }
            #expect(received.batch == batch)
            try target.apply(received.batch.changes, claim: received.batch.claim)
        }
        let query = "SELECT hex(k), typeof(k), hex(v), typeof(v), k, v FROM t ORDER BY hex(k)"
        #expect(try source.execute(query).rows == target.execute(query).rows)
        #expect(try source.digest() == target.digest())
    }
}
