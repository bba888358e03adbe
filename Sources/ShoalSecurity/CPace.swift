import Crypto

// CPace, the balanced PAKE of draft-irtf-cfrg-cpace, cipher suite
// CPACE-X25519-SHA512 in the initiator-responder setting, plus the explicit
// key confirmation that the draft suggests in its section 10.4.
//
// What is computed (names as in the draft; lv_cat prefixes each field with
// its LEB128 length, see `CPace.lengthValueConcatenation`):
//
//   gen_str = lv_cat("CPace255", PRS, zero_bytes(len_zpad), CI, sid)
//             len_zpad = max(0, 128 − 1 − len(prepend_len(PRS)) − len(prepend_len("CPace255")))
//   g       = Elligator2(decodeUCoordinate(SHA-512(gen_str)[0..<32]))
//   Y       = X25519(y, g)                      y: 32 fresh random bytes
//   K       = X25519(y, Y_peer)                 abort if all-zero
//   ISK     = SHA-512(lv_cat("CPace255_ISK", sid, K) ‖ lv_cat(Ya, ADa) ‖ lv_cat(Yb, ADb))
//             (Ya, ADa from the initiator, Yb, ADb from the responder)
//   mac_key = SHA-512("CPaceMac" ‖ sid ‖ ISK)
//   Ta      = HMAC-SHA-512(mac_key, lv_cat(Ya, ADa))     initiator's tag
//   Tb      = HMAC-SHA-512(mac_key, lv_cat(Yb, ADb))     responder's tag
//   session = HKDF-SHA-256(ikm: ISK, salt: "", info: "shoal/cpace/session-key", 32 bytes)
//
// gen_str, g, Y, K and ISK reproduce the draft's test vectors (appendix B.1).

/// One party's side of a CPace run (draft-irtf-cfrg-cpace, X25519 with
/// SHA-512, initiator-responder setting) with explicit key confirmation.
///
/// Both parties start from the same low-entropy password, session identifier
/// and channel identifier. Each sends its ``share`` (and, optionally, its
/// ``associatedData``) to the other and calls ``receive(peerShare:peerAssociatedData:)``
/// with what it got. The resulting ``Confirmation`` carries a strong session
/// key and a tag: the two parties agree on the key if and only if they used
/// the same password, session identifier, channel identifier and saw the same
/// shares and associated data, and each learns whether that is the case by
/// checking the other's tag.
///
/// Intended flow for admitting a device (joiner = initiator, member = responder):
/// 1. joiner → member: joiner's share
/// 2. member → joiner: member's share, member's tag (``Confirmation/ownTag``)
/// 3. joiner verifies the member's tag, then → member: joiner's tag
/// 4. member verifies the joiner's tag
///
/// The responder holds both shares after message 1, so it can send its share
/// and its tag together; the whole exchange then takes three messages. Each
/// party gets exactly one password guess per run from the other.
///
/// A value is single-use: ``receive(peerShare:peerAssociatedData:)`` succeeds
/// at most once and forgets the secret scalar whether it succeeds or not.
/// Abort the exchange on any thrown error or failed tag, and never start a
/// new run with the same secret scalar.
///
/// `@unchecked Sendable`: the only non-`Sendable` stored property is
/// `SymmetricKey`, an immutable value type (swift-crypto 3.x simply does not
/// declare the conformance; later versions do).
public struct CPace: @unchecked Sendable {
    /// The role a party plays. The initiator's share comes first in the
    /// transcript, so the two parties must take different roles.
    public enum Role: Sendable, Hashable {
        /// The party that speaks first: for Shoal, the joining device.
        case initiator
        /// The party that answers: for Shoal, the existing cluster member.
        case responder
    }

    /// Length in bytes of a share (an X25519 u-coordinate).
    public static let shareLength = 32

    /// Length in bytes of a confirmation tag (HMAC-SHA-512).
    public static let tagLength = 64

