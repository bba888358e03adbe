import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// A relay's data made by an earlier build keeps working after an upgrade: each storage records its schema version,
/// and this build migrates what the first release wrote (schema 1, written out here as that release made it).
@Suite struct RelayStorageMigrationTests {
    private let site = SiteID(high: 0, low: 1)

    /// The first release's tables and a little of what it stored: a token, an upload key, a range of one chunk.
    private func firstRelease(_ kind: StorageKind, envelope: [UInt8], rangeBytes: Int) -> String {
        let hex = site.hex
        let chunk = envelope.map { String(format: "%02x", $0) }.joined()
        switch kind {
        case .sqlite:
            return """
                CREATE TABLE relay_meta(key TEXT PRIMARY KEY, value ANY) WITHOUT ROWID;
                CREATE TABLE tokens(
                    hash TEXT PRIMARY KEY, cluster TEXT NOT NULL, label TEXT NOT NULL, created INTEGER NOT NULL,
                    revoked INTEGER, rotated INTEGER) WITHOUT ROWID;
                CREATE TABLE epochs(
                    cluster TEXT NOT NULL, epoch INTEGER NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(cluster, epoch)
                ) WITHOUT ROWID;
                CREATE TABLE upload_keys(
                    cluster TEXT NOT NULL, epoch INTEGER NOT NULL, key BLOB NOT NULL, PRIMARY KEY(cluster, epoch)
                ) WITHOUT ROWID;
                CREATE TABLE grants(
                    cluster TEXT NOT NULL, epoch INTEGER NOT NULL, recipient TEXT NOT NULL, body TEXT NOT NULL,
                    PRIMARY KEY(cluster, epoch, recipient)) WITHOUT ROWID;
                CREATE TABLE heads(
                    cluster TEXT NOT NULL, site BLOB NOT NULL, head INTEGER NOT NULL, PRIMARY KEY(cluster, site)
                ) WITHOUT ROWID;
                CREATE TABLE ranges(
                    cluster TEXT NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL, to_seq INTEGER NOT NULL,
                    upload INTEGER NOT NULL, chunks INTEGER NOT NULL, bytes INTEGER NOT NULL, created INTEGER NOT NULL,
                    uploader TEXT, PRIMARY KEY(cluster, site, from_seq)) WITHOUT ROWID;
                CREATE TABLE chunks(
                    cluster TEXT NOT NULL, site BLOB NOT NULL, from_seq INTEGER NOT NULL, upload INTEGER NOT NULL,
                    idx INTEGER NOT NULL, envelope BLOB NOT NULL, created INTEGER NOT NULL,
                    PRIMARY KEY(cluster, site, from_seq, upload, idx));
                INSERT INTO relay_meta VALUES ('schema', 1);
                INSERT INTO tokens VALUES ('h1', 'c', 'shop', 1, NULL, NULL);
                INSERT INTO upload_keys VALUES ('c', 0, X'0102');
                INSERT INTO heads VALUES ('c', X'\(hex)', 2);
                INSERT INTO ranges VALUES ('c', X'\(hex)', 0, 2, 1, 1, \(rangeBytes), 1, 'old-node');
                INSERT INTO chunks VALUES ('c', X'\(hex)', 0, 1, 0, X'\(chunk)', 1);
                """
        case .postgres:
            return """
                CREATE SCHEMA shoal_relay;
                CREATE TABLE shoal_relay.meta(key text PRIMARY KEY, value bigint NOT NULL);
                CREATE TABLE shoal_relay.tokens(hash text PRIMARY KEY, cluster text NOT NULL, label text NOT NULL,
                    created bigint NOT NULL, revoked bigint, rotated bigint);
                CREATE INDEX ON shoal_relay.tokens(cluster);
                CREATE TABLE shoal_relay.epochs(cluster text NOT NULL, epoch bigint NOT NULL, created bigint NOT NULL,
                    PRIMARY KEY(cluster, epoch));
                CREATE TABLE shoal_relay.upload_keys(cluster text NOT NULL, epoch bigint NOT NULL, key bytea NOT NULL,
                    PRIMARY KEY(cluster, epoch));
                CREATE TABLE shoal_relay.grants(cluster text NOT NULL, epoch bigint NOT NULL, recipient text NOT NULL,
                    body text NOT NULL, PRIMARY KEY(cluster, epoch, recipient));
                CREATE TABLE shoal_relay.heads(cluster text NOT NULL, site bytea NOT NULL, head bigint NOT NULL,
                    PRIMARY KEY(cluster, site));
                CREATE TABLE shoal_relay.ranges(cluster text NOT NULL, site bytea NOT NULL, from_seq bigint NOT NULL,
                    to_seq bigint NOT NULL, upload bigint NOT NULL, chunks bigint NOT NULL, bytes bigint NOT NULL,
                    created bigint NOT NULL, uploader text, PRIMARY KEY(cluster, site, from_seq));
                CREATE TABLE shoal_relay.chunks(cluster text NOT NULL, site bytea NOT NULL, from_seq bigint NOT NULL,
                    upload bigint NOT NULL, idx bigint NOT NULL, envelope bytea NOT NULL, created bigint NOT NULL,
                    PRIMARY KEY(cluster, site, from_seq, upload, idx));
                ALTER TABLE shoal_relay.chunks ALTER COLUMN envelope SET STORAGE EXTERNAL;
                INSERT INTO shoal_relay.meta VALUES ('schema', 1);
                INSERT INTO shoal_relay.tokens VALUES ('h1', 'c', 'shop', 1, NULL, NULL);
                INSERT INTO shoal_relay.upload_keys VALUES ('c', 0, '\\x0102');
                INSERT INTO shoal_relay.heads VALUES ('c', '\\x\(hex)', 2);
                INSERT INTO shoal_relay.ranges VALUES ('c', '\\x\(hex)', 0, 2, 1, 1, \(rangeBytes), 1, 'old-node');
                INSERT INTO shoal_relay.chunks VALUES ('c', '\\x\(hex)', 0, 1, 0, '\\x\(chunk)', 1);
                """
        }
    }

