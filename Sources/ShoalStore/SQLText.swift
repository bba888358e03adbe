/// Just enough of SQLite's tokenizer to read the CHECK constraints of a `CREATE TABLE` statement.
enum SQLText {
    /// The expression of every `CHECK (...)` in `sql`, without its outer parentheses.
    static func checkExpressions(in sql: String) -> [String] {
        let tokens = tokenize(sql)
        var expressions: [String] = []
        var index = 0
        while index < tokens.count {
            defer { index += 1 }
            guard case .word(let word) = tokens[index].kind, word.uppercased() == "CHECK",
                index + 1 < tokens.count, tokens[index + 1].kind == .symbol("(")
            else { continue }
            var depth = 0
            var end = index + 1
            while end < tokens.count {
                if tokens[end].kind == .symbol("(") { depth += 1 }
                if tokens[end].kind == .symbol(")") {
                    depth -= 1
                    if depth == 0 { break }
                }
                end += 1
            }
            guard end < tokens.count else { break }
            let characters = Array(sql)
            let start = tokens[index + 1].range.upperBound
            let stop = tokens[end].range.lowerBound
            expressions.append(String(characters[start..<stop]).trimmingSpaces)
            index = end
        }
        return expressions
    }

    /// An expression with its runs of white space (and comments) made one space: the same constraint however it
    /// was laid out.
    static func normalized(_ expression: String) -> String {
        let characters = Array(expression)
        var parts: [String] = []
        for token in tokenize(expression) { parts.append(String(characters[token.range])) }
        return parts.joined(separator: " ")
    }

    /// The identifiers (bare or quoted) in an expression: what may name a column.
    static func identifiers(in expression: String) -> [String] {
        tokenize(expression).compactMap { token in
            switch token.kind {
            case .word(let word): word
            case .quotedIdentifier(let name): name
            default: nil
            }
        }
    }

    struct Token: Equatable {
        enum Kind: Equatable {
            case word(String)
            case quotedIdentifier(String)
            case string
            case symbol(Character)
        }

        var kind: Kind
        /// Character offsets in the text.
        var range: Range<Int>
    }

    static func tokenize(_ sql: String) -> [Token] {
        let characters = Array(sql)
        var tokens: [Token] = []
        var index = 0
        func isWord(_ character: Character) -> Bool {
            character.isLetter || character.isNumber || character == "_" || character == "$"
        }
        while index < characters.count {
            let character = characters[index]
            let start = index
            if character.isWhitespace {
                index += 1
            } else if character == "-", index + 1 < characters.count, characters[index + 1] == "-" {
                while index < characters.count, characters[index] != "\n" { index += 1 }
            } else if character == "/", index + 1 < characters.count, characters[index + 1] == "*" {
                index += 2
                while index + 1 < characters.count, !(characters[index] == "*" && characters[index + 1] == "/") {
                    index += 1
                }
                index = min(characters.count, index + 2)
            } else if character == "'" || character == "\"" || character == "`" || character == "[" {
                let close: Character = character == "[" ? "]" : character
                var text = ""
                index += 1
                while index < characters.count {
                    if characters[index] == close {
                        // A doubled quote stands for itself.
                        if close != "]", index + 1 < characters.count, characters[index + 1] == close {
                            text.append(close)
                            index += 2
                            continue
                        }
                        index += 1
                        break
                    }
                    text.append(characters[index])
                    index += 1
                }
                let kind: Token.Kind = character == "'" ? .string : .quotedIdentifier(text)
                tokens.append(Token(kind: kind, range: start..<index))
            } else if isWord(character) {
                while index < characters.count, isWord(characters[index]) { index += 1 }
                tokens.append(Token(kind: .word(String(characters[start..<index])), range: start..<index))
            } else {
                index += 1
                tokens.append(Token(kind: .symbol(character), range: start..<index))
            }
        }
        return tokens
    }
}

extension String {
    fileprivate var trimmingSpaces: String {
        var text = Substring(self)
        while text.first?.isWhitespace == true { text.removeFirst() }
        while text.last?.isWhitespace == true { text.removeLast() }
        return String(text)
    }
}
