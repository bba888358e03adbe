import Foundation
import Logging
import ShoalTestSupport
import Synchronization
import Testing

@testable import ShoalCore
@testable import ShoalSecurity
@testable import ShoalStore

/// A removed member keeps its file and the cluster's secret: what it writes after its removal must never count, on any
/// path, and every member must draw the line at the same place.
@Suite struct RemovalFenceTests {
    private let founder = NodeIdentity.generate()
    private var cluster: [UInt8] { Array(founder.nodeID.bytes.prefix(16)) }

    private func removal(_ subject: NodeID, site: SiteID?, cut: UInt64?, by signer: NodeIdentity) throws -> RosterRecord {
        try RosterRecord.make(
            .remove, cluster: cluster, subject: subject, siteID: site, name: "n", signer: signer, signerSite: .random(),
            cut: cut, at: 2
        )
    }

    @Test func aRemovalCarriesItsCutAndEveryMemberFencesAtTheHighestCut() throws {
        let b = NodeIdentity.generate()
        let site = SiteID.random()
        let add = try RosterRecord.make(
            .add, cluster: cluster, subject: b.nodeID, subjectKey: b.publicKeyDER, siteID: site, name: "b",
            signer: founder, signerSite: .random(), at: 1
        )
        let low = try removal(b.nodeID, site: site, cut: 5, by: founder)
        let high = try removal(b.nodeID, site: site, cut: 9, by: founder)
        // Encoded and read back: the cut is signed with the rest; a record without one keeps encoding version 2.
        let decoded = try RosterRecord(decoding: high.encoded)
        #expect(decoded == high && decoded.cut == 9 && high.encoded[12] == 3)
        let addDecoded = try RosterRecord(decoding: add.encoded)
        #expect(add.encoded[12] == 2 && addDecoded.cut == nil)
        var forged = high.encoded
        forged[forged.count - 64 - 1] ^= 1  // the cut's last byte
        let roster = Roster(records: [add, low, try RosterRecord(decoding: forged)], clusterID: cluster)
        #expect(roster.fences == [site: 5], "a cut whose signature does not check never counts")
        for records in [[add, low, high], [high, add, low]] {
            let roster = Roster(records: records, clusterID: cluster)
            #expect(roster.removedSites == [b.nodeID: [site]])
            #expect(roster.fences == [site: 9])
        }
        // A removal that names another site than the subject's add cuts that site (one the subject wrote under).
        let other = SiteID.random()
        let elsewhere = try removal(b.nodeID, site: other, cut: 50, by: founder)
        let both = Roster(records: [add, low, elsewhere], clusterID: cluster)
        #expect(both.fences == [site: 5, other: 50] && both.removedSites == [b.nodeID: [site, other]])
    }

    @Test func aNodeBindsTheFreshSitesItMovedToAndItsRemovalFencesThemWhenEverSigned() throws {
        let b = NodeIdentity.generate()
        let c = NodeIdentity.generate()
        let (site, fresh, later) = (SiteID.random(), SiteID.random(), SiteID.random())
        let add = try RosterRecord.make(
            .add, cluster: cluster, subject: b.nodeID, subjectKey: b.publicKeyDER, siteID: site, name: "b",
            signer: founder, signerSite: .random(), at: 1
        )
        let addC = try RosterRecord.make(
            .add, cluster: cluster, subject: c.nodeID, subjectKey: c.publicKeyDER, siteID: .random(), name: "c",
            signer: founder, signerSite: .random(), at: 1
        )
        func bind(_ site: SiteID, of subject: NodeID, by signer: NodeIdentity, at: UInt64) throws -> RosterRecord {
            try RosterRecord.make(
                .site, cluster: cluster, subject: subject, siteID: site, name: "", signer: signer, signerSite: .random(),
                at: at
            )
        }
        let binding = try bind(fresh, of: b.nodeID, by: b, at: 3)
        #expect(try RosterRecord(decoding: binding.encoded) == binding)
        // Bound, not removed: the member keeps its membership site for its hellos, and the roster knows both sites.
        let bound = Roster(records: [add, binding], clusterID: cluster)
        #expect(bound.member(b.nodeID)?.siteID == site && bound.sites(of: b.nodeID) == [site, fresh])
        #expect(bound.removedSites.isEmpty && bound.fences.isEmpty)
        // Removed: every site is fenced; the binding signed after the removal (a removed node restored from an
        // older copy, which does not know of its removal) counts all the same, since it only ever fences more.
        let removal = try removal(b.nodeID, site: site, cut: 7, by: founder)
        let afterwards = try bind(later, of: b.nodeID, by: b, at: 10)
        let roster = Roster(records: [add, binding, removal, afterwards], clusterID: cluster)
        #expect(roster.removedSites == [b.nodeID: [site, fresh, later]])
        #expect(roster.fences == [site: 7])
        #expect(Membership.cuts(roster) == [site: 7, fresh: 0, later: 0])
        // Only a node binds its own sites: one signed by another member, or forged, never counts.
        let byAnother = try bind(.random(), of: b.nodeID, by: c, at: 3)
        var forged = try bind(.random(), of: b.nodeID, by: b, at: 3)
        forged.siteID = .random()
        let others = Roster(records: [add, addC, binding, byAnother, forged, removal], clusterID: cluster)
        #expect(others.removedSites == [b.nodeID: [site, fresh]])
    }

