import ShoalRelayProtocol

/// Gathers sealed envelopes into upload requests of about `requestBytes` each, with no I/O: a request goes as soon as
/// what it gathered reaches the size, and what is left goes at the end of the stream.
struct RelayUploadBuffer: Sendable {
    /// About how many bytes each request carries.
    let requestBytes: Int
    private var envelopes: [RelayEnvelope] = []
    private var bytes = 0

    init(requestBytes: Int) {
        self.requestBytes = requestBytes
    }

    /// Adds `envelope`; returns the request to send (and empties the buffer) once it reached the size.
    mutating func add(_ envelope: RelayEnvelope) -> [RelayEnvelope]? {
        envelopes.append(envelope)
        bytes += envelope.encodedCount
        guard bytes >= requestBytes else { return nil }
        return flush()
    }

    /// What is left to send, emptied (nil: nothing).
    mutating func flush() -> [RelayEnvelope]? {
        guard !envelopes.isEmpty else { return nil }
        defer {
            envelopes = []
            bytes = 0
        }
        return envelopes
    }
}
