/// JSON documents of a few KB, like an app's orders or notes: repeated keys, words from a vocabulary, numbers, dates
/// and free text. What compression of "text-heavy rows" is measured on (tests and the benchmark alike): compressible as
/// real JSON is, not as a run of one repeated byte.
public enum JSONDocuments {
    private static let words = """
        alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo \
        sierra tango uniform victor whiskey xray yankee zulu order customer invoice shipped pending delivered \
        warehouse priority note address street city region country parcel label return refund discount coupon \
        morning evening weekday weekend express standard fragile heavy light blue green red black white silver
        """.split(separator: " ").map(String.init)

    /// Document `index`, drawn from `generator` (about 1 to 3 KB, 1.8 KB on average).
    public static func document(_ index: Int, _ generator: inout SplitMix) -> String {
        func word() -> String { words[Int(generator.next() % UInt64(words.count))] }
        func number(_ range: ClosedRange<Int>) -> Int { range.lowerBound + Int(generator.next() % UInt64(range.count)) }
        func phrase(_ count: Int) -> String { (0..<count).map { _ in word() }.joined(separator: " ") }
        let items = (0..<number(8...20)).map { _ in
            "{\"sku\": \"SKU-\(number(10_000...99_999))\", \"name\": \"\(phrase(3))\", \"quantity\": \(number(1...9)), "
                + "\"price\": \(number(100...50_000)).\(number(10...99))}"
        }
        return "{\"id\": \(index), \"type\": \"order\", \"customer\": {\"name\": \"\(phrase(2))\", "
            + "\"email\": \"user\(number(1...99_999))@example.com\", \"address\": {\"street\": \"\(number(1...999)) "
            + "\(word()) street\", \"city\": \"\(word())\", \"country\": \"\(["FR", "DE", "US", "GB", "JP"][number(0...4)])\"}}, "
            + "\"items\": [\(items.joined(separator: ", "))], "
            + "\"status\": \"\(["pending", "shipped", "delivered"][number(0...2)])\", "
            + "\"notes\": \"\(phrase(number(20...80)))\", "
            + "\"created\": \"2026-0\(number(1...9))-1\(number(0...9))T10:\(number(10...59)):00Z\"}"
    }
}
