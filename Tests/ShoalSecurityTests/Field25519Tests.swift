import ShoalTestSupport
import Testing
@testable import ShoalSecurity

/// A deliberately naive reference for GF(2^255 − 19) on eight 32-bit limbs:
/// only addition with a conditional subtraction of p, and multiplication by
/// double-and-add. It shares no code or technique with `Field25519`'s
/// multiplication and reduction.
private struct SlowField: Equatable {
    var limbs: [UInt32]  // little-endian, always canonical (< p)

    static let p: [UInt32] = [
        0xFFFF_FFED, 0xFFFF_FFFF, 0xFFFF_FFFF, 0xFFFF_FFFF,
        0xFFFF_FFFF, 0xFFFF_FFFF, 0xFFFF_FFFF, 0x7FFF_FFFF,
    ]

    init(canonicalBytes bytes: [UInt8]) {
        limbs = (0..<8).map { i in
            (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[4 * i + $1]) << UInt32(8 * $1) }
        }
    }

    /// Reduces any 256-bit little-endian value modulo p, bit by bit.
    init(anyBytes bytes: [UInt8]) {
        let one = SlowField(canonicalBytes: [1] + [UInt8](repeating: 0, count: 31))
        var result = SlowField(canonicalBytes: [UInt8](repeating: 0, count: 32))
        for bit in stride(from: 255, through: 0, by: -1) {
            result = result + result
            if (bytes[bit / 8] >> UInt8(bit % 8)) & 1 == 1 {
                result = result + one
            }
        }
        self = result
    }

    static prefix func - (a: SlowField) -> SlowField {
        if a.limbs.allSatisfy({ $0 == 0 }) { return a }
        var result = a
        var borrow: Int64 = 0
        for i in 0..<8 {
            let d = Int64(p[i]) - Int64(a.limbs[i]) - borrow
            result.limbs[i] = UInt32(truncatingIfNeeded: d)
            borrow = d < 0 ? 1 : 0
        }
        return result
    }

    var bytes: [UInt8] {
        (0..<32).map { UInt8(truncatingIfNeeded: limbs[$0 / 4] >> UInt32(8 * ($0 % 4))) }
    }

    static func isAtLeastP(_ x: [UInt32]) -> Bool {
        for i in stride(from: 7, through: 0, by: -1) where x[i] != p[i] {
            return x[i] > p[i]
        }
        return true
    }

    static func + (a: SlowField, b: SlowField) -> SlowField {
        // Both < p < 2^255, so the sum fits in 256 bits.
        var sum = [UInt32](repeating: 0, count: 8)
        var carry: UInt64 = 0
        for i in 0..<8 {
            let s = UInt64(a.limbs[i]) + UInt64(b.limbs[i]) + carry
            sum[i] = UInt32(truncatingIfNeeded: s)
            carry = s >> 32
        }
        if isAtLeastP(sum) {
            var borrow: Int64 = 0
            for i in 0..<8 {
                let d = Int64(sum[i]) - Int64(p[i]) - borrow
                sum[i] = UInt32(truncatingIfNeeded: d)
                borrow = d < 0 ? 1 : 0
            }
        }
        var result = a
        result.limbs = sum
        return result
    }

    static func * (a: SlowField, b: SlowField) -> SlowField {
        var result = SlowField(canonicalBytes: [UInt8](repeating: 0, count: 32))
        for bit in stride(from: 254, through: 0, by: -1) {
            result = result + result
            if (b.limbs[bit / 32] >> UInt32(bit % 32)) & 1 == 1 {
                result = result + a
            }
        }
        return result
    }
}

private func element(_ hexText: String) -> Field25519 {
    guard let value = Field25519(littleEndianBytes: hex(hexText)) else {
        preconditionFailure("bad test vector")
    }
    return value
}

private func randomElement(_ rng: inout SplitMix) -> Field25519 {
    // Raw limbs up to 2^256 − 1: exercises non-reduced representations too.
    Field25519(limbs: SIMD4(rng.next(), rng.next(), rng.next(), rng.next()))
}