    /// The domain separation identifier of the X25519 group, `G.DSI`.
    static let domainSeparator: [UInt8] = Array("CPace255".utf8)

    /// The domain separation identifier of the ISK hash, `G.DSI ‖ "_ISK"`.
    static let iskDomainSeparator: [UInt8] = Array("CPace255_ISK".utf8)

    /// The prefix of the MAC key hash, from the draft's section 10.4.
    static let macKeyPrefix: [UInt8] = Array("CPaceMac".utf8)

    /// The HKDF info of the session key derived from ISK.
    static let sessionKeyInfo: [UInt8] = Array("shoal/cpace/session-key".utf8)

    /// SHA-512's input block size, `H.s_in_bytes`, which sets the zero padding.
    static let hashBlockSize = 128

    /// This party's role.
    public let role: Role

    /// This party's public share Y = X25519(y, g): 32 bytes to send to the peer.
    public let share: [UInt8]

    /// This party's associated data (ADa or ADb in the draft): public bytes
    /// sent alongside the share and authenticated by the run. Empty unless
    /// given at initialization.
    public let associatedData: [UInt8]

    /// The session identifier, needed again for ISK and the MAC key.
    private let sessionID: [UInt8]

    /// The secret scalar y; `nil` once ``receive(peerShare:peerAssociatedData:)`` was called.
    private var scalar: SymmetricKey?

    /// Starts a CPace run with a fresh random scalar.
    ///
    /// - Parameters:
    ///   - role: This party's role; the peer must take the other one.
    ///   - password: The shared low-entropy secret (PRS), e.g. the secret part
    ///     of an ``InviteCode``.
    ///   - sessionID: A public value both parties know before the run (sid),
    ///     unique per run if possible; it is hashed into both the generator
    ///     and ISK.
    ///   - channelID: The channel identifier (CI), known to both parties and
    ///     never sent. Per the draft (section 10.1.1), when it holds both
    ///     parties' identities it should hold them in a fixed role order,
    ///     the initiator's first, so that the encoding binds them to roles.
    ///   - associatedData: Optional public data sent with the share (ADa/ADb).
    /// - Throws: ``CPaceError/invalidGenerator`` in the (probability ≈ 2^−250)
    ///   case that the inputs hash to a low-order generator.
    public init(
        role: Role,
        password: [UInt8],
        sessionID: [UInt8],
        channelID: [UInt8],
        associatedData: [UInt8] = []
    ) throws(CPaceError) {
        try self.init(
            role: role, password: password, sessionID: sessionID, channelID: channelID,
            associatedData: associatedData, scalar: SymmetricKey(size: .bits256))
    }

    /// Starts a CPace run with a given scalar; for test vectors only.
    init(
        role: Role,
        password: [UInt8],
        sessionID: [UInt8],
        channelID: [UInt8],
        associatedData: [UInt8],
        scalar: SymmetricKey
    ) throws(CPaceError) {
        let generator = Self.generator(password: password, channelID: channelID, sessionID: sessionID)
        guard let share = try Self.x25519(scalar: scalar, uCoordinate: generator) else {
            throw .invalidGenerator
        }
        self.role = role
        self.share = share
        self.associatedData = associatedData
        self.sessionID = sessionID
        self.scalar = scalar
    }

