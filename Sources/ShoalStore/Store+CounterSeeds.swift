import ShoalCore

/// A row's counter values as found when its table was first replicated.
struct CounterSeed {
    let key: [SQLValue]
    /// Per column (0 for columns that are not counters).
    let values: [Int64]
}

extension Store {
    /// Records the counter values rows held when their table was first replicated as one transaction of a site that
    /// stands for exactly those values, rather than as this node's own increments.
    ///
    /// Devices often start from the same file (an app shipping a catalogue with stock counts, a copied seed
    /// database): each replicates the table on its own, offline. Were each device's values its own contribution, the
    /// counters would add up once per device (a stock of 4 seen as 12 on three nodes). The seed site is derived from
    /// the table, its counters and every seeded row's key and values, so devices seeded alike write the very same
    /// transaction (the same dot with the same content), which counts once however many of them replicate; devices
    /// seeded differently write different ones, which add up, as the contributions of different devices do. The
    /// clock of the seed is the earliest there is: it carries no time of its own.
    ///
    /// The rows were just stamped as this node's (their columns, and the values as its increments, so the data rows
    /// hold them): the increments move to the seed's site, and the sums stay.
    func recordCounterSeeds(_ seeds: [CounterSeed], table: ReplicatedTable) throws(ShoalError) {
        guard !seeds.isEmpty else { return }
        let ordered = seeds.map { (SQLValue.encodeKey($0.key), $0) }.sorted { $0.0.lexicographicallyPrecedes($1.0) }
        var content = Array("shoal counter seeds\0\(table.name)\0".utf8)
        for (index, column) in table.columns.enumerated() where table.isCounter[index] {
            content.append(contentsOf: Array("\(column)\0".utf8))
        }
        for (keyBytes, seed) in ordered {
            content.appendVarint(UInt64(keyBytes.count))
            content.append(contentsOf: keyBytes)
            for value in seed.values { content.appendBigEndian(UInt64(bitPattern: value)) }
        }
        let dot = Dot(site: SiteID.derived(from: content), seq: 1)
        let hlc = HLC(milliseconds: 0, logical: 1)
        var keys: [UInt8] = []
        for (_, seed) in ordered {
            guard var state = try loadState(table: table, key: seed.key) else { continue }
            for (index, value) in seed.values.enumerated() where table.isCounter[index] && value != 0 {
                var entries: [SiteID: CounterEntry] = [:]
                if case .counter(let current) = state.cells[index] { entries = current }
                entries[siteID] = nil
                entries[dot.site] = CounterEntry(
                    increments: value > 0 ? UInt64(value) : 0,
                    decrements: value < 0 ? value.magnitude : 0,
                    seq: dot.seq,
                    hlc: hlc
                )
                state.cells[index] = .counter(entries)
            }
            try saveState(state, table: table, key: seed.key)
            appendLogKey(seed.key, to: &keys)
        }
        try appendLog(dot: dot, table: table.id, hlc: hlc, keys: keys)
        let claim = try statement(
            "INSERT INTO shoal_claims(site, seq) VALUES (?, ?) ON CONFLICT(site) DO UPDATE SET seq = max(seq, excluded.seq)"
        )
        try claim.bind([.integer(Int64(sites.index(of: dot.site))), .integer(Int64(dot.seq))])
        try claim.run()
        try persistNewSites()
    }
}
