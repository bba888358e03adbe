import ShoalTestSupport
import Crypto
import Testing
@testable import ShoalSecurity

/// Test vectors of draft-irtf-cfrg-cpace (draft 21, appendix A and B.1:
/// CPace with G_X25519 and SHA-512).
private enum DraftVectors {
    static let password = Array("Password".utf8)
    static let channelID = hex("0b415f696e69746961746f720b425f726573706f6e646572")
    static let sessionID = hex("7e4b4791d6a8ef019b936c79fb7f2c57")
    static let generatorString = hex("""
        0843506163653235350850617373776f72646d000000000000000000
        00000000000000000000000000000000000000000000000000000000
        00000000000000000000000000000000000000000000000000000000
        00000000000000000000000000000000000000000000000000000000
        00000000000000000000000000000000180b415f696e69746961746f
        720b425f726573706f6e646572107e4b4791d6a8ef019b936c79fb7f
        2c57
        """)
    static let generatorHash = hex("03998087bdb1a2617bbe25ef5a7c18cd4f84f902328701790958755ee4aed1d3")
    static let generator = hex("d04bf6d41f6a289632a2e929fa29bebd51092512a7829fdde7d314b62f05a73f")
    static let associatedDataA = Array("ADa".utf8)
    static let associatedDataB = Array("ADb".utf8)
    static let scalarA = hex("21b4f4bd9e64ed355c3eb676a28ebedaf6d8f17bdc365995b319097153044080")
    static let scalarB = hex("848b0779ff415f0af4ea14df9dd1d3c29ac41d836c7808896c4eba19c51ac40a")
    static let shareA = hex("1d13c89278cdadd826f6d8d7f887701430f8380ddc17611cdd6dc989ce0c9f32")
    static let shareB = hex("248cccf6d5cdc3646f0ad593f9e6cef4e69d4945f8372e623512ecea32185623")
    static let sharedPoint = hex("5b067effbdc0b2a0e1d907b21ebb25cfedb96a852179a847c37e43ee71322c6b")
    static let transcriptIR = hex("""
        201d13c89278cdadd826f6d8d7f887701430f8380ddc17611cdd6dc9
        89ce0c9f320341446120248cccf6d5cdc3646f0ad593f9e6cef4e69d
        4945f8372e623512ecea3218562303414462
        """)
    static let iskIR = hex("""
        6e19b875f7a561d6b3ca3dbb9ef42ac55de3e717881018204b8922b4
        d5e53bb2aa82c300bea7b65d2b671da71922ddf6472301b79bc270ad
        fa8bf413285f2263
        """)

