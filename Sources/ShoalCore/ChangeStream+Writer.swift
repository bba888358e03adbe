import Foundation

extension ChangeStream {
    /// Encodes change lines straight into bytes, remembering the last site's and table's encodings (a
    /// stream repeats them on every line).
    public struct Writer {
        private var lastSite: SiteID?
        private var lastSiteHex: [UInt8] = []

        /// A writer that has written nothing yet.
        public init() {}

        /// Appends `change` as one line, without its newline. Keys are written in sorted order.
        public mutating func append(_ change: Change, to bytes: inout [UInt8]) {
            if change.stamp.site != lastSite {
                lastSite = change.stamp.site
                lastSiteHex = Array(change.stamp.site.hex.utf8)
            }
            bytes.append(0x7B)
            switch change.payload {
            case .row: break
            case .column(let name, _), .counter(let name, _, _):
                bytes.appendASCII("\"c\":")
                bytes.appendJSONString(name)
                bytes.append(0x2C)
            }
            bytes.appendASCII("\"cl\":")
            bytes.appendDecimal(change.causalLength)
            if case .counter(_, _, let decrements) = change.payload {
                bytes.appendASCII(",\"dec\":")
                bytes.appendDecimal(decrements)
            }
            bytes.appendASCII(",\"h\":")
            bytes.appendDecimal(change.stamp.hlc.rawValue)
            if case .counter(_, let increments, _) = change.payload {
                bytes.appendASCII(",\"inc\":")
                bytes.appendDecimal(increments)
            }
            bytes.appendASCII(",\"k\":[")
            for (index, value) in change.primaryKey.enumerated() {
                if index > 0 { bytes.append(0x2C) }
                Self.append(value, to: &bytes)
            }
            bytes.append(0x5D)
            if let previous = change.previous {
                bytes.appendASCII(",\"p\":\"")
                if previous.site == lastSite {
                    bytes.append(contentsOf: lastSiteHex)
                } else {
                    bytes.append(contentsOf: previous.site.hex.utf8)
                }
                bytes.append(0x3A)
                bytes.appendDecimal(previous.seq)
                bytes.append(0x22)
            }
            bytes.appendASCII(",\"q\":")
            bytes.appendDecimal(change.stamp.seq)
            bytes.appendASCII(",\"s\":\"")
            bytes.append(contentsOf: lastSiteHex)
            bytes.appendASCII("\",\"t\":")
            bytes.appendJSONString(change.table)
            if case .column(_, let value) = change.payload {
                bytes.appendASCII(",\"v\":")
                Self.append(value, to: &bytes)
            }
            bytes.append(0x7D)
        }

        /// Appends one value in its exact JSON form (see ``ChangeStream``).
        static func append(_ value: SQLValue, to bytes: inout [UInt8]) {
            switch value {
            case .null:
                bytes.appendASCII("null")
            case .integer(let integer):
                bytes.appendDecimal(integer)
            case .real(let real):
                bytes.appendASCII("{\"real\":")
                if real.isFinite {
                    // Swift prints the shortest digits that read back to the same bits, "-0.0" included.
                    bytes.append(contentsOf: real.description.utf8)
                } else if real.isNaN {
                    bytes.appendASCII("\"nan\"")
                } else {
                    bytes.appendASCII(real < 0 ? "\"-inf\"" : "\"inf\"")
                }
                bytes.append(0x7D)
            case .text(let text):
                bytes.appendJSONString(text)
            case .invalidText(let raw):
                bytes.appendASCII("{\"text_base64\":\"")
                bytes.append(contentsOf: Data(raw).base64EncodedString().utf8)
                bytes.appendASCII("\"}")
            case .blob(let raw):
                bytes.appendASCII("{\"blob\":\"")
                bytes.append(contentsOf: Data(raw).base64EncodedString().utf8)
                bytes.appendASCII("\"}")
            }
        }
    }
}
