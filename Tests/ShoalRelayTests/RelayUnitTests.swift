import Foundation
import Logging
import ShoalCore
@testable import ShoalRelay
import ShoalRelayClient
import ShoalRelayProtocol
import ShoalTestSupport
import Testing

@Suite struct RelayEnvelopeTests {
    private func sample(flags: RelayEnvelope.Flags = [.batchEnd, .rangeEnd], to: UInt64 = 9) -> RelayEnvelope {
        RelayEnvelope(
            cluster: "c1", epoch: 2, site: SiteID(high: 1, low: 2), from: 4, to: to, upload: 77, index: 3,
            flags: flags, sealed: Array(repeating: 5, count: 40)
        )
    }

    @Test func anEnvelopeRoundTripsAndEveryTruncationIsRefused() throws {
        let envelope = sample()
        let bytes = envelope.encoded()
        #expect(bytes.count == envelope.encodedCount)
        #expect(try RelayEnvelope.decode(bytes[...]) == envelope)
        for length in 0..<bytes.count {
            #expect(throws: ShoalError.self) { try RelayEnvelope.decode(bytes[0..<length]) }
        }
        #expect(throws: ShoalError.self) { try RelayEnvelope.decode((bytes + [0])[...]) }
        let list = RelayEnvelopeList.encode([envelope, envelope])
        #expect(try RelayEnvelopeList.decode(list, maximumEnvelopeBytes: 1000) == [envelope, envelope])
        #expect(throws: ShoalError.self) { try RelayEnvelopeList.decode(list, maximumEnvelopeBytes: 10) }
        #expect(throws: ShoalError.self) { try RelayEnvelopeList.decode(Array(list.dropLast()), maximumEnvelopeBytes: 1000) }
    }

    @Test func fieldsThatDisagreeAreRefused() {
        #expect(throws: ShoalError.self) { try self.sample(flags: [.batchEnd, .rangeEnd], to: 4).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: [.rangeEnd]).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: [.batchEnd], to: 9).validate() }
        #expect(throws: ShoalError.self) { try self.sample(flags: RelayEnvelope.Flags(rawValue: 8), to: 0).validate() }
        var empty = sample()
        empty.sealed = []
        #expect(throws: ShoalError.self) { try empty.validate() }
        var noCluster = sample()
        noCluster.cluster = ""
        #expect(throws: ShoalError.self) { try noCluster.validate() }
    }

    @Test func aSealedBodyOpensOnlyWithItsKeyAndItsOwnHeader() throws {
        let seal = RelaySeal(clusterSecret: Array(repeating: 3, count: 32))
        let sealed = try seal.seal(Array("the changes".utf8), into: sample())
        #expect(try seal.open(sealed) == Array("the changes".utf8))
        #expect(!sealed.encoded().contains(subsequence: Array("the changes".utf8)))
        let other = RelaySeal(clusterSecret: Array(repeating: 4, count: 32))
        #expect(throws: ShoalError.self) { try other.open(sealed) }
        for change in [
            { (e: inout RelayEnvelope) in e.from += 1 }, { $0.site = SiteID(high: 9, low: 9) }, { $0.cluster = "c2" },
            { $0.index += 1 }, { $0.to += 1 }, { $0.sealed[20] ^= 1 },
        ] {
            var moved = sealed
            change(&moved)
            #expect(throws: ShoalError.self) { try seal.open(moved) }
        }
        var unknownEpoch = sealed
        unknownEpoch.epoch = 9
        #expect(throws: ShoalError.self) { try seal.open(unknownEpoch) }
    }
}

extension Array where Element == UInt8 {
    fileprivate func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        return (0...(count - subsequence.count)).contains { Array(self[$0..<$0 + subsequence.count]) == subsequence }
    }
}

