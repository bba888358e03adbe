import ShoalCore

/// The delta cursors a store has open, and the rows its own commits touched while any was open.
///
/// An answer's claim is fixed when its cursor opens, and its rows are read batch by batch: a row this store
/// writes in between (a local write, an app's write it stamps, a batch from a third peer) may have overwritten
/// part of a transaction the answer has yet to send. Such rows are noted here, so the cursor can tell them apart
/// from rows unchanged since it opened. (A store in another process on the same file is not seen: its commits
/// change no row this connection notes.)
final class CursorCount {
    private(set) var count = 0
    /// Increases with every row noted.
    private var clock: UInt64 = 0
    private var touched: [TouchedRow: UInt64] = [:]
    /// Set when more rows were touched than are kept: every row counts as touched for cursors opened before.
    private var overflowAt: UInt64?
    private static let maximumRows = 1_000_000

    /// The position a cursor opened now compares against.
    var now: UInt64 { clock }

    func open() { count += 1 }

    func close() {
        count -= 1
        if count == 0 {
            touched.removeAll()
            overflowAt = nil
        }
    }

    /// Notes that a row of table `table` was written (only while a cursor is open).
    func touch(table: Int64, key: [SQLValue]) {
        guard count > 0 else { return }
        clock += 1
        guard overflowAt == nil else { return }
        if touched.count >= Self.maximumRows {
            touched.removeAll()
            overflowAt = clock
            return
        }
        touched[TouchedRow(table: table, key: key)] = clock
    }

    /// Whether the row was written after position `since`.
    func wasTouched(table: Int64, key: [SQLValue], since: UInt64) -> Bool {
        if let overflowAt, overflowAt > since { return true }
        return (touched[TouchedRow(table: table, key: key)] ?? 0) > since
    }
}

private struct TouchedRow: Hashable {
    let table: Int64
    let key: [SQLValue]
}

/// Holds one count of a ``CursorCount`` while it lives.
final class CursorLease {
    private let counter: CursorCount
    /// Where the counter stood when the cursor opened.
    let openedAt: UInt64

    init(_ counter: CursorCount) {
        self.counter = counter
        counter.open()
        openedAt = counter.now
    }

    deinit { counter.close() }
}