    /// Completes the run with the peer's message: checks the share, computes
    /// ISK, and derives the confirmation tags and the session key.
    ///
    /// This consumes the secret scalar: a second call throws
    /// ``CPaceError/alreadyCompleted``, and so does a call after a failed one.
    ///
    /// - Parameters:
    ///   - peerShare: The 32-byte share received from the peer.
    ///   - peerAssociatedData: The associated data received with it (empty if
    ///     the peer sends none).
    /// - Returns: The tags and session key; the session key must not be used
    ///   before the peer's tag was verified with ``Confirmation/verify(peerTag:)``.
    /// - Throws: ``CPaceError/invalidShareLength(_:)`` for a share that is not
    ///   32 bytes, ``CPaceError/reflectedShare`` if the peer sent back this
    ///   party's own share, ``CPaceError/invalidShare`` if the shared point is
    ///   the neutral element (a low-order point, on the curve or its twist),
    ///   ``CPaceError/alreadyCompleted`` if called twice.
    public mutating func receive(
        peerShare: [UInt8],
        peerAssociatedData: [UInt8] = []
    ) throws(CPaceError) -> Confirmation {
        guard let scalar else { throw .alreadyCompleted }
        self.scalar = nil

        guard peerShare.count == Self.shareLength else {
            throw .invalidShareLength(peerShare.count)
        }
        guard peerShare != share else { throw .reflectedShare }
        guard let sharedPoint = try Self.x25519(scalar: scalar, uCoordinate: peerShare) else {
            throw .invalidShare
        }

        let ownMessage = Self.lengthValueConcatenation([share, associatedData])
        let peerMessage = Self.lengthValueConcatenation([peerShare, peerAssociatedData])
        let transcript: [UInt8]
        switch role {
        case .initiator: transcript = ownMessage + peerMessage
        case .responder: transcript = peerMessage + ownMessage
        }

        let iskInput = Self.lengthValueConcatenation([Self.iskDomainSeparator, sessionID, sharedPoint]) + transcript
        let isk = SymmetricKey(data: SHA512.hash(data: iskInput))

        let macKey = isk.withUnsafeBytes { iskBytes in
            SymmetricKey(data: SHA512.hash(data: Self.macKeyPrefix + sessionID + Array(iskBytes)))
        }
        let ownTag = Array(HMAC<SHA512>.authenticationCode(for: ownMessage, using: macKey))
        let sessionKey = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: isk, info: Self.sessionKeyInfo, outputByteCount: 32)

        return Confirmation(
            ownTag: ownTag, sessionKey: sessionKey, intermediateSessionKey: isk,
            macKey: macKey, peerMessage: peerMessage)
    }

    // MARK: - Draft building blocks

    /// `prepend_len`: the length of `data` as unsigned LEB128, then `data`.
    static func prependLength(_ data: [UInt8]) -> [UInt8] {
        var encoded: [UInt8] = []
        var length = data.count
        repeat {
            let low = UInt8(length & 0x7F)
            length >>= 7
            encoded.append(length == 0 ? low : low | 0x80)
        } while length != 0
        return encoded + data
    }

    /// `lv_cat`: the concatenation of `prepend_len` of each field.
    static func lengthValueConcatenation(_ fields: [[UInt8]]) -> [UInt8] {
        fields.flatMap(prependLength)
    }

    /// `generator_string(G.DSI, PRS, CI, sid, H.s_in_bytes)` of the draft's
    /// section 8.1: DSI and password padded with zeros to fill the first
    /// SHA-512 block, then the channel identifier, then the session identifier.
    static func generatorString(password: [UInt8], channelID: [UInt8], sessionID: [UInt8]) -> [UInt8] {
        let paddingLength = max(
            0, hashBlockSize - 1 - prependLength(password).count - prependLength(domainSeparator).count)
        let padding = [UInt8](repeating: 0, count: paddingLength)
        return lengthValueConcatenation([domainSeparator, password, padding, channelID, sessionID])
    }

    /// `G_X25519.calculate_generator`: the first 32 bytes of SHA-512 of the
    /// generator string, decoded as a u-coordinate (bit 255 ignored) and
    /// mapped with Elligator 2. Returns the 32-byte u-coordinate of g.
    static func generator(password: [UInt8], channelID: [UInt8], sessionID: [UInt8]) -> [UInt8] {
        let input = generatorString(password: password, channelID: channelID, sessionID: sessionID)
        let digest = Array(SHA512.hash(data: input))
        let r = Field25519(littleEndianBytes: digest.prefix(32)) ?? .zero  // 64 ≥ 32 bytes: never nil
        return Elligator2.mapToCurve(r).canonicalBytes
    }

    /// `G_X25519.scalar_mult_vfy`: X25519(scalar, u) via swift-crypto, or
    /// `nil` if the result is the all-zero neutral element `G.I`, which
    /// happens exactly when u is a low-order point of the curve or its twist.
    ///
    /// swift-crypto clamps the scalar (clearing its low three bits removes
    /// any small-order component) and ignores bit 255 of u, as RFC 7748 asks.
    /// It does not itself reject the all-zero result, so this function does,
    /// without branching on the individual bytes.
    static func x25519(scalar: SymmetricKey, uCoordinate: [UInt8]) throws(CPaceError) -> [UInt8]? {
        let result: [UInt8]
        do {
            let privateKey = try scalar.withUnsafeBytes { bytes in
                try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: bytes)
            }
            let publicKey = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: uCoordinate)
            let shared = try privateKey.sharedSecretFromKeyAgreement(with: publicKey)
            result = shared.withUnsafeBytes { Array($0) }
        } catch {
            // Only reachable with inputs of the wrong size, which the callers
            // rule out; report it as a bad share rather than trapping.
            throw .invalidShare
        }
        let accumulated = result.reduce(UInt8(0)) { $0 | $1 }
        return accumulated == 0 ? nil : result
    }
}