@Suite("Field25519")
struct Field25519Tests {
    @Test("matches Python big-integer results for +, −, ×, inverse, Legendre")
    func referenceVectors() {
        for (a, b, sum, difference, product, inverse, legendre) in ReferenceVectors.fieldVectors {
            let x = element(a), y = element(b)
            #expect(hexString((x + y).canonicalBytes) == sum, "\(a) + \(b)")
            #expect(hexString((x - y).canonicalBytes) == difference, "\(a) - \(b)")
            #expect(hexString((x * y).canonicalBytes) == product, "\(a) * \(b)")
            #expect(hexString(x.inverse().canonicalBytes) == inverse, "1 / \(a)")
            #expect(x.legendreSymbol() == legendre, "legendre(\(a))")
            #expect(x.isSquare == (legendre != -1))
        }
    }

    @Test("multiplication agrees with a slow double-and-add reference")
    func slowReference() {
        var rng = SplitMix(state: 1)
        for _ in 0..<300 {
            let a = randomElement(&rng), b = randomElement(&rng)
            let slow = SlowField(canonicalBytes: a.canonicalBytes) * SlowField(canonicalBytes: b.canonicalBytes)
            #expect((a * b).canonicalBytes == slow.bytes)
            let slowSum = SlowField(canonicalBytes: a.canonicalBytes) + SlowField(canonicalBytes: b.canonicalBytes)
            #expect((a + b).canonicalBytes == slowSum.bytes)
        }
    }

    @Test("unreduced limbs near 2^255 and 2^256 (all carry and borrow paths) match the reference")
    func edgeLimbs() {
        let max = UInt64.max
        let specials: [SIMD4<UInt64>] = [
            SIMD4(0, 0, 0, 0), SIMD4(1, 0, 0, 0), SIMD4(37, 0, 0, 0), SIMD4(38, 0, 0, 0),
            Field25519.modulusLimbs &- SIMD4(1, 0, 0, 0), Field25519.modulusLimbs,
            Field25519.modulusLimbs &+ SIMD4(1, 0, 0, 0), SIMD4(max, max, max, 0x7FFF_FFFF_FFFF_FFFF),
            SIMD4(0, 0, 0, 1 << 63), SIMD4(max - 37, max, max, max), SIMD4(max - 18, max, max, max),
            SIMD4(max, max, max, max), SIMD4(0, max, 0, max), SIMD4(max, 0, max, 0),
            SIMD4(0xFFFF_FFFF_FFFF_FFDA, max, max, max), SIMD4(max, max, max, 0x8000_0000_0000_0000),
        ]
        func rawBytes(_ limbs: SIMD4<UInt64>) -> [UInt8] {
            (0..<32).map { UInt8(truncatingIfNeeded: limbs[$0 / 8] >> UInt64(8 * ($0 % 8))) }
        }
        for a in specials {
            let slowA = SlowField(anyBytes: rawBytes(a))
            #expect(Field25519(limbs: a).canonicalBytes == slowA.bytes, "reduce \(a)")
            for b in specials {
                let x = Field25519(limbs: a), y = Field25519(limbs: b)
                let slowB = SlowField(anyBytes: rawBytes(b))
                #expect((x + y).canonicalBytes == (slowA + slowB).bytes, "\(a) + \(b)")
                #expect((x - y).canonicalBytes == (slowA + -slowB).bytes, "\(a) - \(b)")
                #expect((x * y).canonicalBytes == (slowA * slowB).bytes, "\(a) * \(b)")
            }
        }
    }

    @Test("a · a⁻¹ = 1 for many random a; 0⁻¹ = 0")
    func inverses() {
        var rng = SplitMix(state: 2)
        for _ in 0..<200 {
            let a = randomElement(&rng)
            if a.isZero { continue }
            #expect(a * a.inverse() == .one)
        }
        #expect(Field25519.zero.inverse() == .zero)
        #expect(Field25519(limbs: Field25519.modulusLimbs).inverse() == .zero)
    }