    @Test func anApplyThatBringsABindingOfARemovedNodesSiteFencesItBeforeTheRest() throws {
        let directory = try temporaryDirectory("fence-gate")
        defer { try? FileManager.default.removeItem(at: directory) }
        let writer = try Store(path: directory.appendingPathComponent("w.db").path)
        let reader = try Store(path: directory.appendingPathComponent("r.db").path)
        for store in [writer, reader] {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
            try store.prepareRoster()
        }
        // The writer's data, then the record binding its site (opaque here) to a removed node.
        for index in 1...3 { try writer.execute("INSERT INTO kv VALUES ('k\(index)', \(index))") }
        try writer.addRosterRecord([1, 2, 3], id: [9])
        var asked: [[[UInt8]]] = []
        reader.fenceGate = { records in
            asked.append(records)
            return records.contains([1, 2, 3]) ? [writer.siteID: 0] : [:]
        }
        let all = try writer.changes(since: VersionVector()).flatMap(\.changes)
        let report = try reader.apply(all, claim: try writer.versionVector(), since: VersionVector())
        // Fenced at what was here before this apply: the record's own transaction and everything after it are left
        // out and not claimed (the data was stamped before the binding, as an app's write made while the node was
        // down would be).
        #expect(asked.count == 1 && asked[0].contains([1, 2, 3]))
        #expect(try reader.fences() == [writer.siteID: 0])
        #expect(report.fenced == [writer.siteID: 4])
        #expect(try reader.versionVector()[writer.siteID] == 0)
        #expect(try reader.execute("SELECT count(*) FROM kv").rows == [[.integer(0)]])
        // An apply without roster records never asks the gate.
        try writer.execute("INSERT INTO kv VALUES ('k4', 4)")
        let rest = try writer.changes(since: VersionVector()).flatMap(\.changes).filter { $0.table == "kv" }
        #expect(try reader.apply(rest).fenced == [writer.siteID: 4])
        #expect(asked.count == 1)
    }