    /// B.1.10: scalar_mult_vfy(s, uX) must give qX.
    static let lowOrderScalar = hex("af46e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449aff")
    static let lowOrderCases: [(u: String, q: String)] = [
        ("0000000000000000000000000000000000000000000000000000000000000000", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("0100000000000000000000000000000000000000000000000000000000000000", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("daffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", "d8e2c776bbacd510d09fd9278b7edcd25fc5ae9adfba3b6e040e8d3b71b21806"),
        ("eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", "0000000000000000000000000000000000000000000000000000000000000000"),
        ("dbffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", "c85c655ebe8be44ba9c0ffde69f2fe10194458d137f09bbff725ce58803cdb38"),
        ("d9ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", "db64dafa9b8fdd136914e61461935fe92aa372cb056314e1231bc4ec12417456"),
        ("cdeb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b880", "e062dcd5376d58297be2618c7498f55baa07d7e03184e8aada20bca28888bf7a"),
        ("4c9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f11d7", "993c6ad11c4c29da9a56f7691fd0ff8d732e49de6250b6c2e80003ff4629a175"),
    ]
    /// u0, u1, u2, u3, u4, u5 and u7 must make a party abort.
    static let abortingShares = [0, 1, 2, 3, 4, 5, 7].map { hex(lowOrderCases[$0].u) }
}

private func bytes(of key: SymmetricKey) -> [UInt8] {
    key.withUnsafeBytes { Array($0) }
}

/// Runs the three-message exchange; returns both confirmations and whether
/// each side accepted the other's tag.
private func run(
    initiatorPassword: [UInt8], responderPassword: [UInt8],
    initiatorSID: [UInt8] = Array("sid".utf8), responderSID: [UInt8] = Array("sid".utf8),
    initiatorCI: [UInt8] = Array("joiner|member".utf8), responderCI: [UInt8] = Array("joiner|member".utf8)
) throws -> (initiator: CPace.Confirmation, responder: CPace.Confirmation, initiatorAccepts: Bool, responderAccepts: Bool) {
    var initiator = try CPace(
        role: .initiator, password: initiatorPassword, sessionID: initiatorSID, channelID: initiatorCI)
    var responder = try CPace(
        role: .responder, password: responderPassword, sessionID: responderSID, channelID: responderCI)
    let responderConfirmation = try responder.receive(peerShare: initiator.share)
    let initiatorConfirmation = try initiator.receive(peerShare: responder.share)
    let initiatorAccepts = initiatorConfirmation.verify(peerTag: responderConfirmation.ownTag)
    let responderAccepts = responderConfirmation.verify(peerTag: initiatorConfirmation.ownTag)
    return (initiatorConfirmation, responderConfirmation, initiatorAccepts, responderAccepts)
}

@Suite("CPace draft test vectors")
struct CPaceVectorTests {
    @Test("prepend_len and lv_cat (appendix A.1)")
    func stringUtilities() {
        #expect(CPace.prependLength([]) == [0x00])
        #expect(CPace.prependLength(Array("1234".utf8)) == hex("0431323334"))
        let range127 = (0..<127).map(UInt8.init)
        #expect(CPace.prependLength(range127) == [0x7F] + range127)
        let range128 = (0..<128).map(UInt8.init)
        #expect(CPace.prependLength(range128) == [0x80, 0x01] + range128)
        #expect(CPace.prependLength([UInt8](repeating: 7, count: 300)).prefix(2) == [0xAC, 0x02])
        let fields = ["1234", "5", "", "678"].map { Array($0.utf8) }
        #expect(CPace.lengthValueConcatenation(fields) == hex("043132333401350003363738"))
    }

    @Test("transcript_ir (appendix A.3.5)")
    func transcript() {
        let t1 = CPace.lengthValueConcatenation([Array("123".utf8), Array("PartyA".utf8)])
            + CPace.lengthValueConcatenation([Array("234".utf8), Array("PartyB".utf8)])
        #expect(t1 == hex("03313233065061727479410332333406506172747942"))
    }

    @Test("calculate_generator (B.1.1)")
    func generator() {
        let string = CPace.generatorString(
            password: DraftVectors.password, channelID: DraftVectors.channelID, sessionID: DraftVectors.sessionID)
        #expect(string == DraftVectors.generatorString)
        #expect(Array(SHA512.hash(data: string).prefix(32)) == DraftVectors.generatorHash)
        let g = CPace.generator(
            password: DraftVectors.password, channelID: DraftVectors.channelID, sessionID: DraftVectors.sessionID)
        #expect(g == DraftVectors.generator)
    }

    @Test("shares, K and ISK (B.1.2 – B.1.5)")
    func fullRun() throws {
        var a = try CPace(
            role: .initiator, password: DraftVectors.password, sessionID: DraftVectors.sessionID,
            channelID: DraftVectors.channelID, associatedData: DraftVectors.associatedDataA,
            scalar: SymmetricKey(data: DraftVectors.scalarA))
        var b = try CPace(
            role: .responder, password: DraftVectors.password, sessionID: DraftVectors.sessionID,
            channelID: DraftVectors.channelID, associatedData: DraftVectors.associatedDataB,
            scalar: SymmetricKey(data: DraftVectors.scalarB))
        #expect(a.share == DraftVectors.shareA)
        #expect(b.share == DraftVectors.shareB)

        #expect(try CPace.x25519(scalar: SymmetricKey(data: DraftVectors.scalarA), uCoordinate: DraftVectors.shareB)
            == DraftVectors.sharedPoint)
        #expect(try CPace.x25519(scalar: SymmetricKey(data: DraftVectors.scalarB), uCoordinate: DraftVectors.shareA)
            == DraftVectors.sharedPoint)

        let ca = try a.receive(peerShare: b.share, peerAssociatedData: DraftVectors.associatedDataB)
        let cb = try b.receive(peerShare: a.share, peerAssociatedData: DraftVectors.associatedDataA)
        #expect(bytes(of: ca.intermediateSessionKey) == DraftVectors.iskIR)
        #expect(bytes(of: cb.intermediateSessionKey) == DraftVectors.iskIR)

        // Key confirmation per the draft's section 10.4, recomputed by hand.
        let macKey = SymmetricKey(data: SHA512.hash(data: Array("CPaceMac".utf8) + DraftVectors.sessionID + DraftVectors.iskIR))
        let expectedTagA = HMAC<SHA512>.authenticationCode(
            for: CPace.lengthValueConcatenation([DraftVectors.shareA, DraftVectors.associatedDataA]), using: macKey)
        #expect(ca.ownTag == Array(expectedTagA))
        #expect(ca.verify(peerTag: cb.ownTag))
        #expect(cb.verify(peerTag: ca.ownTag))
        #expect(bytes(of: ca.sessionKey) == bytes(of: cb.sessionKey))
        let expectedSessionKey = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: DraftVectors.iskIR),
            info: Array("shoal/cpace/session-key".utf8), outputByteCount: 32)
        #expect(bytes(of: ca.sessionKey) == bytes(of: expectedSessionKey))
    }

    @Test("scalar_mult_vfy on low-order and non-canonical points (B.1.10)")
    func lowOrderPoints() throws {
        let scalar = SymmetricKey(data: DraftVectors.lowOrderScalar)
        for (u, q) in DraftVectors.lowOrderCases {
            let result = try CPace.x25519(scalar: scalar, uCoordinate: hex(u))
            let expected = hex(q)
            if expected.allSatisfy({ $0 == 0 }) {
                #expect(result == nil, "u = \(u)")
            } else {
                #expect(result == expected, "u = \(u)")
            }
        }
    }
}

