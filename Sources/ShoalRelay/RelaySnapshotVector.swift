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