extension CPace {
    /// The outcome of a CPace run before key confirmation: this party's tag to
    /// send, the means to check the peer's tag, and the session key.
    ///
    /// `@unchecked Sendable` for the same reason as ``CPace``.
    public struct Confirmation: @unchecked Sendable {
        /// This party's confirmation tag (64 bytes): HMAC-SHA-512 under the MAC
        /// key of the draft's section 10.4, over this party's share and
        /// associated data. Send it to the peer (the responder sends first).
        public let ownTag: [UInt8]

        /// A 32-byte key for the rest of the exchange (e.g. to seal the cluster
        /// secret with ChaChaPoly), derived from ISK with HKDF-SHA-256. Both
        /// parties get the same key exactly when the run succeeded; do not use it
        /// before ``verify(peerTag:)`` returned `true`.
        public let sessionKey: SymmetricKey

        /// ISK, the draft's intermediate session key (64 bytes); exposed to tests
        /// only, since the session key and tags are derived from it.
        let intermediateSessionKey: SymmetricKey

        /// mac_key = SHA-512("CPaceMac" ‖ sid ‖ ISK).
        private let macKey: SymmetricKey

        /// lv_cat(peer share, peer associated data): what the peer's tag covers.
        private let peerMessage: [UInt8]

        init(
            ownTag: [UInt8], sessionKey: SymmetricKey, intermediateSessionKey: SymmetricKey,
            macKey: SymmetricKey, peerMessage: [UInt8]
        ) {
            self.ownTag = ownTag
            self.sessionKey = sessionKey
            self.intermediateSessionKey = intermediateSessionKey
            self.macKey = macKey
            self.peerMessage = peerMessage
        }

        /// Checks the peer's confirmation tag in constant time. `false` (for any
        /// wrong value or length) means the peer used a different password, sid
        /// or channel identifier, or the messages were tampered with: abort.
        public func verify(peerTag: [UInt8]) -> Bool {
            HMAC<SHA512>.isValidAuthenticationCode(peerTag, authenticating: peerMessage, using: macKey)
        }
    }
}

/// Why a CPace run was aborted.
public enum CPaceError: Error, Equatable, Sendable {
    /// The peer's share did not have 32 bytes; the associated value is the
    /// length received.
    case invalidShareLength(Int)
    /// The peer's share is a low-order point (on Curve25519 or its twist),
    /// so the shared point is the neutral element: the draft's abort case.
    case invalidShare
    /// The peer's share equals this party's own share: a reflected message.
    case reflectedShare
    /// The inputs hashed to a low-order generator (practically impossible).
    case invalidGenerator
    /// ``CPace/receive(peerShare:peerAssociatedData:)`` was already called on
    /// this run; start a new run instead.
    case alreadyCompleted
}