    @Test func aStoreLeavesOutAndNeverClaimsAFencedSitesChangesBeyondItsFence() throws {
        let directory = try temporaryDirectory("fence-store")
        defer { try? FileManager.default.removeItem(at: directory) }
        let writer = try Store(path: directory.appendingPathComponent("w.db").path)
        let reader = try Store(path: directory.appendingPathComponent("r.db").path)
        for store in [writer, reader] {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
        }
        for index in 1...4 { try writer.execute("INSERT INTO kv VALUES ('k\(index)', \(index))") }
        let all = try writer.changes(since: VersionVector()).flatMap(\.changes)
        // Fenced at 2 before any arrived: 3 and 4 are left out, and nothing of the site is claimed, whatever the
        // sender claims (a sender sends only what still has an effect: what 1 and 2 lost to 3 and 4 never came).
        #expect(try reader.raiseFences([writer.siteID: 2]).isEmpty)
        #expect(try reader.raiseFences([reader.siteID: 1]).isEmpty)
        #expect(try reader.fences()[reader.siteID] == nil, "a store never fences its own site")
        let report = try reader.apply(all, claim: try writer.versionVector(), since: VersionVector())
        #expect(report.fenced == [writer.siteID: 2])
        #expect(try reader.versionVector()[writer.siteID] == 0)
        #expect(try reader.servableVector()[writer.siteID] == 0, "what is held of it is not sent as if whole")
        #expect(try reader.execute("SELECT k FROM kv ORDER BY k").rows == [[.text("k1")], [.text("k2")]])
        // A fence never leaves out what is here: raised below what is held, it goes to what is held, which is
        // returned (the membership layer signs it as a cut of its own).
        #expect(try reader.raiseFences([writer.siteID: 1]) == [writer.siteID: 2])
        #expect(try reader.fences() == [writer.siteID: 2])
        // Raised past it, the rest comes with the next exchange.
        try reader.raiseFences([writer.siteID: 4])
        let rest = try writer.changes(since: try reader.versionVector()).flatMap(\.changes)
        try reader.apply(rest, claim: try writer.versionVector(), since: try reader.versionVector())
        #expect(try reader.versionVector()[writer.siteID] == 4)
        #expect(try reader.digest() == (try writer.digest()))
    }

    /// A removed member that keeps writing is refused at every batch: the warning is one line a minute per member,
    /// with how many changes were refused since the last line (a node's log had one per batch, ten in a second).
    @Test func refusedChangesOfAFencedSiteAreLoggedOnceAMinuteWithTheirCount() throws {
        let directory = try temporaryDirectory("fence-log")
        defer { try? FileManager.default.removeItem(at: directory) }
        let log = LogLines()
        let clock = ManualWallClock(milliseconds: 1_700_000_000_000)
        var options = StoreOptions()
        options.clock = clock
        options.logger = Logger(label: "fence-log") { _ in CapturingLogHandler(log: log) }
        let writer = try Store(path: directory.appendingPathComponent("w.db").path)
        let reader = try Store(path: directory.appendingPathComponent("r.db").path, options: options)
        for store in [writer, reader] {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
        }
        try reader.raiseFences([writer.siteID: 0])
        func refusedLines() -> [String] {
            log.lines.withLock { $0.filter { $0.message.hasPrefix("refused changes") }.map(\.changes) }
        }
        for index in 1...3 {
            try writer.execute("INSERT INTO kv VALUES ('k\(index)', \(index))")
            let changes = try writer.changes(since: try reader.versionVector()).flatMap(\.changes)
            let report = try reader.apply(changes, claim: try writer.versionVector(), since: VersionVector())
            #expect(report.fenced.count == 1)
            clock.advance(by: 10_000)
        }
        #expect(refusedLines() == ["1"], "the first batch's refusal, and none for the next two within the minute")
        clock.advance(by: 40_000)
        let all = try writer.changes(since: VersionVector()).flatMap(\.changes)
        try reader.apply(all, claim: try writer.versionVector(), since: VersionVector())
        // Each batch brought every change again (the reader holds none): 2 and 3 refused since the first line.
        #expect(refusedLines() == ["1", "8"], "a minute on: the 5 refused since the first line, and this batch's 3")
        #expect(try reader.execute("SELECT count(*) FROM kv").rows == [[.integer(0)]])
    }

