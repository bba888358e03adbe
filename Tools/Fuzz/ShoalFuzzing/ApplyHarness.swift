import Logging
import ShoalCore
import ShoalProtocol
import ShoalStore

extension ShoalFuzzing {
    /// The wall clock of every fuzzed store: fixed, so that an input does the same thing on every run.
    struct FixedClock: WallClock {
        func nowMilliseconds() -> UInt64 { ApplyFixture.now }
    }

    /// One in-memory store per process with a few replicated tables of varied shapes, made again only after an
    /// input changed it: a refused batch must leave it as it was, which the harness checks. Not thread-safe: one
    /// thread at a time, as libFuzzer runs it (the corpus-replay suite is serialized).
    final class ApplyFixture {
        /// 2025-01-01T00:00:00Z.
        static let now: UInt64 = 1_735_689_600_000
        static let schema = [
            "CREATE TABLE notes(id INTEGER PRIMARY KEY, title TEXT, body BLOB, score REAL)",
            "CREATE TABLE pairs(a TEXT NOT NULL, b INTEGER NOT NULL, v, label TEXT NOT NULL DEFAULT '', "
                + "PRIMARY KEY(a, b)) WITHOUT ROWID",
            "CREATE TABLE tallies(k BLOB PRIMARY KEY, hits INTEGER NOT NULL DEFAULT 0, misses INTEGER DEFAULT 0, "
                + "note TEXT)",
        ]
        /// Tables, key columns, other columns and counters, as the harness's byte decoder names them.
        static let tables: [(name: String, keys: Int, columns: [String], counters: Set<String>)] = [
            ("notes", 1, ["title", "body", "score"], []),
            ("pairs", 2, ["v", "label"], []),
            ("tallies", 1, ["hits", "misses", "note"], ["hits", "misses"]),
        ]

        let store: Store
        let digest: StateDigest
        let vector: VersionVector

        init() {
            var options = StoreOptions()
            options.clock = FixedClock()
            options.conflictLogLimit = 16
            // Refusals are logged; thousands a second would cost more than the apply itself.
            options.logger = Logger(label: "shoal.fuzz", factory: { _ in SwiftLogNoOpLogHandler() })
            do throws(ShoalError) {
                store = try Store(path: ":memory:", options: options)
                for sql in Self.schema { _ = try store.execute(sql) }
                for table in Self.tables { try store.replicate(table: table.name, counters: table.counters.sorted()) }
                digest = try store.digest()
                vector = try store.versionVector()
            } catch {
                fatalError("cannot set up the apply fixture: \(error)")
            }
        }

        nonisolated(unsafe) static var current: ApplyFixture?
    }

    /// Decodes the bytes into a change batch and applies it to a fresh store.
    ///
    /// The first byte picks the decoder: even, the rest is a wire message (a change batch, as a peer sends it);
    /// odd, the rest drives a decoder that picks tables, columns, sites and clocks mostly among those that
    /// exist, so that most batches get past the first checks. A refused batch must write nothing; an applied
    /// one must leave a store whose maintained digest matches a full scan, and applying it again must change
    /// nothing.
    public static func fuzzApply(_ bytes: UnsafeRawBufferPointer) {
        guard let mode = bytes.first else { return }
        let fixture = ApplyFixture.current ?? ApplyFixture()
        ApplyFixture.current = fixture
        let store = fixture.store
        var input = FuzzInput(UnsafeRawBufferPointer(rebasing: bytes.dropFirst()))
        let batch: (changes: [Change], claim: VersionVector, since: VersionVector?)
        if mode & 1 == 0 {
            guard case .changeBatch(let message) = try? WireMessage.decode(Array(input.bytes)) else { return }
            batch = (message.batch.changes, message.batch.claim, nil)
        } else {
            batch = input.batch(site: store.siteID)
        }

        do throws(ShoalError) {
            try store.apply(batch.changes, claim: batch.claim, since: batch.since)
        } catch {
            switch error.code {
            case .sqlite, .corruptMetadata, .uncapturedCommit, .tablePaused, .invalidArgument:
                fatalError("apply failed with \(error)")
            default: break
            }
            // Refused: nothing may have changed.
            do throws(ShoalError) {
                guard try store.digest() == fixture.digest, try store.versionVector() == fixture.vector else {
                    fatalError("a refused batch (\(error)) changed the store")
                }
            } catch {
                fatalError("the store is unreadable after a refused batch: \(error)")
            }
            return
        }
        // Applied: the store is readable, its digest is right, and applying again changes nothing.
        if batch.changes.isEmpty && batch.since == nil { return }  // An idle round: nothing was written.
        ApplyFixture.current = nil
        do throws(ShoalError) {
            let digest = try store.digest()
            guard try store.fullScanDigest() == digest else {
                fatalError("the maintained digest differs from a full scan after applying \(batch.changes)")
            }
            let vector = try store.versionVector()
            try store.apply(batch.changes, claim: batch.claim, since: batch.since)
            guard try store.digest() == digest, try store.versionVector() == vector else {
                fatalError("applying the same batch twice changed the store")
            }
        } catch {
            fatalError("the store is unusable after an apply: \(error)")
        }
    }
}

