// Arithmetic in the prime field GF(p), p = 2^255 - 19, the base field of
// Curve25519. Only what the Elligator 2 map needs is provided: it is not a
// general-purpose or high-performance field implementation.

/// An element of the prime field GF(2^255 - 19).
///
/// The value is held in four little-endian 64-bit limbs,
/// `limbs[0] + limbs[1]·2^64 + limbs[2]·2^128 + limbs[3]·2^192`.
/// Every operation keeps the value below 2^256 but not necessarily below p;
/// ``canonicalBytes`` and ``==`` fully reduce it first, so two elements that
/// are congruent modulo p always compare equal.
///
/// Reduction uses 2^256 ≡ 38 (mod p). Addition, subtraction, multiplication
/// and ``select(_:_:if:)`` run without branches on the values. ``pow(_:)``
/// branches on the bits of the exponent, which is always a public constant
/// here (p − 2 or (p − 1)/2).
struct Field25519: Sendable {
    /// Little-endian 64-bit limbs; see the type's documentation.
    var limbs: SIMD4<UInt64>

    /// The additive identity.
    static let zero = Field25519(0)
    /// The multiplicative identity.
    static let one = Field25519(1)

    /// The prime p = 2^255 − 19, as limbs (for documentation and tests).
    static let modulusLimbs = SIMD4<UInt64>(
        0xFFFF_FFFF_FFFF_FFED, 0xFFFF_FFFF_FFFF_FFFF,
        0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF)

    /// p − 2, the exponent that computes an inverse (Fermat).
    static let inverseExponent = SIMD4<UInt64>(
        0xFFFF_FFFF_FFFF_FFEB, 0xFFFF_FFFF_FFFF_FFFF,
        0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF)

    /// (p − 1) / 2 = 2^254 − 10, the exponent of the Legendre symbol (Euler).
    static let legendreExponent = SIMD4<UInt64>(
        0xFFFF_FFFF_FFFF_FFF6, 0xFFFF_FFFF_FFFF_FFFF,
        0xFFFF_FFFF_FFFF_FFFF, 0x3FFF_FFFF_FFFF_FFFF)

    /// Creates an element from raw limbs; any value below 2^256 is allowed.
    init(limbs: SIMD4<UInt64>) {
        self.limbs = limbs
    }

    /// Creates the element equal to a small integer.
    init(_ value: UInt64) {
        self.limbs = SIMD4(value, 0, 0, 0)
    }

    /// Decodes 32 little-endian bytes as RFC 7748's `decodeUCoordinate` does:
    /// bit 255 (the top bit of the last byte) is ignored and the remaining
    /// 255-bit integer is taken modulo p (values in [p, 2^255) are accepted).
    ///
    /// Returns `nil` unless `bytes` holds exactly 32 bytes.
    init?(littleEndianBytes bytes: some Collection<UInt8>) {
        guard bytes.count == 32 else { return nil }
        var limbs = SIMD4<UInt64>()
        for (index, byte) in bytes.enumerated() {
            limbs[index / 8] |= UInt64(byte) << UInt64(8 * (index % 8))
        }
        limbs[3] &= 0x7FFF_FFFF_FFFF_FFFF
        self.limbs = limbs
    }

    /// The canonical encoding: the fully reduced value (in [0, p)) as
    /// 32 little-endian bytes. Bit 255 is always clear.
    var canonicalBytes: [UInt8] {
        let reduced = canonicalLimbs
        var bytes = [UInt8](repeating: 0, count: 32)
        for index in 0..<32 {
            bytes[index] = UInt8(truncatingIfNeeded: reduced[index / 8] >> UInt64(8 * (index % 8)))
        }
        return bytes
    }

    /// The fully reduced value in [0, p), as limbs.
    var canonicalLimbs: SIMD4<UInt64> {
        // Step 1: fold bit 255 back in (2^255 ≡ 19). The result is < 2^255 + 19.
        var value = limbs
        let top = value[3] >> 63
        value[3] &= 0x7FFF_FFFF_FFFF_FFFF
        value = Self.addSmall(value, 19 &* top).sum
        // Step 2: value ≥ p exactly when value + 19 ≥ 2^255; then value − p is
        // value + 19 with bit 255 cleared.
        var plus19 = Self.addSmall(value, 19).sum
        let isAtLeastP = plus19[3] >> 63
        plus19[3] &= 0x7FFF_FFFF_FFFF_FFFF
        return Self.select(limbs: value, plus19, mask: 0 &- isAtLeastP)
    }

