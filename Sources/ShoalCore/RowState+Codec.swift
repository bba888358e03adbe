/// Maps site ids to the small integers the store writes in its metadata, and back.
public protocol SiteIndexing {
    /// The index of `site`, allocating one if it is new.
    mutating func index(of site: SiteID) -> UInt64
    /// The site of a stored index.
    func site(at index: UInt64) throws(ShoalError) -> SiteID
}

extension RowState {
    /// The compact binary form stored beside each row.
    public func encoded(sites: inout some SiteIndexing) -> [UInt8] {
        var buffer = [UInt8]()
        buffer.reserveCapacity(16 + cells.count * 14)
        buffer.appendVarint(causalLength)
        if let lengthStamp {
            buffer.append(1)
            Self.encode(lengthStamp, into: &buffer, sites: &sites)
        } else {
            buffer.append(0)
        }
        buffer.appendVarint(UInt64(cells.count))
        // A row's columns are mostly written together: a value cell with the stamp of the value cell before it (and
        // no previous dot) is one byte (tag 4) instead of about thirteen.
        var lastStamp: Stamp?
        for cell in cells {
            switch cell {
            case .empty:
                buffer.append(0)
            case .value(let stamp, nil) where stamp == lastStamp:
                buffer.append(4)
            case .value(let stamp, let previous):
                lastStamp = stamp
                buffer.append(previous == nil ? 1 : 3)
                Self.encode(stamp, into: &buffer, sites: &sites)
                if let previous {
                    buffer.appendVarint(sites.index(of: previous.site))
                    buffer.appendVarint(previous.seq)
                }
            case .counter(let entries):
                buffer.append(2)
                buffer.appendVarint(UInt64(entries.count))
                for (site, entry) in entries.sorted(by: { $0.key < $1.key }) {
                    buffer.appendVarint(sites.index(of: site))
                    buffer.appendVarint(entry.seq)
                    buffer.appendBigEndian(entry.hlc.rawValue)
                    buffer.appendVarint(entry.increments)
                    buffer.appendVarint(entry.decrements)
                }
            }
        }
        return buffer
    }

    /// Decodes the stored form; `columnCount` is the table's current number of non-key columns.
    ///
    /// Metadata written before columns were added to the table (they come last) has fewer cells: the added columns
    /// read as never written (``Cell/empty``), so adding a column rewrites no row's metadata.
    public init(encoded bytes: [UInt8], columnCount: Int, sites: some SiteIndexing) throws(ShoalError) {
        var reader = ByteReader(bytes)
        let causalLength = try reader.readVarint()
        let lengthStamp: Stamp? = try reader.readByte() == 1 ? try Self.decodeStamp(&reader, sites: sites) : nil
        let count = Int(try reader.readVarint())
        guard count <= columnCount else {
            throw ShoalError.corruptMetadata("row metadata has \(count) columns, the table has \(columnCount)")
        }
        var cells = [Cell]()
        cells.reserveCapacity(count)
        var lastStamp: Stamp?
        for _ in 0..<count {
            switch try reader.readByte() {
            case 0:
                cells.append(.empty)
            case 1:
                let stamp = try Self.decodeStamp(&reader, sites: sites)
                lastStamp = stamp
                cells.append(.value(stamp, previous: nil))
            case 4:
                guard let lastStamp else {
                    throw ShoalError.corruptMetadata(
                        "a cell repeats the stamp of a value cell before it, and there is none"
                    )
                }
                cells.append(.value(lastStamp, previous: nil))
            case 3:
                let stamp = try Self.decodeStamp(&reader, sites: sites)
                lastStamp = stamp
                let site = try sites.site(at: try reader.readVarint())
                cells.append(.value(stamp, previous: Dot(site: site, seq: try reader.readVarint())))
            case 2:
                var entries: [SiteID: CounterEntry] = [:]
                for _ in 0..<(try reader.readVarint()) {
                    let site = try sites.site(at: try reader.readVarint())
                    let seq = try reader.readVarint()
                    let hlc = HLC(rawValue: try reader.readBigEndianUInt64())
                    entries[site] = CounterEntry(
                        increments: try reader.readVarint(),
                        decrements: try reader.readVarint(),
                        seq: seq,
                        hlc: hlc
                    )
                }
                cells.append(.counter(entries))
            case let tag:
                throw ShoalError.corruptMetadata("unknown cell tag \(tag)")
            }
        }
        while cells.count < columnCount { cells.append(.empty) }
        self.init(causalLength: causalLength, lengthStamp: lengthStamp, cells: cells)
    }

    private static func encode(_ stamp: Stamp, into buffer: inout [UInt8], sites: inout some SiteIndexing) {
        buffer.appendBigEndian(stamp.hlc.rawValue)
        buffer.appendVarint(sites.index(of: stamp.site))
        buffer.appendVarint(stamp.seq)
    }

    private static func decodeStamp(_ reader: inout ByteReader, sites: some SiteIndexing) throws(ShoalError) -> Stamp {
        let hlc = HLC(rawValue: try reader.readBigEndianUInt64())
        let site = try sites.site(at: try reader.readVarint())
        return Stamp(hlc: hlc, site: site, seq: try reader.readVarint())
    }
}