/// Reads values out of fuzz bytes; past the end it reads zeros, so every input decodes to something.
struct FuzzInput {
    let bytes: UnsafeRawBufferPointer
    var offset = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    mutating func byte() -> UInt8 {
        guard offset < bytes.count else { return 0 }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func uint64() -> UInt64 {
        var value: UInt64 = 0
        for _ in 0..<8 { value = value << 8 | UInt64(byte()) }
        return value
    }

    mutating func raw(_ count: Int) -> [UInt8] {
        (0..<count).map { _ in byte() }
    }

    /// Mostly small numbers, sometimes any.
    mutating func small() -> UInt64 {
        let tag = byte()
        switch tag >> 6 {
        case 3: return uint64()
        default: return UInt64(tag & 0x3F)
        }
    }

    mutating func value() -> SQLValue {
        let tag = byte()
        switch tag % 8 {
        case 0: return .null
        case 1: return .integer(Int64(Int8(bitPattern: byte())))
        case 2: return .integer(Int64(bitPattern: uint64()))
        case 3: return .real(Double(bitPattern: uint64()))
        case 4: return .text(bytes: raw(Int(byte() % 24)))
        case 5: return .blob(raw(Int(byte() % 24)))
        case 6: return .text(String(tag >> 3))
        default: return .integer(Int64(tag >> 3))
        }
    }

    mutating func name(_ known: [String]) -> String {
        let pick = Int(byte())
        if pick < 0xF0 { return known[pick % known.count] }
        return String(decoding: raw(pick & 0x0F), as: UTF8.self)
    }

    mutating func site(_ own: SiteID) -> SiteID {
        switch byte() % 8 {
        case 0: return own
        case 7: return SiteID(high: uint64(), low: uint64())
        case let n: return SiteID(high: 0x5348_4F4C, low: UInt64(n))
        }
    }

    mutating func clock() -> HLC {
        switch byte() % 4 {
        case 0: return HLC(rawValue: uint64())
        // Around the drift bound (five minutes ahead), or up to a few days behind.
        case 1:
            return HLC(milliseconds: ShoalFuzzing.ApplyFixture.now + small() % 64 * 10_000, logical: UInt16(byte()))
        default:
            return HLC(milliseconds: ShoalFuzzing.ApplyFixture.now - small() % 1024 * 300_000, logical: UInt16(byte()))
        }
    }

    mutating func vector(_ own: SiteID) -> VersionVector {
        var vector = VersionVector()
        for _ in 0..<(byte() % 4) { vector.advance(site(own), to: small()) }
        return vector
    }

    mutating func batch(site own: SiteID) -> (changes: [Change], claim: VersionVector, since: VersionVector?) {
        let tables = ShoalFuzzing.ApplyFixture.tables
        let flags = byte()
        var changes: [Change] = []
        for _ in 0..<Int(byte() % 24) {
            let table = tables[Int(byte()) % tables.count]
            let tableName = byte() < 0xF8 ? table.name : name(tables.map(\.name) + ["shoal_meta", ""])
            var keyCount = table.keys
            if byte() >= 0xF0 { keyCount = Int(byte() % 4) }
            let key = (0..<keyCount).map { _ in value() }
            let payload: Change.Payload
            switch byte() % 4 {
            case 0: payload = .row
            case 1:
                payload = .counter(name(table.columns + ["nope"]), increments: small(), decrements: small())
            default: payload = .column(name(table.columns + ["nope"]), value())
            }
            let causalLength = byte() < 0xE0 ? 1 : small()
            let stamp = Stamp(hlc: clock(), site: site(own), seq: small())
            let previous: Dot? = byte() & 1 == 0 ? nil : Dot(site: site(own), seq: small())
            changes.append(
                Change(
                    table: tableName,
                    primaryKey: key,
                    payload: payload,
                    causalLength: causalLength,
                    stamp: stamp,
                    previous: previous
                )
            )
        }
        let claim = flags & 1 != 0 ? vector(own) : VersionVector()
        let since = flags & 2 != 0 ? vector(own) : nil
        return (changes, claim, since)
    }
}
