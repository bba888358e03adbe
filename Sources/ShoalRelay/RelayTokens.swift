import ShoalRelayProtocol

/// Bearer tokens: 32 random bytes, written `shoal-relay-` and 64 hex digits; the relay keeps their SHA-256 only.
public enum RelayTokens {
    /// Every token starts with this.
    public static let prefix = RelayAPI.tokenPrefix

    /// A new random token.
    public static func make() -> String { RelayAPI.makeToken() }

    /// The hash the relay stores and looks tokens up by.
    public static func hash(_ token: String) -> String { RelayAPI.tokenHash(token) }
}
