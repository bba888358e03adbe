import ShoalCore

extension QueryResult {
    /// The rows as values of `type`, its coding keys matched to the result's column names: INTEGER to any integer
    /// type or `Bool`, REAL (or INTEGER) to `Double` and `Float`, TEXT to `String`, BLOB to `[UInt8]`, NULL to nil
    /// (an `Optional` property, or a missing one). A value of another type, or a column the type needs and the result
    /// lacks, throws ``ShoalError/Code/invalidArgument`` naming the column.
    ///
    /// ```swift
    /// struct Todo: Decodable { var title: String; var done: Bool }
    /// for try await todos in node.observe("SELECT title, done FROM todos").map({ try $0.decode(Todo.self) }) { … }
    /// ```
    public func decode<T: Decodable>(_ type: T.Type) throws -> [T] {
        let index = Dictionary(columns.enumerated().map { ($1, $0) }, uniquingKeysWith: { first, _ in first })
        return try rows.map { row in try T(from: RowDecoder(index: index, row: row)) }
    }
}

/// Decodes one row: a keyed container over its columns.
private struct RowDecoder: Decoder {
    let index: [String: Int]
    let row: [SQLValue]
    var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(Columns(index: index, row: row))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw ShoalError(code: .invalidArgument, message: "a row decodes into a type with coding keys, not a list")
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw ShoalError(code: .invalidArgument, message: "a row decodes into a type with coding keys, not one value")
    }
}

private struct Columns<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let index: [String: Int]
    let row: [SQLValue]
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { index.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { index[key.stringValue] != nil }

    private func value(_ key: Key) throws -> SQLValue {
        guard let position = index[key.stringValue], position < row.count else {
            throw ShoalError(code: .invalidArgument, message: "the result has no column \(key.stringValue)")
        }
        return row[position]
    }

    private func mismatch(_ key: Key, _ wanted: String, _ value: SQLValue) -> ShoalError {
        ShoalError(code: .invalidArgument, message: "column \(key.stringValue) holds \(value), not \(wanted)")
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        guard contains(key) else { return true }
        if case .null = try value(key) { return true }
        return false
    }

    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decodeInteger(Int64.self, key) != 0 }
    func decode(_ type: String.Type, forKey key: Key) throws -> String {
        let value = try value(key)
        guard case .text(let text) = value else { throw mismatch(key, "text", value) }
        return text
    }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double {
        switch try value(key) {
        case .real(let real): return real
        case .integer(let integer): return Double(integer)
        case let other: throw mismatch(key, "a number", other)
        }
    }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { Float(try decode(Double.self, forKey: key)) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decodeInteger(type, key) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decodeInteger(type, key) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decodeInteger(type, key) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decodeInteger(type, key) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decodeInteger(type, key) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decodeInteger(type, key) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decodeInteger(type, key) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decodeInteger(type, key) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decodeInteger(type, key) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decodeInteger(type, key) }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if type == [UInt8].self {
            let value = try value(key)
            guard case .blob(let bytes) = value else { throw mismatch(key, "a blob", value) }
            return bytes as! T
        }
        throw ShoalError(code: .invalidArgument, message: "column \(key.stringValue): \(type) is not a column type")
    }

    private func decodeInteger<T: FixedWidthInteger>(_ type: T.Type, _ key: Key) throws -> T {
        let value = try value(key)
        guard case .integer(let integer) = value, let exact = T(exactly: integer) else {
            throw mismatch(key, "an integer that fits \(type)", value)
        }
        return exact
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
        -> KeyedDecodingContainer<NestedKey>
    {
        throw ShoalError(code: .invalidArgument, message: "column \(key.stringValue) holds no nested value")
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        throw ShoalError(code: .invalidArgument, message: "column \(key.stringValue) holds no list")
    }

    func superDecoder() throws -> any Decoder {
        throw ShoalError(code: .invalidArgument, message: "a row has no super value")
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        throw ShoalError(code: .invalidArgument, message: "column \(key.stringValue) holds no nested value")
    }
}