/// What only the PostgreSQL storage does: a versioned schema it migrates itself, and news shared between instances.
@Suite struct PostgresRelayStorageTests {
    @Test func theSchemaIsMadeOnceAndANewerOneIsRefused() async throws {
        let url = try await offPool { try TestPostgres.freshDatabase("relay-schema") }
        let location = try PostgresLocation(url: url)
        // Two instances starting at once migrate once (the advisory lock), and a third opens what they made.
        async let first = PostgresRelayStorage.open(location, logger: Logger(label: "test"))
        async let second = PostgresRelayStorage.open(location, logger: Logger(label: "test"))
        let (one, two) = try await (first, second)
        let token = try await one.createToken(cluster: "c", label: "")
        #expect(try await two.token(hash: RelayTokens.hash(token))?.cluster == "c")
        await one.close()
        await two.close()
        let version = try await offPool { try TestPostgres.query(url, "SELECT value FROM shoal_relay.meta WHERE key = 'schema'") }
        #expect(version == "\(PostgresRelayStorage.schemaVersion)\n")
        _ = try await offPool { try TestPostgres.query(url, "UPDATE shoal_relay.meta SET value = 99 WHERE key = 'schema'") }
        do {
            _ = try await PostgresRelayStorage.open(location, logger: Logger(label: "test"))
            Issue.record("a schema newer than this build's was opened")
        } catch {
            #expect(error.code == .versionMismatch)
            #expect(error.message.contains("version 99"))
        }
    }

    @Test func aStatementThatFailsSaysWhatFailedInPostgreSQLsWords() async throws {
        let (storage, url, cleanUp) = try await StorageKind.postgres.open("relay-failing")
        defer { Task { await cleanUp() } }
        _ = try await offPool { try TestPostgres.query(url, "DROP TABLE shoal_relay.heads") }
        do {
            _ = try await storage.heads(cluster: "c")
            Issue.record("heads were read from a table that is gone")
        } catch {
            #expect(error.message.contains("PostgreSQL failed to read heads"), "\(error.message)")
            #expect(error.message.contains("SQLSTATE"), "\(error.message)")
        }
    }

    @Test func aWrongServerOrDatabaseIsAClearError() async throws {
        let url = try await offPool { try TestPostgres.serverURL() }
        let missing = url.replacingOccurrences(of: "/shoal?", with: "/no_such_database?")
        do {
            _ = try await PostgresRelayStorage.open(try PostgresLocation(url: missing), logger: Logger(label: "test"))
            Issue.record("a missing database was opened")
        } catch {
            #expect(error.message.contains("no_such_database"))
            #expect(error.message.contains("cannot connect to PostgreSQL"))
        }
        do {
            _ = try await PostgresRelayStorage.open(try PostgresLocation(url: "postgres://shoal@127.0.0.1:1/shoal?sslmode=disable"), logger: Logger(label: "test"))
            Issue.record("a closed port was opened")
        } catch {
            #expect(error.message.contains("cannot connect to PostgreSQL at postgres://shoal@127.0.0.1:1/shoal"))
        }
        #expect(throws: ShoalError.self) { try PostgresLocation(url: "mysql://x@y/z") }
        #expect(throws: ShoalError.self) { try PostgresLocation(url: "postgres://x@y/z?sslmode=sometimes") }
        #expect(throws: ShoalError.self) { try PostgresLocation(url: "postgres://y/z") }
        let secret = try PostgresLocation(url: "postgres://u:hunter2@db.example:6000/relay?sslmode=require")
        #expect(secret.description == "postgres://u@db.example:6000/relay")
        #expect(secret.password == "hunter2")
        #expect(secret.tls == .require)
        let checked = try PostgresLocation(url: "postgres://u@db.example/relay?sslmode=verify-full&sslrootcert=/etc/ca.pem")
        #expect(checked.tls == .verifyFull)
        #expect(checked.rootCertificatePath == "/etc/ca.pem")
    }

