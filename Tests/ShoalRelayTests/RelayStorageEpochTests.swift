import Foundation
import ShoalCore
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@testable import ShoalRelay

/// The storage rules of key epochs, upload keys, grants and tokens, run against both storages.
@Suite struct RelayStorageEpochTests {
    @Test(arguments: StorageKind.allCases) func epochsKeysAndGrants(_ kind: StorageKind) async throws {
        let (storage, _, cleanUp) = try await kind.open("relay-epochs")
        defer { Task { await cleanUp() } }
        let first = try await storage.createToken(cluster: "c", label: "first")
        let elsewhere = try await storage.createToken(cluster: "d", label: "other cluster")
        // Epoch 0's upload key: the first registration holds, another key is refused, the same one is fine.
        #expect(try await storage.uploadKey(cluster: "c", epoch: 0) == (nil, 0))
        #expect(try await storage.registerUploadKey(cluster: "c", epoch: 0, key: [1, 2, 3]))
        #expect(try await !storage.registerUploadKey(cluster: "c", epoch: 0, key: [9]))
        #expect(try await storage.registerUploadKey(cluster: "c", epoch: 0, key: [1, 2, 3]))
        // Grants for an epoch that does not exist are not stored.
        #expect(
            try await storage.addGrants(cluster: "c", grants: [RelayGrant(epoch: 1, recipient: "n1", body: "g")]) == 0
        )
        // A rotation to epoch 1: its grants and key, every earlier token of the cluster retired, the new token in.
        let grant = RelayGrant(epoch: 1, recipient: "n1", body: "for n1")
        let outcome = try await storage.rotate(
            cluster: "c",
            epoch: 1,
            tokenHash: "hash-1",
            grants: [grant, RelayGrant(epoch: 2, recipient: "x", body: "")],
            uploadKey: [4, 5]
        )
        #expect(outcome == .rotated)
        let retired = try #require(try await storage.token(hash: RelayTokens.hash(first)))
        #expect(retired.revoked != nil)
        #expect(retired.rotatedAtEpoch == 1)
        #expect(try await storage.token(hash: RelayTokens.hash(elsewhere))?.revoked == nil)
        let made = try #require(try await storage.token(hash: "hash-1"))
        #expect((made.cluster, made.revoked, made.label) == ("c", nil, "key epoch 1"))
        // The epoch is taken once; a rotation that skips one is refused the same way.
        #expect(
            try await storage.rotate(cluster: "c", epoch: 1, tokenHash: "hash-x", grants: [], uploadKey: nil)
                == .taken(current: 1)
        )
        #expect(
            try await storage.rotate(cluster: "c", epoch: 3, tokenHash: "hash-x", grants: [], uploadKey: nil)
                == .taken(current: 1)
        )
        #expect(try await storage.token(hash: "hash-x") == nil)
        // Epoch 0 is retired: its key is still known, and the newest epoch says uploads under it are refused.
        #expect(try await storage.uploadKey(cluster: "c", epoch: 0) == ([1, 2, 3], 1))
        #expect(try await storage.uploadKey(cluster: "c", epoch: 1) == ([4, 5], 1))
        #expect(try await storage.uploadKey(cluster: "d", epoch: 0) == (nil, 0))
        // Grants left later for members who join: new ones stored once, those already held ignored.
        let later = [RelayGrant(epoch: 1, recipient: "n2", body: "for n2"), grant]
        #expect(try await storage.addGrants(cluster: "c", grants: later) == 1)
        #expect(try await storage.addGrants(cluster: "c", grants: later) == 0)
        let grants = try await storage.grants(cluster: "c", after: 0)
        #expect(grants.epoch == 1)
        #expect(grants.grants.map(\.recipient) == ["n1", "n2"])
        #expect(try await storage.grants(cluster: "c", after: 1).grants.isEmpty)
        #expect(try await storage.grants(cluster: "d", after: 0) == RelayGrants(grants: [], epoch: 0))
    }

    @Test(arguments: StorageKind.allCases) func tokensReachOneClusterAndRevokedOnesAreKeptAsRevoked(
        _ kind: StorageKind
    ) async throws {
        let (storage, place, cleanUp) = try await kind.open("relay-tokens")
        defer { Task { await cleanUp() } }
        let token = try await storage.createToken(cluster: "c", label: "shop")
        let record = try #require(try await storage.token(hash: RelayTokens.hash(token)))
        #expect(record.cluster == "c")
        #expect(record.revoked == nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 1)
        #expect(try await storage.token(hash: RelayTokens.hash(token))?.revoked != nil)
        #expect(try await storage.revokeTokens(matching: token, wholeCluster: false) == 0)
        _ = try await storage.createToken(cluster: "c", label: "two")
        _ = try await storage.createToken(cluster: "c", label: "three")
        #expect(try await storage.revokeTokens(matching: "c", wholeCluster: true) == 2)
        #expect(Set(try await storage.tokens().map(\.label)) == ["shop", "two", "three"])
        // The database holds hashes only.
        let bytes: Data
        switch kind {
        case .sqlite:
            let directory = URL(fileURLWithPath: place)
            bytes =
                try Data(contentsOf: directory.appendingPathComponent("relay.sqlite"))
                + ((try? Data(contentsOf: directory.appendingPathComponent("relay.sqlite-wal"))) ?? Data())
        case .postgres:
            let dump = try await offPool {
                try runProcess(URL(fileURLWithPath: "/usr/bin/pg_dump"), ["--data-only", place])
            }
            #expect(dump.status == 0)
            #expect(dump.stdout.contains(RelayTokens.hash(token)))
            bytes = Data(dump.stdout.utf8)
        }
        #expect(bytes.range(of: Data(token.utf8)) == nil)
    }
}