    /// A range past the fence (the removed node's own, say) leaves what it brought unsendable as whole (it may lack
    /// what the refused changes overwrote), but what the member could send before stays sendable: the only holder of
    /// a transaction within the fence still sends it.
    @Test func aRangePastTheFenceLeavesWhatAMemberCouldSendBeforeSendable() throws {
        let directory = try temporaryDirectory("fence-gap")
        defer { try? FileManager.default.removeItem(at: directory) }
        let removed = try Store(path: directory.appendingPathComponent("removed.db").path)
        let holder = try Store(path: directory.appendingPathComponent("holder.db").path)
        for store in [removed, holder] {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
        }
        try removed.execute("INSERT INTO kv VALUES ('a', 1)")
        try removed.execute("INSERT INTO kv VALUES ('b', 2)")
        for batch in try removed.changes(since: VersionVector()) {
            try holder.apply(batch.changes, claim: batch.claim, since: VersionVector())
        }
        try removed.execute("UPDATE kv SET v = 3 WHERE k = 'a'")
        let third = try removed.changes(since: try holder.versionVector()).flatMap(\.changes)
        try holder.apply(third, claim: VersionVector(), since: try holder.versionVector())
        try holder.raiseFences([removed.siteID: 3])
        #expect(try holder.servableVector()[removed.siteID] == 3)
        // The removed node writes on; its range from 2 holds its third transaction's row only as its fifth wrote it.
        try removed.execute("INSERT INTO kv VALUES ('c', 4)")
        try removed.execute("UPDATE kv SET v = 5 WHERE k = 'a'")
        let past = try removed.changes(since: try holder.versionVector()).flatMap(\.changes)
        let report = try holder.apply(past, claim: try removed.versionVector(), since: try holder.versionVector())
        #expect(report.fenced == [removed.siteID: 2])
        #expect(try holder.versionVector()[removed.siteID] == 2)
        #expect(try holder.servableVector()[removed.siteID] == 3)
        #expect(try holder.execute("SELECT k, v FROM kv ORDER BY k").rows == [
            [.text("a"), .integer(3)], [.text("b"), .integer(2)],
        ])
    }

    /// A member may hold a removed node's transaction it could not claim (the range it came in was cut off, and the
    /// relay that had the rest lost its storage): its fence covers it, so it must still reach every member, or that
    /// member alone keeps it for good.
    @Test func aFencedTransactionOneMemberHoldsWithoutItsClaimStillReachesEveryMember() throws {
        let directory = try temporaryDirectory("fence-stranded")
        defer { try? FileManager.default.removeItem(at: directory) }
        let removed = try Store(path: directory.appendingPathComponent("removed.db").path)
        let holder = try Store(path: directory.appendingPathComponent("holder.db").path)
        let other = try Store(path: directory.appendingPathComponent("other.db").path)
        for store in [removed, holder, other] {
            try store.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v)")
            try store.replicate(table: "kv")
        }
        try removed.execute("INSERT INTO kv VALUES ('a', 1)")
        try removed.execute("INSERT INTO kv VALUES ('b', 2)")
        let first = try removed.changes(since: VersionVector())
        for store in [holder, other] {
            for batch in first { try store.apply(batch.changes, claim: batch.claim, since: VersionVector()) }
        }
        try removed.execute("UPDATE kv SET v = 3 WHERE k = 'a'")
        // Transaction 3 reaches the holder without its claim: the rest of its range never came.
        let third = try removed.changes(since: try holder.versionVector()).flatMap(\.changes)
        try holder.apply(third, claim: VersionVector(), since: try holder.versionVector())
        #expect(try holder.versionVector()[removed.siteID] == 2)
        // The removal: the holder signs what it holds, every member fences there.
        #expect(try holder.raiseFences([removed.siteID: 2]) == [removed.siteID: 3])
        #expect(try other.raiseFences([removed.siteID: 3]).isEmpty)
        #expect(try holder.servableVector()[removed.siteID] == 3)
        #expect(try other.servableVector()[removed.siteID] == 2)
        // The other member's next exchange with the holder brings it, claimed; then the holder's own with the other.
        for batch in try holder.changes(since: try other.versionVector()) {
            try other.apply(batch.changes, claim: batch.claim, since: try other.versionVector())
        }
        #expect(try other.versionVector()[removed.siteID] == 3)
        for batch in try other.changes(since: try holder.versionVector()) {
            try holder.apply(batch.changes, claim: batch.claim, since: try holder.versionVector())
        }
        #expect(try holder.versionVector()[removed.siteID] == 3)
        #expect(try other.digest() == (try holder.digest()))
        let rows = "SELECT k, v, typeof(v) FROM kv ORDER BY k"
        #expect(try other.execute(rows).rows == (try holder.execute(rows).rows))
        #expect(try other.execute(rows).rows == [[.text("a"), .integer(3), .text("integer")], [.text("b"), .integer(2), .text("integer")]])
    }
}

