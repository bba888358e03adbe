import Shoal

/// A relay operator who alters what the relay answers: while it is on, some pull answers reach the nodes changed
/// (a byte flipped in a chunk, two chunks swapped, a chunk of another cluster injected, an earlier authentic chunk
/// replayed as a later range). Every chunk is sealed with its header authenticated, so no node may apply any of it.
actor Tampering {
    /// The run's cluster id (hex): chunks of any other cluster seen in uploads are kept, to inject.
    let cluster: String
    /// Whether pull answers are being altered.
    private(set) var isOn = false
    /// The share of pull answers altered while on.
    private var probability = 0.0
    /// Encoded chunks of another cluster, captured from uploads that went through the proxy.
    private(set) var foreign: [[UInt8]] = []
    /// Encoded chunks of this cluster seen in pull answers (the latest few, small ones), to replay.
    private var authentic: [[UInt8]] = []
    /// What was done, by kind.
    private(set) var counts: [String: Int] = [:]
    private var random = SystemRandomNumberGenerator()

    init(cluster: String) { self.cluster = cluster }

    func set(on: Bool, probability: Double) {
        isOn = on
        self.probability = on ? probability : 0
    }

    /// Whether to alter the answer about to come.
    func shouldAlter() -> Bool { isOn && Double.random(in: 0..<1, using: &random) < probability }

    /// Keeps the chunks of another cluster from an upload's body.
    func captureUpload(_ body: [UInt8]) {
        guard foreign.count < 8, let entries = Self.entries(body) else { return }
        for entry in entries where foreign.count < 8 {
            guard let envelope = try? RelayEnvelope.decode(entry[...]), envelope.cluster != cluster else { continue }
            foreign.append(entry)
        }
    }

    /// Keeps some authentic chunks of a pull answer that went through unaltered.
    func capturePull(_ body: [UInt8]) {
        guard let entries = Self.entries(body) else { return }
        for entry in entries where entry.count <= 64 * 1024 {
            authentic.append(entry)
        }
        if authentic.count > 32 { authentic.removeFirst(authentic.count - 32) }
    }

    /// `body` (a ``RelayEnvelopeList``) altered one way; the same bytes when it cannot be parsed.
    func alter(_ body: [UInt8]) -> [UInt8] {
        guard var entries = Self.entries(body) else { return body }
        var kinds = ["replayed chunk"]
        if !entries.isEmpty { kinds.append("flipped byte") }
        if entries.count >= 2 { kinds.append("swapped chunks") }
        if !foreign.isEmpty { kinds.append("foreign chunk") }
        let kind = kinds.randomElement(using: &random)!
        switch kind {
        case "flipped byte":
            let index = Int.random(in: 0..<entries.count, using: &random)
            // Mostly inside the sealed body (the AEAD refuses it), sometimes in the header (its seal covers it).
            let count = entries[index].count
            let offset =
                Bool.random(using: &random) && count > 60
                ? Int.random(in: (count - 28)..<count, using: &random) : Int.random(in: 0..<count, using: &random)
            entries[index][offset] ^= UInt8.random(in: 1...255, using: &random)
        case "swapped chunks":
            let first = Int.random(in: 0..<entries.count, using: &random)
            var second = Int.random(in: 0..<(entries.count - 1), using: &random)
            if second >= first { second += 1 }
            entries.swapAt(first, second)
        case "foreign chunk":
            var chunk = foreign.randomElement(using: &random)!
            // Half the time dressed as this cluster's, under a site and range the page holds (its seal still says
            // otherwise).
            if Bool.random(using: &random), var envelope = try? RelayEnvelope.decode(chunk[...]) {
                envelope.cluster = cluster
                if let other = entries.lazy.compactMap({ try? RelayEnvelope.decode($0[...]) }).first {
                    envelope.site = other.site
                    envelope.from = other.from
                    envelope.to = other.from + 1
                    envelope.flags = [.batchEnd, .rangeEnd]
                    envelope.index = 0
                }
                chunk = envelope.encoded()
            }
            entries.insert(chunk, at: Int.random(in: 0...entries.count, using: &random))
        default:
            guard let earlier = authentic.randomElement(using: &random) else {
                // Nothing seen yet: this page's own first chunk again, later in the page.
                if let first = entries.first { entries.append(first) }
                break
            }
            var chunk = earlier
            // Mostly re-filed after the range it belonged to (its authenticated header said otherwise); sometimes sent
            // again exactly as it was.
            if Int.random(in: 0..<4, using: &random) != 0, var envelope = try? RelayEnvelope.decode(earlier[...]) {
                let length = max(envelope.to > envelope.from ? envelope.to - envelope.from : 1, 1)
                let later = entries.lazy.compactMap { try? RelayEnvelope.decode($0[...]) }
                    .filter { $0.site == envelope.site }.map { max($0.to, $0.from) }.max()
                envelope.from = max(later ?? 0, envelope.to, envelope.from) + UInt64.random(in: 0...2, using: &random)
                envelope.to = envelope.from + length
                envelope.index = 0
                envelope.flags = [.batchEnd, .rangeEnd]
                chunk = envelope.encoded()
            }
            entries.append(chunk)
        }
        counts[kind, default: 0] += 1
        var altered: [UInt8] = []
        for entry in entries {
            let length = UInt32(entry.count)
            altered += [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)]
            altered += entry
        }
        return altered
    }

    /// The entries of an envelope list (each one's bytes, without its length), or nil when the framing is broken.
    static func entries(_ body: [UInt8]) -> [[UInt8]]? {
        var entries: [[UInt8]] = []
        var position = 0
        while position < body.count {
            guard body.count - position >= 4 else { return nil }
            let length = body[position..<position + 4].reduce(0) { $0 << 8 | Int($1) }
            position += 4
            guard body.count - position >= length else { return nil }
            entries.append(Array(body[position..<position + length]))
            position += length
        }
        return entries
    }
}
