import Foundation
import ShoalCore
import ShoalRelayProtocol

/// A snapshot's version vector as both storages keep it (JSON, as the API writes vectors), and the check that a
/// snapshot is whole before it is used.
enum RelaySnapshotVector {
    static func encode(_ vector: VersionVector) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: (try? encoder.encode(RelayAPI.json(vector))) ?? Data("{}".utf8), as: UTF8.self)
    }

    /// The vector `text` holds; what cannot be read counts as empty (a snapshot that covers nothing is never used).
    static func decode(_ text: String) -> VersionVector {
        guard let json = try? JSONDecoder().decode([String: UInt64].self, from: Data(text.utf8)) else { return VersionVector() }
        return (try? RelayAPI.vector(json)) ?? VersionVector()
    }

    /// Why a snapshot whose ranges end at `heads` does not cover exactly `vector`, or nil when it does.
    static func mismatch(heads: VersionVector, vector: VersionVector) -> String? {
        guard !vector.isEmpty else { return "a snapshot covers something" }
        for (site, seq) in vector.entries where seq > 0 && heads[site] != seq {
            return "its ranges of site \(site.hex.prefix(8)) end at \(heads[site]), not at \(seq)"
        }
        for (site, head) in heads.entries where head > vector[site] {
            return "it holds site \(site.hex.prefix(8)) up to \(head), beyond the \(vector[site]) it claims"
        }
        return nil
    }
}

/// A range of a change log as the retention weighs it.
struct RetainedRange {
    var site: SiteID
    var from: Int64
    var upload: Int64
    var to: UInt64
    var bytes: Int64
    var created: Int64
}

extension RelayRetention {
    /// The ranges of `newestFirst` (a cluster's change log, newest first) to drop: those `snapshot` covers that are
    /// older than the age limit or beyond the byte budget, counting from the newest. Ranges are made in order along
    /// each site's chain, so what goes is a prefix of every chain and what stays still runs on from the snapshot.
    func drops(_ newestFirst: [RetainedRange], snapshot: VersionVector, now: Int64) -> [RetainedRange] {
        let cutoff = now - maximumAgeMilliseconds
        var kept: Int64 = 0
        var drops: [RetainedRange] = []
        // Per site, what is kept is the newest part of its log, without a hole: once one of its ranges goes, every
        // range before it along the chain goes too (a newer range over the budget never leaves older small ones
        // behind it, which no pull could reach past).
        var cut: [SiteID: Int64] = [:]
        for range in newestFirst where range.to <= snapshot[range.site] {
            if range.created >= cutoff && kept + range.bytes <= maximumBytes {
                kept += range.bytes
            } else {
                cut[range.site] = max(cut[range.site] ?? .min, range.from)
            }
        }
        for range in newestFirst where range.to <= snapshot[range.site] {
            if let below = cut[range.site], range.from <= below { drops.append(range) }
        }
        return drops
    }
}