    @Test("ring laws hold for random elements")
    func ringLaws() {
        var rng = SplitMix(state: 3)
        for _ in 0..<300 {
            let a = randomElement(&rng), b = randomElement(&rng), c = randomElement(&rng)
            #expect(a * (b + c) == a * b + a * c)
            #expect((a + b) * c == a * c + b * c)
            #expect(a * b == b * a)
            #expect(a + b == b + a)
            #expect((a * b) * c == a * (b * c))
            #expect((a + b) + c == a + (b + c))
            #expect((a + b) - b == a)
            #expect(a - a == .zero)
            #expect(-(-a) == a)
            #expect(a + (-a) == .zero)
            #expect(a.squared() == a * a)
            #expect(a * .one == a)
            #expect(a * .zero == .zero)
        }
    }

    @Test("Legendre symbol is multiplicative; squares are squares")
    func legendre() {
        var rng = SplitMix(state: 4)
        for _ in 0..<60 {
            let a = randomElement(&rng), b = randomElement(&rng)
            #expect((a * b).legendreSymbol() == a.legendreSymbol() * b.legendreSymbol())
            #expect(a.squared().isSquare)
            // 2 is a non-square mod p (p ≡ 5 mod 8), so 2a² never is, unless a = 0.
            if !a.isZero {
                #expect(!(Field25519(2) * a.squared()).isSquare)
            }
        }
        #expect(Field25519(2).legendreSymbol() == -1)
        #expect((-Field25519.one).legendreSymbol() == 1)  // p ≡ 1 mod 4
        #expect(Field25519.zero.legendreSymbol() == 0)
        #expect(Field25519.zero.isSquare)
    }

    @Test("sqrt(−1) = 2^((p−1)/4) squares to −1")
    func squareRootOfMinusOne() {
        let root = element("b0a00e4a271beec478e42fad0618432fa7d7fb3d99004d2b0bdfc14f8024832b")
        #expect(root.squared() == -Field25519.one)
    }

    @Test("decoding masks bit 255 and reduces; encoding is canonical")
    func encoding() {
        // p itself, p + 1 and 2^255 − 1 decode to 0, 1 and 18.
        #expect(element("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f") == .zero)
        #expect(element("eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f") == .one)
        #expect(element("ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f") == Field25519(18))
        // Bit 255 is ignored.
        #expect(element("01000000000000000000000000000000000000000000000000000000000000ff") == element(
            "010000000000000000000000000000000000000000000000000000000000007f"))
        #expect(element("0000000000000000000000000000000000000000000000000000000000000080") == .zero)
        // Wrong lengths are refused.
        #expect(Field25519(littleEndianBytes: [UInt8](repeating: 0, count: 31)) == nil)
        #expect(Field25519(littleEndianBytes: [UInt8](repeating: 0, count: 33)) == nil)
        // Unreduced limbs (up to 2^256 − 1) encode canonically: 2^256 − 1 ≡ 37.
        let allOnes = Field25519(limbs: SIMD4(repeating: .max))
        #expect(allOnes.canonicalBytes == Field25519(37).canonicalBytes)
        #expect(Field25519(limbs: Field25519.modulusLimbs).canonicalBytes == [UInt8](repeating: 0, count: 32))

        var rng = SplitMix(state: 5)
        for _ in 0..<200 {
            let a = randomElement(&rng)
            let encoded = a.canonicalBytes
            #expect(encoded[31] & 0x80 == 0)
            #expect(Field25519(littleEndianBytes: encoded)?.canonicalBytes == encoded)
            #expect(Field25519(littleEndianBytes: encoded) == a)
        }
    }

    @Test("select picks by condition")
    func select() {
        let a = Field25519(7), b = Field25519(9)
        #expect(Field25519.select(a, b, if: true) == b)
        #expect(Field25519.select(a, b, if: false) == a)
    }
}