@Suite("CPace protocol")
struct CPaceProtocolTests {
    @Test("same password: same ISK and session key, both tags accepted")
    func samePassword() throws {
        let outcome = try run(initiatorPassword: Array("K3M9Q2P7".utf8), responderPassword: Array("K3M9Q2P7".utf8))
        #expect(outcome.initiatorAccepts)
        #expect(outcome.responderAccepts)
        #expect(bytes(of: outcome.initiator.intermediateSessionKey) == bytes(of: outcome.responder.intermediateSessionKey))
        #expect(bytes(of: outcome.initiator.sessionKey) == bytes(of: outcome.responder.sessionKey))
        #expect(bytes(of: outcome.initiator.sessionKey).count == 32)
        #expect(outcome.initiator.ownTag.count == CPace.tagLength)
        #expect(outcome.initiator.ownTag != outcome.responder.ownTag)
    }

    @Test("different password: both tags rejected, keys differ")
    func differentPassword() throws {
        let outcome = try run(initiatorPassword: Array("K3M9Q2P7".utf8), responderPassword: Array("K3M9Q2P8".utf8))
        #expect(!outcome.initiatorAccepts)
        #expect(!outcome.responderAccepts)
        #expect(bytes(of: outcome.initiator.sessionKey) != bytes(of: outcome.responder.sessionKey))
    }

