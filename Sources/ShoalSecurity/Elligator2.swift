// The Elligator 2 map onto Curve25519 (Montgomery form v^2 = u^3 + A·u^2 + u,
// A = 486662), as RFC 9380 section 6.7.1 defines `map_to_curve_elligator2`
// with J = A, K = 1 and the non-square Z = 2 (the curve25519 suites of
// RFC 9380 section 8.5, and draft-irtf-cfrg-cpace appendix A.5). Only the
// u-coordinate is produced; CPace never needs v.

/// Elligator 2 for Curve25519: maps any field element to the u-coordinate of
/// a point on the curve.
enum Elligator2 {
    /// The Montgomery curve coefficient A of Curve25519.
    static let curveA = Field25519(486_662)

    /// RFC 9380's non-square constant Z for curve25519.
    static let z = Field25519(2)

    /// Maps the field element `r` to the u-coordinate of a curve point.
    ///
    /// Steps of RFC 9380 §6.7.1 (J = A, K = 1):
    /// 1. x1 = −A · inv0(1 + Z·r²); if x1 = 0 then x1 = −A
    /// 2. gx1 = x1³ + A·x1² + x1
    /// 3. x2 = −x1 − A
    /// 4. u = x1 if gx1 is square, else x2
    ///
    /// For curve25519 step 1's exceptional case cannot actually occur
    /// (1 + 2r² = 0 has no solution, since −1/2 is not a square), but it is
    /// handled as specified. The result is the same as the draft's
    /// `elligator2(r)` in appendix A.5.
    static func mapToCurve(_ r: Field25519) -> Field25519 {
        let denominator = z * r.squared() + .one
        let candidate = -curveA * denominator.inverse()
        let x1 = Field25519.select(candidate, -curveA, if: candidate.isZero)
        let gx1 = x1 * (x1 * (x1 + curveA) + .one)
        let x2 = -x1 - curveA
        return Field25519.select(x2, x1, if: gx1.isSquare)
    }

    /// Decodes 32 bytes with RFC 7748's `decodeUCoordinate` (bit 255 ignored,
    /// value reduced modulo p), maps the result with ``mapToCurve(_:)`` and
    /// returns the canonical 32-byte little-endian u-coordinate.
    ///
    /// Returns `nil` unless `representative` holds exactly 32 bytes.
    static func mapToCurve(representative: some Collection<UInt8>) -> [UInt8]? {
        guard let r = Field25519(littleEndianBytes: representative) else { return nil }
        return mapToCurve(r).canonicalBytes
    }

    /// Whether `u` is the u-coordinate of a point on Curve25519 itself (as
    /// opposed to its quadratic twist): u³ + A·u² + u must be a square.
    static func isOnCurve(_ u: Field25519) -> Bool {
        (u * (u * (u + curveA) + .one)).isSquare
    }
}