    /// Whether the element is zero (congruent to 0 modulo p).
    var isZero: Bool {
        let reduced = canonicalLimbs
        return (reduced[0] | reduced[1] | reduced[2] | reduced[3]) == 0
    }

    // MARK: - Ring operations

    /// Sum modulo p.
    static func + (lhs: Field25519, rhs: Field25519) -> Field25519 {
        var result = SIMD4<UInt64>()
        var carry: UInt64 = 0
        for index in 0..<4 {
            (result[index], carry) = addWithCarry(lhs.limbs[index], rhs.limbs[index], carry)
        }
        // result + carry·2^256 ≡ result + 38·carry. A second carry can only
        // occur if the result wrapped to a value below 38, so adding 38 to the
        // lowest limb once more cannot overflow.
        let first = addSmall(result, 38 &* carry)
        var reduced = first.sum
        reduced[0] &+= 38 &* first.carry
        return Field25519(limbs: reduced)
    }

    /// Difference modulo p.
    static func - (lhs: Field25519, rhs: Field25519) -> Field25519 {
        var result = SIMD4<UInt64>()
        var borrow: UInt64 = 0
        for index in 0..<4 {
            (result[index], borrow) = subtractWithBorrow(lhs.limbs[index], rhs.limbs[index], borrow)
        }
        // result − borrow·2^256 ≡ result − 38·borrow. A second borrow leaves the
        // lowest limb ≥ 2^64 − 38, so subtracting 38 once more cannot borrow.
        let first = subtractSmall(result, 38 &* borrow)
        var reduced = first.difference
        reduced[0] &-= 38 &* first.borrow
        return Field25519(limbs: reduced)
    }

    /// Additive inverse modulo p.
    static prefix func - (value: Field25519) -> Field25519 {
        .zero - value
    }

    /// Product modulo p.
    static func * (lhs: Field25519, rhs: Field25519) -> Field25519 {
        // Schoolbook 256 × 256 → 512-bit product in eight limbs.
        var wide = SIMD8<UInt64>()
        for i in 0..<4 {
            var carry: UInt64 = 0
            for j in 0..<4 {
                let (high, low) = lhs.limbs[i].multipliedFullWidth(by: rhs.limbs[j])
                let (sum1, overflow1) = low.addingReportingOverflow(wide[i + j])
                let (sum2, overflow2) = sum1.addingReportingOverflow(carry)
                wide[i + j] = sum2
                // high ≤ 2^64 − 2, so adding two carry bits cannot overflow.
                carry = high &+ (overflow1 ? 1 : 0) &+ (overflow2 ? 1 : 0)
            }
            wide[i + 4] = carry
        }
        return reduce(wide)
    }

    /// The square, `self * self`.
    func squared() -> Field25519 {
        self * self
    }

    /// `self` raised to a 255-bit exponent given as little-endian limbs.
    ///
    /// Square-and-multiply from the top bit. The running time depends on the
    /// exponent's bits (only ever a public constant here), not on `self`.
    func pow(_ exponent: SIMD4<UInt64>) -> Field25519 {
        var result = Field25519.one
        for bit in stride(from: 255, through: 0, by: -1) {
            result = result.squared()
            if (exponent[bit / 64] >> UInt64(bit % 64)) & 1 == 1 {
                result = result * self
            }
        }
        return result
    }

    /// The multiplicative inverse, computed as self^(p−2). Like RFC 9380's
    /// `inv0`, the inverse of zero is zero.
    func inverse() -> Field25519 {
        pow(Self.inverseExponent)
    }

    /// The Legendre symbol (self / p) as an integer: 1 for a non-zero square,
    /// −1 for a non-square and 0 for zero. Computed as self^((p−1)/2).
    func legendreSymbol() -> Int {
        let power = pow(Self.legendreExponent)
        if power == .one { return 1 }
        if power.isZero { return 0 }
        return -1
    }

    /// Whether the element is a square in GF(p). As in RFC 9380's
    /// `is_square`, zero counts as a square.
    var isSquare: Bool {
        // self^((p−1)/2) is 0, 1 or p−1; it is p−1 exactly for non-squares.
        let power = pow(Self.legendreExponent)
        return !(power == -Field25519.one)
    }