    @Test func anUploadThroughOneInstanceWakesTheOther() async throws {
        let url = try await offPool { try TestPostgres.freshDatabase("relay-notify") }
        let location = try PostgresLocation(url: url)
        let one = try await PostgresRelayStorage.open(location, logger: Logger(label: "test"))
        let two = try await PostgresRelayStorage.open(location, logger: Logger(label: "test"))
        let (news, sink) = AsyncStream.makeStream(of: String?.self)
        let watcher = Task { await two.watch { cluster in sink.yield(cluster) } }
        defer {
            watcher.cancel()
            Task {
                await one.close()
                await two.close()
            }
        }
        var iterator = news.makeAsyncIterator()
        // Listening starts with news that every cluster may have changed (what came before was not heard).
        #expect(await iterator.next() == .some(nil))
        let site = SiteID(high: 0, low: 9)
        let envelope = RelayEnvelope(
            cluster: "far", epoch: 0, site: site, from: 0, to: 3, upload: 1, index: 0,
            flags: [.batchEnd, .rangeEnd], sealed: [1, 2, 3]
        )
        let stored = try await one.store(cluster: "far", envelopes: [(envelope, envelope.encoded())], uploader: nil)
        #expect(stored.stored == 1)
        #expect(await iterator.next() == .some("far"))
        // The same upload again stores nothing and announces nothing; the next real one is announced.
        _ = try await one.store(cluster: "far", envelopes: [(envelope, envelope.encoded())], uploader: nil)
        let next = RelayEnvelope(
            cluster: "near", epoch: 0, site: site, from: 0, to: 1, upload: 2, index: 0,
            flags: [.batchEnd, .rangeEnd], sealed: [4]
        )
        _ = try await one.store(cluster: "near", envelopes: [(next, next.encoded())], uploader: nil)
        #expect(await iterator.next() == .some("near"))
        #expect(try await two.heads(cluster: "far")[site] == 3)
    }
}

@Suite struct RelayRetentionTests {
    @Test func coveredRangesGoOldestFirstPastTheAgeOrTheBudgetAndUncoveredOnesNever() {
        let site = SiteID(high: 0, low: 1)
        let other = SiteID(high: 0, low: 2)
        // Newest first: per site a chain (0,2] (2,4] (4,6]; the snapshot covers site up to 4 and other up to 2.
        let ranges = [
            RetainedRange(site: site, from: 4, upload: 3, to: 6, bytes: 10, created: 900),
            RetainedRange(site: other, from: 2, upload: 6, to: 4, bytes: 10, created: 850),
            RetainedRange(site: site, from: 2, upload: 2, to: 4, bytes: 10, created: 800),
            RetainedRange(site: other, from: 0, upload: 5, to: 2, bytes: 10, created: 750),
            RetainedRange(site: site, from: 0, upload: 1, to: 2, bytes: 10, created: 700),
        ]
        let snapshot = VersionVector([site: 4, other: 2])
        let keepAll = RelayRetention(maximumAgeMilliseconds: 1_000, maximumBytes: 1_000)
        #expect(keepAll.drops(ranges, snapshot: snapshot, now: 1_000).isEmpty)
        // By age: what is older than 230 ms goes (created before 770), covered or not decides first.
        let young = RelayRetention(maximumAgeMilliseconds: 230, maximumBytes: 1_000)
        #expect(young.drops(ranges, snapshot: snapshot, now: 1_000).map(\.upload) == [5, 1])
        // By bytes: 15 bytes of covered ranges kept, the newest first.
        let small = RelayRetention(maximumAgeMilliseconds: 1_000, maximumBytes: 15)
        #expect(small.drops(ranges, snapshot: snapshot, now: 1_000).map(\.upload) == [5, 1])
        // Nothing kept: every covered range goes, never (4,6] of site nor (2,4] of other, which it does not cover.
        let none = RelayRetention(maximumAgeMilliseconds: 0, maximumBytes: 0)
        #expect(none.drops(ranges, snapshot: snapshot, now: 1_000).map(\.upload) == [2, 5, 1])
    }

    @Test func aNewerRangeOverTheBudgetTakesTheOlderOnesOfItsSiteWithItAndLeavesNoHole() {
        let site = SiteID(high: 0, low: 1)
        // Newest first: a big newer range (2,4] and a small older one (0,2], both covered.
        let ranges = [
            RetainedRange(site: site, from: 2, upload: 2, to: 4, bytes: 100, created: 900),
            RetainedRange(site: site, from: 0, upload: 1, to: 2, bytes: 5, created: 800),
        ]
        let budget = RelayRetention(maximumAgeMilliseconds: 1_000, maximumBytes: 50)
        // The small one would fit, but kept alone it would sit before a hole no pull could cross.
        #expect(budget.drops(ranges, snapshot: VersionVector([site: 4]), now: 1_000).map(\.upload) == [2, 1])
    }
}