    @Test("different session id or channel id: both tags rejected")
    func differentContext() throws {
        let password = Array("K3M9Q2P7".utf8)
        let sid = try run(
            initiatorPassword: password, responderPassword: password,
            initiatorSID: Array("sid-1".utf8), responderSID: Array("sid-2".utf8))
        #expect(!sid.initiatorAccepts && !sid.responderAccepts)
        let channel = try run(
            initiatorPassword: password, responderPassword: password,
            initiatorCI: Array("joiner|member".utf8), responderCI: Array("member|joiner".utf8))
        #expect(!channel.initiatorAccepts && !channel.responderAccepts)
    }

    @Test("both parties claiming the same role: tags rejected")
    func sameRole() throws {
        let password = Array("K3M9Q2P7".utf8)
        var a = try CPace(role: .initiator, password: password, sessionID: [1], channelID: [2])
        var b = try CPace(role: .initiator, password: password, sessionID: [1], channelID: [2])
        let ca = try a.receive(peerShare: b.share)
        let cb = try b.receive(peerShare: a.share)
        #expect(!ca.verify(peerTag: cb.ownTag))
        #expect(!cb.verify(peerTag: ca.ownTag))
    }

    @Test("tampered associated data or tags are rejected")
    func tampering() throws {
        let password = Array("K3M9Q2P7".utf8)
        var a = try CPace(role: .initiator, password: password, sessionID: [1], channelID: [2], associatedData: [0xAA])
        var b = try CPace(role: .responder, password: password, sessionID: [1], channelID: [2], associatedData: [0xBB])
        let ca = try a.receive(peerShare: b.share, peerAssociatedData: [0xBB])
        let cb = try b.receive(peerShare: a.share, peerAssociatedData: [0xAC])  // altered in transit
        #expect(!ca.verify(peerTag: cb.ownTag))
        #expect(!cb.verify(peerTag: ca.ownTag))

        var c = try CPace(role: .initiator, password: password, sessionID: [1], channelID: [2])
        var d = try CPace(role: .responder, password: password, sessionID: [1], channelID: [2])
        let cc = try c.receive(peerShare: d.share)
        let cd = try d.receive(peerShare: c.share)
        var flipped = cd.ownTag
        flipped[0] ^= 1
        #expect(!cc.verify(peerTag: flipped))
        #expect(!cc.verify(peerTag: Array(cd.ownTag.prefix(32))))
        #expect(!cc.verify(peerTag: []))
        #expect(!cc.verify(peerTag: cc.ownTag))  // own tag reflected back
        #expect(cc.verify(peerTag: cd.ownTag))
    }

