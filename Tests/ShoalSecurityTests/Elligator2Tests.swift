import ShoalTestSupport
import Testing
@testable import ShoalSecurity

/// (u, Q.x, Q.y) of RFC 9380's curve25519 suites, as big-endian integers:
/// Q = map_to_curve(u). Taken from the hash-to-curve reference
/// implementation's vector files curve25519_XMD:SHA-512_ELL2_NU_.json and
/// curve25519_XMD:SHA-512_ELL2_RO_.json (u[0] → Q0, u[1] → Q1); the DST used
/// to produce u does not matter for map_to_curve itself.
private let rfc9380Vectors: [(u: String, x: String, y: String)] = [
    // ELL2_NU_
    ("0x65d61dfa58cf932cd60f65f24739d1afe89442e4a3b2e6ea9d65b0865f148901",
     "0x1241e151a4da26769778a6c8aa5a219ff608c6c31bea49a0558487a102bf6355",
     "0x4bf3ec4f91865513d898097fdce2990b6ea8fc5a50de2d9950c50b97fc374c79"),
    ("0x1393600fd74775f0d19a8ebd282b05349641a8b079c71030bf1bf370c41acef9",
     "0x25c758d9c7a11a43e72d3ddd7976458330fa9e37f63991457fac99a70253cfba",
     "0x55108cb5971fb8c68e2bd2d869ea52495e8056075857c8656cb5803a1c42ee89"),
    ("0x3e2240ce35b52e6ce7f2cc4c3e57c03bc1619494256e495dadadb10dcc2675e8",
     "0x6c70b60bbea45867f1e270af0812137ac64c8931370dae67a4130141f9bbacb1",
     "0x58e6b785c269fc21d1ba8be61c9c0595b1d5df7574815bba5f883c9af79f68be"),
    ("0x6719884a782571b55353a8f2946a3e42430f0c769ce85d1a47026d491452b773",
     "0x64aaf5ae99e65460ba87f7f3c6871a66c3c5d3e671b33fe723603c0eed7b9922",
     "0x2348578fee0d3c353a6efb0c20f02ee50f69cf50626f3558b99424d19bbace17"),
    // ELL2_RO_
    ("0x60dee63d38dba6095eeb95ea343132b6f33d84e809d92a64ba6f348554c94481",
     "0x2b15e08da01b40a96b46f51cdabf3aeeb75ea9bf223eeb217638d23f6d849a11",
     "0x1aa11a09488c7ee589a232d7b57c3836de0f0b389f2eaf39114e5c691ccf6ee5"),
    ("0x607e4b11d1b17bad8d482b7a4603486b403875740ed3a643fb948c95c967bb87",
     "0x2a263d203c2c54af0205dae921d2f8a24fe3e7aee9f6e401eb385b81412aa964",
     "0x5a8ea52fd22c0727ba4a52bd52ff51a6ab9bb70c666e79a1015e039b66654467"),
    ("0x7f346b4b77c04efce603d5443c80fae1dc5ac1fb78a859a0aad8090fba0841dc",
     "0x44b85219849bf492f790eac07b96b624edb5b266d13a351dae8d978dfb42ce94",
     "0x305d336eaccd259ee67f43861f06039a60bfe22b743cba05de722958a4a16064"),
    ("0x2741ea7cba3c843ce34e9b1a6cf4981c1be23e91ea3c6f60efcc71ba62aae6db",
     "0x79a8fc2c4401593e55b05e0f2655b6e07473fcec1c87dfc7c545a95b76f53b2a",
     "0x6834a80ed53e0e2ef8e7ddcc7aab4048975141aa205b26b4ded130a376957d01"),
    ("0x724d603fa092b3b2fb26acfc49b69214e8f6b23455e5ad1288eea682acb24c45",
     "0x7db3053a52e9e9c5d9f6d9d08500823907e5ef4fd7dffb242053f4d0ed40fbd9",
     "0x0b797789facc33a96479aefeb4e4f91698f43005aada9d71516df5ea34431881"),
    ("0x07d99c595eeefe4895921cf06f5fae756f41030ce804c739d712d895bd85ccc5",
     "0x48ed35ddea926f8b2a55bd20b18c3d22bf737767c7261d1ab3efe4123c4cb7a9",
     "0x0099c457a4a9c6ab32d5a89a1f35f6e54d684e58a74fe62442a39c2934425955"),
    ("0x6cebac5b14cec271dea87b00822ce9f4712faa39895826edf9e7d1052fdc6a59",
     "0x7c31abd1045caba48ea77fbd078bfa4c20ffab70f90a2738ba8ec888dc5bc01b",
     "0x528ed08cbd11986252131d2ac4d3700dbecac75bc4cb66282dafcc37a947c7ed"),
    ("0x62404e1b9f98555fb42732d16052fa5cfc00a86dd5d5d0a0bed0a256475dcfc9",
     "0x2df9dcf04cba473f70794b46a24cc3331b16699e121667171d13ab4251a1737e",
     "0x06c4ba3124d13c9f69752387a55977acb5ef410bdf475f8868eb6f1f9a15e527"),
]

@Suite("Elligator2")
struct Elligator2Tests {
    @Test("reproduces RFC 9380 map_to_curve outputs for curve25519")
    func rfc9380() throws {
        for vector in rfc9380Vectors {
            let u = try #require(Field25519(littleEndianBytes: littleEndianFromBigEndianHex(vector.u)))
            let x = Elligator2.mapToCurve(u)
            #expect(x.canonicalBytes == littleEndianFromBigEndianHex(vector.x), "u = \(vector.u)")
            // The vector's point satisfies y² = x³ + A·x² + x.
            let y = try #require(Field25519(littleEndianBytes: littleEndianFromBigEndianHex(vector.y)))
            #expect(y.squared() == x * (x * (x + Elligator2.curveA) + .one))
        }
    }

    @Test("matches the draft's formula evaluated with Python big integers")
    func pythonReference() throws {
        for (r, u) in ReferenceVectors.elligatorVectors {
            #expect(Elligator2.mapToCurve(representative: hex(r)).map(hexString) == u, "r = \(r)")
        }
    }

    @Test("outputs lie on the curve for many inputs; bit 255 and the sign of r are ignored")
    func onCurve() throws {
        var rng = SplitMix(state: 10)
        for _ in 0..<200 {
            var bytes = rng.bytes(32)
            let u = try #require(Elligator2.mapToCurve(representative: bytes))
            let uElement = try #require(Field25519(littleEndianBytes: u))
            #expect(Elligator2.isOnCurve(uElement))
            #expect(u[31] & 0x80 == 0)

            bytes[31] ^= 0x80
            #expect(Elligator2.mapToCurve(representative: bytes) == u)

            let r = try #require(Field25519(littleEndianBytes: bytes))
            #expect(Elligator2.mapToCurve(-r) == uElement)
        }
        #expect(Elligator2.mapToCurve(representative: [UInt8](repeating: 1, count: 31)) == nil)
    }

    @Test("the curve test rejects twist points")
    func twist() {
        var onCurve = 0, onTwist = 0
        for value in UInt64(2)..<UInt64(60) {
            if Elligator2.isOnCurve(Field25519(value)) { onCurve += 1 } else { onTwist += 1 }
        }
        // Roughly half the u-coordinates belong to each of the curve and its twist.
        #expect(onCurve > 10 && onTwist > 10)
        // u = 9 is the Curve25519 base point.
        #expect(Elligator2.isOnCurve(Field25519(9)))
    }
}
