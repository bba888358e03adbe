import ShoalCore

extension ChangeBatch {
    /// The batch encoded as a change batch message holds it, without the message's own fields: its claim (a version
    /// vector), then its changes (a table of the sites they name, then each change). No value travels in pieces.
    public func encodedBody() -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.appendVersionVector(claim)
        WireMessage.encode(changes, pieced: [], into: &bytes)
        return bytes
    }

    /// Decodes ``encodedBody()``: the whole of `bytes`, and nothing past them; throws ``ShoalError``
    /// (`.malformedMessage`) for anything else, a change whose value was to come in pieces included.
    public init(decodingBody bytes: [UInt8]) throws(ShoalError) {
        var reader = ByteReader(bytes)
        do throws(ShoalError) {
            let claim = try reader.readVersionVector()
            let (changes, pieced) = try WireMessage.decodeChanges(&reader)
            guard pieced.isEmpty else { throw WireMessage.malformed("a change batch whose values come in pieces") }
            guard reader.isAtEnd else {
                throw WireMessage.malformed("\(bytes.count - reader.offset) unexpected trailing bytes")
            }
            self.init(changes: changes, claim: claim)
        } catch {
            // The byte reader reports truncation as corrupt metadata; in a message it is a malformed one.
            guard error.code == .corruptMetadata else { throw error }
            throw WireMessage.malformed("a change batch cut short")
        }
    }
}