    /// Returns `whenTrue` if `condition` holds and `whenFalse` otherwise,
    /// choosing with a mask rather than a branch.
    static func select(_ whenFalse: Field25519, _ whenTrue: Field25519, if condition: Bool) -> Field25519 {
        let mask = 0 &- UInt64(condition ? 1 : 0)
        return Field25519(limbs: select(limbs: whenFalse.limbs, whenTrue.limbs, mask: mask))
    }

    // MARK: - Limb helpers

    /// Reduces a 512-bit value modulo p to a value below 2^256.
    private static func reduce(_ wide: SIMD8<UInt64>) -> Field25519 {
        // low + 2^256·high ≡ low + 38·high.
        var result = SIMD4<UInt64>()
        var carry: UInt64 = 0
        for index in 0..<4 {
            let (high, low) = wide[index + 4].multipliedFullWidth(by: 38)
            let (sum1, overflow1) = low.addingReportingOverflow(wide[index])
            let (sum2, overflow2) = sum1.addingReportingOverflow(carry)
            result[index] = sum2
            // high < 38, so the carry stays below 40.
            carry = high &+ (overflow1 ? 1 : 0) &+ (overflow2 ? 1 : 0)
        }
        // result + carry·2^256 ≡ result + 38·carry (< 1520). If that carries
        // again the result wrapped below 1520, so a final +38 cannot overflow.
        let folded = addSmall(result, 38 &* carry)
        var reduced = folded.sum
        reduced[0] &+= 38 &* folded.carry
        return Field25519(limbs: reduced)
    }

    /// a + b + carry → (sum, carry-out); carry-out is 0, 1 or 2.
    @inline(__always)
    private static func addWithCarry(_ a: UInt64, _ b: UInt64, _ carry: UInt64) -> (UInt64, UInt64) {
        let (sum1, overflow1) = a.addingReportingOverflow(b)
        let (sum2, overflow2) = sum1.addingReportingOverflow(carry)
        return (sum2, UInt64(overflow1 ? 1 : 0) &+ UInt64(overflow2 ? 1 : 0))
    }

    /// a − b − borrow → (difference, borrow-out).
    @inline(__always)
    private static func subtractWithBorrow(_ a: UInt64, _ b: UInt64, _ borrow: UInt64) -> (UInt64, UInt64) {
        let (difference1, underflow1) = a.subtractingReportingOverflow(b)
        let (difference2, underflow2) = difference1.subtractingReportingOverflow(borrow)
        return (difference2, UInt64(underflow1 ? 1 : 0) &+ UInt64(underflow2 ? 1 : 0))
    }

    /// Adds a single-limb value to a 256-bit value.
    private static func addSmall(_ value: SIMD4<UInt64>, _ small: UInt64) -> (sum: SIMD4<UInt64>, carry: UInt64) {
        var result = value
        var carry = small
        for index in 0..<4 {
            (result[index], carry) = addWithCarry(value[index], carry, 0)
        }
        return (result, carry)
    }

    /// Subtracts a single-limb value from a 256-bit value.
    private static func subtractSmall(_ value: SIMD4<UInt64>, _ small: UInt64) -> (difference: SIMD4<UInt64>, borrow: UInt64) {
        var result = value
        var borrow = small
        for index in 0..<4 {
            (result[index], borrow) = subtractWithBorrow(value[index], borrow, 0)
        }
        return (result, borrow)
    }

    /// Lane-wise `mask == 0 ? whenZero : whenOnes` for an all-zero or all-one mask.
    @inline(__always)
    private static func select(limbs whenZero: SIMD4<UInt64>, _ whenOnes: SIMD4<UInt64>, mask: UInt64) -> SIMD4<UInt64> {
        let wideMask = SIMD4<UInt64>(repeating: mask)
        return (whenZero & ~wideMask) | (whenOnes & wideMask)
    }
}

extension Field25519: Equatable {
    /// Equality of field elements: compares fully reduced values without
    /// branching on their limbs.
    static func == (lhs: Field25519, rhs: Field25519) -> Bool {
        let difference = lhs.canonicalLimbs ^ rhs.canonicalLimbs
        return (difference[0] | difference[1] | difference[2] | difference[3]) == 0
    }
}