    @Test(arguments: StorageKind.allCases) func whatTheFirstReleaseStoredKeepsWorking(_ kind: StorageKind) async throws
    {
        let place = try await kind.emptyPlace("relay-upgrade")
        let old = TestChunks.range(site, from: 0, to: 2, upload: 1)[0]
        try await kind.run(firstRelease(kind, envelope: old.encoded, rangeBytes: old.encoded.count), at: place)
        let storage = try await kind.open(at: place)
        // What it held reads as before: heads, the chunk exactly as uploaded, the token, the upload key.
        #expect(try await storage.heads(cluster: "c") == VersionVector([site: 2]))
        let page = try await storage.page(
            cluster: "c",
            vector: VersionVector(),
            resume: [:],
            snapshotSites: [],
            maximumBytes: 1 << 20,
            uploader: nil
        )
        #expect(page.envelopes == [old.encoded])
        #expect(
            try await storage.page(
                cluster: "c",
                vector: VersionVector(),
                resume: [:],
                snapshotSites: [],
                maximumBytes: 1 << 20,
                uploader: "old-node"
            )
            .envelopes.isEmpty
        )
        #expect(try await storage.token(hash: "h1")?.cluster == "c")
        #expect(try await storage.uploadKey(cluster: "c", epoch: 0) == ([1, 2], 0))
        // Its chain goes on, and what came since (snapshots) works on it.
        let next = try await storage.store(
            cluster: "c",
            envelopes: TestChunks.range(site, from: 2, to: 4, upload: 2),
            uploader: nil
        )
        #expect(next.heads == [site.hex: 4])
        _ = try await storage.store(
            cluster: "c",
            snapshot: 3,
            envelopes: TestChunks.range(site, from: 0, to: 4, upload: 3),
            uploader: nil
        )
        let none = RelayRetention(maximumAgeMilliseconds: 0, maximumBytes: 0)
        #expect(
            try await storage.completeSnapshot(
                cluster: "c",
                snapshot: 3,
                vector: VersionVector([site: 4]),
                retention: none
            )
                == .completed(dropped: 2)
        )
        #expect(try await TestChunks.pullAll(storage, maximumBytes: 1 << 20).envelopes.map(\.upload) == [3])
        await storage.close()
        // The version is recorded; a later build's schema is refused, with what to do.
        let meta = kind == .postgres ? "shoal_relay.meta" : "relay_meta"
        try await kind.run("UPDATE \(meta) SET value = 99 WHERE key = 'schema'", at: place)
        do {
            let newer = try await kind.open(at: place)
            await newer.close()
            Issue.record("a schema newer than this build's was opened")
        } catch let error as ShoalError {
            #expect(error.code == .versionMismatch)
            #expect(error.message.contains("run a newer relay"))
        }
    }
}
