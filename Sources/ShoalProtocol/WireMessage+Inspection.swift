import ShoalCore

/// The byte layout of the inspection messages (protocol version 3; see the ShoalProtocol documentation).
extension WireMessage {
    static func encode(_ hello: Hello, into bytes: inout [UInt8]) {
        bytes.appendBigEndian32(WireProtocol.magic)
        bytes.appendBigEndian16(hello.versions.lowerBound)
        bytes.appendBigEndian16(hello.versions.upperBound)
        bytes.appendString(hello.clusterID)
        bytes.append(contentsOf: hello.siteID.bytes)
        bytes.appendString(hello.nodeName)
        bytes.appendString(hello.schemaFingerprint)
        bytes.appendBigEndian16(hello.listenPort)
    }

    static func decodeHello(_ reader: inout ByteReader) throws(ShoalError) -> Hello {
        guard try reader.readBigEndian32() == WireProtocol.magic else {
            throw malformed("hello without the SHOL magic")
        }
        let minimum = try reader.readBigEndian16()
        let maximum = try reader.readBigEndian16()
        guard minimum <= maximum else { throw malformed("hello with an empty version range") }
        let cluster = try reader.readString()
        guard let site = SiteID(bytes: try reader.readBytes(16)) else { throw malformed("bad site id") }
        return Hello(
            versions: minimum...maximum,
            clusterID: cluster,
            siteID: site,
            nodeName: try reader.readString(),
            schemaFingerprint: try reader.readString(),
            listenPort: try reader.readBigEndian16()
        )
    }

    static func encode(_ request: InspectionRequest, into bytes: inout [UInt8]) {
        bytes.appendBigEndian(request.requestID)
        switch request.query {
        case .tables:
            bytes.append(0)
        case .rows(let table, let after, let limit):
            bytes.append(1)
            bytes.appendString(table)
            if let after {
                bytes.append(1)
                bytes.appendVarint(UInt64(after.count))
                bytes.append(contentsOf: after)
            } else {
                bytes.append(0)
            }
            bytes.appendBigEndian32(limit)
        }
    }

    static func decodeInspectionRequest(_ reader: inout ByteReader) throws(ShoalError) -> InspectionRequest {
        let requestID = try reader.readBigEndianUInt64()
        switch try reader.readByte() {
        case 0:
            return InspectionRequest(requestID: requestID, query: .tables)
        case 1:
            let table = try reader.readString()
            var after: [UInt8]?
            switch try reader.readByte() {
            case 0: break
            case 1: after = Array(try reader.readBytes(try reader.readLength()))
            default: throw malformed("bad key flag in an inspection request")
            }
            let limit = try reader.readBigEndian32()
            guard limit > 0, limit <= WireProtocol.maximumInspectionPage else {
                throw malformed("an inspection page of \(limit) rows")
            }
            return InspectionRequest(requestID: requestID, query: .rows(table: table, after: after, limit: limit))
        case let other:
            throw malformed("unknown inspection query \(other)")
        }
    }

    static func encode(_ answer: InspectionAnswer, into bytes: inout [UInt8]) {
        bytes.appendBigEndian(answer.requestID)
        switch answer.content {
        case .tables(let vector, let digest, let tables):
            bytes.append(0)
            bytes.appendVersionVector(vector)
            bytes.appendVarint(UInt64(digest.count))
            bytes.append(contentsOf: digest)
            bytes.appendVarint(UInt64(tables.count))
            for table in tables {
                bytes.appendString(table.name)
                bytes.appendVarint(UInt64(table.keyColumns.count))
                for column in table.keyColumns { bytes.appendString(column) }
                bytes.appendVarint(UInt64(table.digest.count))
                bytes.append(contentsOf: table.digest)
                bytes.appendVarint(table.rows)
            }
        case .rows(let table, let rows, let isLast):
            bytes.append(1)
            bytes.appendString(table)
            bytes.append(isLast ? 1 : 0)
            bytes.appendVarint(UInt64(rows.count))
            for row in rows {
                bytes.appendVarint(UInt64(row.key.count))
                bytes.append(contentsOf: row.key)
                bytes.appendVarint(UInt64(row.hash.count))
                bytes.append(contentsOf: row.hash)
            }
        }
    }

    static func decodeInspectionAnswer(_ reader: inout ByteReader) throws(ShoalError) -> InspectionAnswer {
        let requestID = try reader.readBigEndianUInt64()
        func hash() throws(ShoalError) -> [UInt8] {
            let count = try reader.readLength()
            guard count <= 64 else { throw malformed("a hash of \(count) bytes") }
            return Array(try reader.readBytes(count))
        }
        switch try reader.readByte() {
        case 0:
            let vector = try reader.readVersionVector()
            let digest = try hash()
            let count = try reader.readVarint()
            // Each table takes at least 4 bytes: a bound before reading on.
            guard count <= UInt64(reader.remaining / 4) else {
                throw malformed("\(count) tables cannot fit in the frame")
            }
            var tables: [TableSummary] = []
            for _ in 0..<count {
                let name = try reader.readString()
                let keyCount = try reader.readVarint()
                guard keyCount <= 64 else { throw malformed("a primary key of \(keyCount) columns") }
                var keyColumns: [String] = []
                for _ in 0..<keyCount { keyColumns.append(try reader.readString()) }
                let digest = try hash()
                tables.append(
                    TableSummary(name: name, keyColumns: keyColumns, digest: digest, rows: try reader.readVarint())
                )
            }
            return InspectionAnswer(
                requestID: requestID,
                content: .tables(versionVector: vector, digest: digest, tables: tables)
            )
        case 1:
            let table = try reader.readString()
            let flag = try reader.readByte()
            guard flag <= 1 else { throw malformed("bad last-page flag in an inspection answer") }
            let count = try reader.readVarint()
            guard count <= UInt64(WireProtocol.maximumInspectionPage), count <= UInt64(reader.remaining / 2) else {
                throw malformed("an inspection page of \(count) rows")
            }
            var rows: [RowHash] = []
            rows.reserveCapacity(Int(count))
            for _ in 0..<count {
                let key = Array(try reader.readBytes(try reader.readLength()))
                rows.append(RowHash(key: key, hash: try hash()))
            }
            return InspectionAnswer(requestID: requestID, content: .rows(table: table, rows: rows, isLast: flag == 1))
        case let other:
            throw malformed("unknown inspection answer \(other)")
        }
    }
}
