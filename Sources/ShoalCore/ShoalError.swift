/// Every error Shoal reports: a code to match on, and a message a person can act on.
public struct ShoalError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of error this is. New codes may be added in later releases.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case clockTooFarAhead, corruptMetadata, malformedStream, truncatedStream, unknownTable, unknownColumn
            case noPrimaryKey, unsupportedSchema, notReplicated, sqlite, streamNotApplicable, siteConflict
            case invalidArgument, uncapturedCommit
            case malformedMessage, frameTooLarge, unknownMessageType, versionMismatch, clusterMismatch, selfConnection
            case timeout, rejected
            case discoveryUnavailable, network
            case counterNotInteger, valueTooLarge
            case missingDatabase, databaseInUse, tablePaused, awaitingFreshState
            case identity, notAMember, invite, handshakeFailed
            case relay, unauthorized, sealBroken
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A remote clock is further ahead of local time than the configured bound.
        public static let clockTooFarAhead = Code(.clockTooFarAhead)
        /// Shoal's own metadata could not be decoded.
        public static let corruptMetadata = Code(.corruptMetadata)
        /// A change stream line could not be parsed or is inconsistent.
        public static let malformedStream = Code(.malformedStream)
        /// A change stream ended before its trailer.
        public static let truncatedStream = Code(.truncatedStream)
        /// A change names a table this database does not replicate.
        public static let unknownTable = Code(.unknownTable)
        /// A change names a column the table does not have.
        public static let unknownColumn = Code(.unknownColumn)
        /// A table without a primary key cannot be replicated.
        public static let noPrimaryKey = Code(.noPrimaryKey)
        /// A table's schema cannot be replicated as it is.
        public static let unsupportedSchema = Code(.unsupportedSchema)
        /// The operation needs a replicated table.
        public static let notReplicated = Code(.notReplicated)
        /// SQLite reported an error.
        public static let sqlite = Code(.sqlite)
        /// A change stream was cut for a version this database does not hold.
        public static let streamNotApplicable = Code(.streamNotApplicable)
        /// Changes claim this database's own site id for sequence numbers it never issued.
        public static let siteConflict = Code(.siteConflict)
        /// An argument is out of range or malformed.
        public static let invalidArgument = Code(.invalidArgument)
        /// A commit would have lost captured changes.
        public static let uncapturedCommit = Code(.uncapturedCommit)
        /// A wire message could not be decoded.
        public static let malformedMessage = Code(.malformedMessage)
        /// A frame is longer than the enforced maximum.
        public static let frameTooLarge = Code(.frameTooLarge)
        /// A frame carries a message type this build does not know.
        public static let unknownMessageType = Code(.unknownMessageType)
        /// The two nodes share no protocol version.
        public static let versionMismatch = Code(.versionMismatch)
        /// The peer belongs to another cluster.
        public static let clusterMismatch = Code(.clusterMismatch)
        /// The peer has this node's own site id.
        public static let selfConnection = Code(.selfConnection)
        /// The relay refused a request, answered with something this build cannot read, or could not be reached.
        public static let relay = Code(.relay)
        /// The relay refused the bearer token: unknown, revoked, or for another cluster.
        public static let unauthorized = Code(.unauthorized)
        /// A sealed change set failed its authentication: not sealed with this cluster's key, or altered since.
        public static let sealBroken = Code(.sealBroken)
        /// The peer did not answer in time.
        public static let timeout = Code(.timeout)
        /// The peer refused us, with a reason.
        public static let rejected = Code(.rejected)
        /// mDNS discovery cannot work here (no Avahi daemon or D-Bus, a name conflict, …); static peers still do.
        public static let discoveryUnavailable = Code(.discoveryUnavailable)
        /// A network or socket failure: a connection lost, reset or refused.
        public static let network = Code(.network)
        /// A write put something other than an integer (text, a real, NULL, a blob, an overflowed sum) into a
        /// counter column; it was refused and nothing was written.
        public static let counterNotInteger = Code(.counterNotInteger)
        /// A write stored a TEXT or BLOB value larger than the maximum a replicated table accepts; it was
        /// refused and nothing was written.
        public static let valueTooLarge = Code(.valueTooLarge)

        /// No database file at the given path (only `shoal init` creates one).
        public static let missingDatabase = Code(.missingDatabase)
        /// Another process already runs a node on this database.
        public static let databaseInUse = Code(.databaseInUse)
        /// The table's shape changed behind Shoal's back (or it is gone): its replication is paused.
        public static let tablePaused = Code(.tablePaused)
        /// The database was restored from a backup or copied and awaits its fresh state: what it holds of the other
        /// members may be older than what they hold, and the operation needs the newer.
        public static let awaitingFreshState = Code(.awaitingFreshState)

        /// The node's key file is missing, unreadable, readable by others, or not a P-256 key.
        public static let identity = Code(.identity)
        /// The peer's key is not on the roster (pending, removed, or never admitted), or its hello does not match
        /// what the roster binds to its key.
        public static let notAMember = Code(.notAMember)
        /// An invite code is malformed, unknown, expired, used or wrong, or joining failed.
        public static let invite = Code(.invite)
        /// The TLS handshake with a peer failed (no certificate, an old TLS version, a stalled handshake, …).
        public static let handshakeFailed = Code(.handshakeFailed)

        /// The code's name, as in ``ShoalError/Code`` (`sqlite`, `network`, …).
        public var description: String { base.rawValue }
    }

    /// What SQLite reported, for an error SQLite raised: a caller can tell a busy database from a constraint
    /// from a full disk without reading the message.
    public struct SQLiteFailure: Hashable, Sendable, CustomStringConvertible {
        /// SQLite's extended result code (`SQLITE_BUSY_SNAPSHOT`, `SQLITE_CONSTRAINT_UNIQUE`, `SQLITE_IOERR_WRITE`, …).
        public let extendedResultCode: Int32
        /// The statement that failed, when there was one (its SQL text as prepared).
        public let statement: String?

        /// A failure with SQLite's extended result code and the statement that raised it.
        public init(extendedResultCode: Int32, statement: String? = nil) {
            self.extendedResultCode = extendedResultCode
            self.statement = statement
        }

        /// SQLite's primary result code: the low byte of the extended one (`SQLITE_BUSY` is 5, …).
        public var resultCode: Int32 { extendedResultCode & 0xFF }
        /// The database file is locked by another connection (`SQLITE_BUSY`) or table (`SQLITE_LOCKED`): worth
        /// trying again later.
        public var isBusy: Bool { resultCode == 5 || resultCode == 6 }
        /// A constraint failed (`SQLITE_CONSTRAINT`: unique, not null, check, foreign key, a trigger's RAISE).
        public var isConstraintViolation: Bool { resultCode == 19 }
        /// The disk or the database is full (`SQLITE_FULL`).
        public var isFull: Bool { resultCode == 13 }
        /// A disk I/O error (`SQLITE_IOERR`, any of its extended codes).
        public var isIOError: Bool { resultCode == 10 }
        /// The database is read-only (`SQLITE_READONLY`: a file without write permission, a read-only mount).
        public var isReadOnly: Bool { resultCode == 8 }

        /// `SQLite error N (extended M)`, and the statement when known.
        public var description: String {
            let codes =
                extendedResultCode == resultCode
                ? "SQLite error \(resultCode)" : "SQLite error \(resultCode), extended \(extendedResultCode)"
            return statement.map { "\(codes) in: \($0)" } ?? codes
        }
    }

    /// The kind of error.
    public let code: Code
    /// What happened and what to do about it.
    public let message: String
    /// SQLite's result codes and the failing statement, when SQLite raised the error (``Code/sqlite``, and the
    /// errors a failed SQLite call turned into, like ``Code/tablePaused``'s triggers); `nil` otherwise.
    public let sqlite: SQLiteFailure?

    /// An error of kind `code`, saying `message`; `sqlite` holds what SQLite reported, when it raised it.
    public init(code: Code, message: String, sqlite: SQLiteFailure? = nil) {
        self.code = code
        self.message = message
        self.sqlite = sqlite
    }

    /// The message.
    public var description: String { message }
}

extension ShoalError {
    /// A remote clock beyond the drift bound.
    public static func clockTooFarAhead(remote: HLC, now: UInt64, bound: UInt64) -> ShoalError {
        let ahead = remote.milliseconds > now ? remote.milliseconds - now : 0
        return ShoalError(
            code: .clockTooFarAhead,
            message: "a remote clock (\(remote)) is \(ahead) ms ahead of local time, beyond the allowed "
                + "\(bound) ms; the changes were refused, nothing was applied. Check the clocks of the sending node"
        )
    }

    /// Shoal's metadata could not be decoded.
    public static func corruptMetadata(_ detail: String) -> ShoalError {
        ShoalError(code: .corruptMetadata, message: "Shoal metadata is corrupt: \(detail)")
    }

    /// A change stream line is malformed.
    public static func malformedStream(line: Int, _ detail: String) -> ShoalError {
        ShoalError(code: .malformedStream, message: "line \(line): \(detail); nothing was applied")
    }
}