/// The same over real files and the `shoal` binary: the offline path (`shoal changes | shoal apply`).
extension RemovalFenceTests {
    private static func nodeID(_ path: String) throws -> String {
        try shoal("id", "--db", path).stdout.split(separator: "\n").last.map(String.init) ?? ""
    }

    /// Streams every change of `from` into `to` with the binary; returns what `apply` wrote to stderr.
    @discardableResult
    private static func stream(_ from: String, _ to: String) throws -> String {
        let changes = try shoal("changes", "--db", from)
        #expect(changes.status == 0, "\(changes.stderr)")
        let applied = try shoal("apply", "--db", to, input: Data(changes.stdout.utf8))
        #expect(applied.status == 0, "\(applied.stderr)")
        return applied.stderr
    }

    private static func rows(_ path: String) throws -> String {
        try sqlite3Shell(path, "SELECT k, quote(v) FROM kv ORDER BY k").stdout
    }

    @Test func whatARemovedMemberWritesAfterItsRemovalIsRefusedOnEveryMember() throws {
        let directory = try temporaryDirectory("fence-offline")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let (a, b, c) = (paths[0], paths[1], paths[2])
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('before', 1)").status == 0)
        try Self.stream(c, a)
        try Self.stream(c, b)
        let cSite = try Store(path: c).siteID
        let held = try Store(path: a).versionVector()[cSite]
        #expect(held == (try Store(path: c).versionVector()[cSite]))
        let removed = try shoal("trust", "remove", try Self.nodeID(c), "--db", a)
        #expect(removed.status == 0, "\(removed.stderr)")
        let roster = try Membership.roster(store: try Store(path: a), cluster: try KeyFile.load(forDatabase: a).cluster.id)
        #expect(roster.fences == [cSite: held], "the removal carries what a held of c")
        try Self.stream(a, b)
        // c never learns of it (or deletes the record from its file, as a hostile node would) and writes on.
        #expect(try sqlite3Shell(c, "DELETE FROM shoal_roster; DELETE FROM shoal_roster_seen").status == 0)
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('after', 2); UPDATE kv SET v = 'taken' WHERE k = 'before'").status == 0)
        let rosterRows = try sqlite3Shell(a, "SELECT count(*) FROM shoal_roster").stdout
        for member in [a, b] {
            let said = try Self.stream(c, member)
            #expect(said.contains("refused ") && said.contains("made after their node was removed"), "\(said)")
            #expect(try Store(path: member).versionVector()[cSite] == held)
        }
        #expect(try sqlite3Shell(a, "SELECT count(*) FROM shoal_roster").stdout == rosterRows, "c's deletes were refused too")
        // Compared outside Shoal: both members hold c's row from before its removal, and nothing after.
        #expect(try Self.rows(a) == "before|1\n")
        #expect(try Self.rows(b) == (try Self.rows(a)))
        #expect(try Store(path: a).digest() == (try Store(path: b).digest()))
    }

