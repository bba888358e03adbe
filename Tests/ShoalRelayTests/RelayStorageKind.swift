import Foundation
import Logging
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// The relay's two storages, each real: SQLite in a temporary directory, PostgreSQL in a database of the test's own
/// (on the server `SHOAL_TEST_POSTGRES_URL` names; a test fails, loudly, when there is none).
enum StorageKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres

    var testDescription: String { rawValue }

    /// A new, empty storage of this kind, and what removes it.
    func open(
        _ name: String
    ) async throws -> (storage: any RelayStorage, where: String, cleanUp: @Sendable () async -> Void) {
        switch self {
        case .sqlite:
            let directory = try temporaryDirectory(name)
            let storage = try SQLiteRelayStorage(directory: directory.path)
            return (storage, directory.path, { try? FileManager.default.removeItem(at: directory) })
        case .postgres:
            let url = try await offPool { try TestPostgres.freshDatabase(name) }
            let storage = try await PostgresRelayStorage.open(
                try PostgresLocation(url: url),
                logger: Logger(label: "test")
            )
            return (storage, url, { await storage.close() })
        }
    }

    /// A new place for a storage of this kind, holding nothing yet: a directory, or a database's URL.
    func emptyPlace(_ name: String) async throws -> String {
        switch self {
        case .sqlite: return try temporaryDirectory(name).path
        case .postgres: return try await offPool { try TestPostgres.freshDatabase(name) }
        }
    }

    /// Runs `sql` directly on the storage at `place` (SQLite's shell, or psql), as an older relay or an operator would.
    func run(_ sql: String, at place: String) async throws {
        switch self {
        case .sqlite:
            let result = try await offPool { try sqlite3Shell(place + "/relay.sqlite", sql) }
            #expect(result.status == 0, "\(result.stderr)")
        case .postgres:
            _ = try await offPool { try TestPostgres.query(place, sql) }
        }
    }

    /// Opens the storage at `place` with this build.
    func open(at place: String) async throws -> any RelayStorage {
        switch self {
        case .sqlite: return try SQLiteRelayStorage(directory: place)
        case .postgres:
            return try await PostgresRelayStorage.open(try PostgresLocation(url: place), logger: Logger(label: "test"))
        }
    }
}

/// Chunks as uploads carry them, for the storage tests.
enum TestChunks {
    /// Chunk `index` of a range of `site` after `from` (ending at `to` when `end`), in cluster `cluster`.
    static func chunk(
        _ site: SiteID,
        from: UInt64,
        to: UInt64 = 0,
        upload: UInt64,
        index: UInt32,
        end: Bool,
        cluster: String = "c",
        bytes: Int = 100
    ) -> (envelope: RelayEnvelope, encoded: [UInt8]) {
        let envelope = RelayEnvelope(
            cluster: cluster,
            epoch: 0,
            site: site,
            from: from,
            to: end ? to : 0,
            upload: upload,
            index: index,
            flags: end ? [.batchEnd, .rangeEnd] : [.batchEnd],
            sealed: Array(repeating: UInt8(truncatingIfNeeded: index), count: bytes)
        )
        return (envelope, envelope.encoded())
    }

    /// A whole range of `count` chunks.
    static func range(
        _ site: SiteID,
        from: UInt64,
        to: UInt64,
        upload: UInt64,
        count: UInt32 = 1,
        cluster: String = "c"
    )
        -> [(envelope: RelayEnvelope, encoded: [UInt8])]
    {
        (0..<count).map {
            chunk(site, from: from, to: to, upload: upload, index: $0, end: $0 == count - 1, cluster: cluster)
        }
    }

    /// Every chunk a node gets pulling from `vector` with pages of `maximumBytes`, page after page, moving its cursor
    /// as a node does: a range's last chunk advances the vector, any other one is a resume point.
    static func pullAll(
        _ storage: any RelayStorage,
        cluster: String = "c",
        from vector: VersionVector = VersionVector(),
        maximumBytes: Int,
        uploader: String? = nil
    ) async throws -> (envelopes: [RelayEnvelope], pages: Int) {
        var vector = vector
        var resume: [SiteID: (from: UInt64, index: UInt32)] = [:]
        var received: [RelayEnvelope] = []
        var pages = 0
        while true {
            let page = try await storage.page(
                cluster: cluster,
                vector: vector,
                resume: resume,
                snapshotSites: [],
                maximumBytes: maximumBytes,
                uploader: uploader
            )
            pages += 1
            for bytes in page.envelopes {
                let envelope = try RelayEnvelope.decode(bytes[...])
                received.append(envelope)
                if envelope.endsRange {
                    vector.advance(envelope.site, to: envelope.to)
                    resume[envelope.site] = nil
                } else {
                    resume[envelope.site] = (envelope.from, envelope.index + 1)
                }
            }
            guard page.more, pages < 1_000 else { return (received, pages) }
        }
    }
}