    @Test("shares of the wrong length throw a typed error")
    func wrongLength() throws {
        for length in [0, 1, 31, 33, 64] {
            var party = try CPace(role: .responder, password: [1], sessionID: [2], channelID: [3])
            #expect(throws: CPaceError.invalidShareLength(length)) {
                try party.receive(peerShare: [UInt8](repeating: 9, count: length))
            }
        }
    }

    @Test("low-order shares (u = 0, 1, −1, order-8 points, non-canonical forms) throw invalidShare", arguments: 0..<7)
    func lowOrderShares(index: Int) throws {
        let share = DraftVectors.abortingShares[index]
        var responder = try CPace(role: .responder, password: [1], sessionID: [2], channelID: [3])
        #expect(throws: CPaceError.invalidShare) { try responder.receive(peerShare: share) }
        var initiator = try CPace(role: .initiator, password: [1], sessionID: [2], channelID: [3])
        #expect(throws: CPaceError.invalidShare) { try initiator.receive(peerShare: share) }
    }

    @Test("every order-8 point with bit 255 set or clear is rejected")
    func lowOrderWithTopBit() throws {
        for share in DraftVectors.abortingShares {
            var flipped = share
            flipped[31] ^= 0x80
            var party = try CPace(role: .responder, password: [1], sessionID: [2], channelID: [3])
            #expect(throws: CPaceError.invalidShare) { try party.receive(peerShare: flipped) }
        }
    }

    @Test("a reflected share, a second receive and a receive after failure are refused")
    func misuse() throws {
        var party = try CPace(role: .initiator, password: [1], sessionID: [2], channelID: [3])
        #expect(throws: CPaceError.reflectedShare) { try party.receive(peerShare: party.share) }
        #expect(throws: CPaceError.alreadyCompleted) { try party.receive(peerShare: DraftVectors.shareB) }

        var other = try CPace(role: .initiator, password: [1], sessionID: [2], channelID: [3])
        _ = try other.receive(peerShare: DraftVectors.shareB)
        #expect(throws: CPaceError.alreadyCompleted) { try other.receive(peerShare: DraftVectors.shareB) }
    }

    @Test("random garbage shares never crash")
    func garbage() throws {
        var rng = SplitMix(state: 20)
        for _ in 0..<100 {
            var party = try CPace(role: .responder, password: [1], sessionID: [2], channelID: [3])
            let length = Int.random(in: 0...40, using: &rng)
            do {
                let confirmation = try party.receive(peerShare: rng.bytes(length))
                #expect(length == 32)
                #expect(!confirmation.verify(peerTag: rng.bytes(64)))
            } catch {
                #expect(error == .invalidShareLength(length) || error == .invalidShare)
            }
        }
    }

    @Test("shares are fresh every run and never reveal the generator")
    func freshShares() throws {
        let password = Array("K3M9Q2P7".utf8), sid = Array("sid".utf8), channel = Array("ci".utf8)
        let g = CPace.generator(password: password, channelID: channel, sessionID: sid)
        var seen = Set<[UInt8]>()
        for _ in 0..<50 {
            let initiator = try CPace(role: .initiator, password: password, sessionID: sid, channelID: channel)
            let responder = try CPace(role: .responder, password: password, sessionID: sid, channelID: channel)
            #expect(initiator.share.count == CPace.shareLength)
            #expect(seen.insert(initiator.share).inserted)
            #expect(seen.insert(responder.share).inserted)
            // A passive observer sees both shares; g appears in neither.
            let transcript = initiator.share + responder.share
            #expect(initiator.share != g && responder.share != g)
            let windows = (0...(transcript.count - g.count)).map { Array(transcript[$0..<($0 + g.count)]) }
            #expect(!windows.contains(g))
        }
        // Different passwords give different generators.
        #expect(CPace.generator(password: Array("K3M9Q2P8".utf8), channelID: channel, sessionID: sid) != g)
    }

    @Test("an empty password, sid and channel still work; long ones too")
    func unusualInputs() throws {
        let empty = try run(initiatorPassword: [], responderPassword: [], initiatorSID: [], responderSID: [],
                            initiatorCI: [], responderCI: [])
        #expect(empty.initiatorAccepts && empty.responderAccepts)
        let long = [UInt8](repeating: 0x41, count: 300)  // beyond one SHA-512 block: no zero padding
        let outcome = try run(initiatorPassword: long, responderPassword: long, initiatorSID: long, responderSID: long)
        #expect(outcome.initiatorAccepts && outcome.responderAccepts)
        #expect(CPace.generatorString(password: long, channelID: [], sessionID: []).count == 9 + 302 + 1 + 1 + 1)
    }

    @Test("session key seals a cluster secret that the peer can open")
    func sealing() throws {
        let code = InviteCode.generate()
        let outcome = try run(initiatorPassword: code.secret, responderPassword: code.secret)
        #expect(outcome.initiatorAccepts && outcome.responderAccepts)
        let clusterSecret = Array("the cluster secret".utf8)
        let sealed = try ChaChaPoly.seal(clusterSecret, using: outcome.responder.sessionKey)
        let opened = try ChaChaPoly.open(sealed, using: outcome.initiator.sessionKey)
        #expect(Array(opened) == clusterSecret)
    }
}