    @Test func aRemovedMemberRestoredFromABackupWritesUnderAFreshSiteAndIsRefusedAllTheSame() throws {
        let directory = try temporaryDirectory("fence-restored")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let (a, b, c) = (paths[0], paths[1], paths[2])
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('before', 1)").status == 0)
        try Self.stream(c, a)
        try Self.stream(c, b)
        // c's backup, from before its removal, is later restored over it: it does not know it was removed.
        let backup = c + ".bak"
        #expect(try sqlite3Shell(c, ".backup '\(backup)'").status == 0)
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('mid', 3)").status == 0)
        try Self.stream(c, a)
        try Self.stream(c, b)
        let cSite = try Store(path: c).siteID
        #expect(try shoal("trust", "remove", try Self.nodeID(c), "--db", a).status == 0)
        try Self.stream(a, b)
        try FileManager.default.removeItem(atPath: c)
        try FileManager.default.copyItem(atPath: backup, toPath: c)
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('after', 2); UPDATE kv SET v = 'taken' WHERE k = 'before'").status == 0)
        let restored = try Store(path: c)
        #expect(restored.siteID != cSite, "the restored file writes under a fresh site")
        let fresh = restored.siteID
        // Awaiting its fresh state, it sends none of what it wrote since the restore (it once did, as rewrites of its
        // old site's row carried beside): the members hold nothing of the fresh site.
        #expect(try restored.awaitsFreshState())
        for member in [a, b] {
            _ = try Self.stream(c, member)
            #expect(try Store(path: member).versionVector()[fresh] == 0)
        }
        // Once it sends them (here its fresh state is marked taken by hand: a removed member gets none), every member
        // refuses them all the same.
        try restored.freshStateTaken()
        for member in [a, b] {
            let said = try Self.stream(c, member)
            #expect(said.contains("refused ") && said.contains("made after their node was removed"), "\(said)")
            // The stream binds the fresh site to c: fenced at what the member held of it (nothing).
            #expect(try Store(path: member).fences()[fresh] == 0)
        }
        // Compared outside Shoal: both members hold c's rows from before its removal, and nothing after.
        #expect(try Self.rows(a) == "before|1\nmid|3\n")
        #expect(try Self.rows(b) == (try Self.rows(a)))
        // The members sync with each other and stay identical (their cuts of the fresh site agree).
        try Self.stream(a, b)
        try Self.stream(b, a)
        #expect(try Self.rows(a) == "before|1\nmid|3\n" && (try Self.rows(b)) == "before|1\nmid|3\n")
        #expect(try Store(path: a).digest() == (try Store(path: b).digest()))
    }

    @Test func aMemberThatGotMoreBeforeItLearntOfTheRemovalSignsItsCutAndEveryMemberKeepsIt() throws {
        let directory = try temporaryDirectory("fence-amend")
        defer { try? FileManager.default.removeItem(at: directory) }
        let paths = try makeCluster(["a", "b", "c"], in: directory)
        let (a, b, c) = (paths[0], paths[1], paths[2])
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('x1', 1)").status == 0)
        try Self.stream(c, a)
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('x2', 2)").status == 0)
        try Self.stream(c, b)  // b holds c's last transaction, a does not
        let cSite = try Store(path: c).siteID
        let bHeld = try Store(path: b).versionVector()[cSite]
        #expect(bHeld == (try Store(path: a).versionVector()[cSite]) + 1)
        #expect(try shoal("trust", "remove", try Self.nodeID(c), "--db", a).status == 0)
        #expect(try sqlite3Shell(c, "INSERT INTO kv VALUES ('x3', 3)").status == 0)
        // b learns of the removal holding more of c than its cut: it keeps it and signs its own cut.
        try Self.stream(a, b)
        let cluster = try KeyFile.load(forDatabase: a).cluster.id
        #expect(try Membership.roster(store: try Store(path: b), cluster: cluster).fences == [cSite: bHeld])
        #expect(try Self.stream(c, b).contains("refused 1 changes"))
        // a takes b's cut, then the transaction it lacked (the second exchange brings what the first left out).
        try Self.stream(b, a)
        try Self.stream(b, a)
        #expect(try Membership.roster(store: try Store(path: a), cluster: cluster).fences == [cSite: bHeld])
        #expect(try Self.stream(c, a).contains("refused 1 changes"))
        #expect(try Self.rows(a) == "x1|1\nx2|2\n")
        #expect(try Self.rows(b) == (try Self.rows(a)))
        #expect(try Store(path: a).digest() == (try Store(path: b).digest()))
    }
}

/// The lines a ``CapturingLogHandler`` kept: each message and its `changes` metadata.
private final class LogLines: Sendable {
    let lines = Mutex<[(message: String, changes: String)]>([])
}

/// Keeps each line logged in `log`.
private struct CapturingLogHandler: LogHandler {
    let log: LogLines
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?
    var logLevel: Logger.Level = .trace

    func log(event: LogEvent) {
        let changes = event.metadata?["changes"].map { "\($0)" } ?? ""
        log.lines.withLock { $0.append((event.message.description, changes)) }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
}
