import ShoalCore

extension ShoalFuzzing {
    /// Parses the bytes as an offline change stream, line by line as `shoal apply` does. Each line is handed
    /// over in a buffer of its own exact size, so a read past its end is a read out of bounds (AddressSanitizer
    /// sees it). A stream that parses must write back to one that parses to the same stream.
    public static func fuzzStream(_ bytes: UnsafeRawBufferPointer) {
        var parser = ChangeStream.Parser()
        var start = 0
        var failed = false
        while start <= bytes.count, !failed {
            let end = bytes[start...].firstIndex(of: 0x0A) ?? bytes.count
            let line = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: end - start)
            _ = line.initialize(from: bytes[start..<end])
            do throws(ShoalError) {
                try parser.consume(line: UnsafeBufferPointer(line))
            } catch {
                expectStreamError(error)
                failed = true
            }
            line.deallocate()
            start = end + 1
        }
        if failed { return }
        let contents: ChangeStream.Contents
        do throws(ShoalError) {
            contents = try parser.finish()
        } catch {
            expectStreamError(error)
            return
        }
        let written = write(contents)
        let again: ChangeStream.Contents
        do throws(ShoalError) {
            again = try ChangeStream.parse(lines: String(decoding: written, as: UTF8.self).split(separator: "\n"))
        } catch {
            fatalError("a parsed stream does not parse once written back: \(error)")
        }
        guard write(again) == written else { fatalError("a parsed stream changes when written back") }

        // The same bytes as the JSON argument of `--since`, which shares the scanner.
        if bytes.count <= 4096 {
            _ = try? ChangeStream.parseVersionVector(json: String(decoding: bytes, as: UTF8.self))
        }
    }

    static func write(_ contents: ChangeStream.Contents) -> [UInt8] {
        var bytes = Array(
            ChangeStream.headerLine(.init(site: contents.site, since: contents.since, claim: contents.claim)).utf8
        )
        bytes.append(0x0A)
        var writer = ChangeStream.Writer()
        for change in contents.changes {
            writer.append(change, to: &bytes)
            bytes.append(0x0A)
        }
        bytes.append(contentsOf: ChangeStream.trailerLine(count: contents.changes.count).utf8)
        bytes.append(0x0A)
        return bytes
    }

    static func expectStreamError(_ error: ShoalError) {
        switch error.code {
        case .malformedStream, .truncatedStream: break
        default: fatalError("the stream parser refused input with an unexpected error: \(error)")
        }
    }
}
