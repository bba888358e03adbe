/// What the dashboard page shows, as one JSON document: every update the page receives is a whole state (a page that
/// reconnects, or misses events, is never left with half of one).
public struct DashboardState: Codable, Sendable, Equatable {
    /// One node's card.
    public struct Node: Codable, Sendable, Equatable {
        /// Its index on the page (the controls name nodes by it).
        public var index: Int
        /// Its name.
        public var name: String
        /// Its site id (hex).
        public var site: String
        /// Whether it runs (a stopped demo node keeps its card).
        public var running: Bool
        /// Its state digest (hex); the page draws it as a colour, so equal digests show as one colour.
        public var digest: String?
        /// Its version vector: site name (or short id) to the highest sequence number held.
        public var heads: [String: UInt64]
        /// Rows alive in its replicated tables.
        public var rows: Int?
        /// Tombstones kept (deleted rows not yet collected).
        public var tombstones: Int?
        /// The database's size on disk (rows and Shoal's metadata), when known.
        public var fileBytes: Int64?
        /// Bytes of Shoal's metadata in the database (clocks, change log, digests, roster: every table but the
        /// replicated ones), when known.
        public var metadataBytes: Int64?
        /// Local transactions no peer has acknowledged holding.
        public var pending: UInt64?
        /// How many schema changes it holds (its schema position).
        public var schemaChanges: Int?
        /// Schema changes recorded but not made here.
        public var schemaPending: Int?
        /// Entries in its conflict log.
        public var conflicts: Int?
        /// Peers it is connected to now.
        public var livePeers: Int?
        /// What it lacks: "needs N changes from X", per peer that holds more.
        public var needs: [Need]

        /// A card with only its name and place; the rest is filled in as known.
        public init(index: Int, name: String, site: String, running: Bool) {
            self.index = index
            self.name = name
            self.site = site
            self.running = running
            self.heads = [:]
            self.needs = []
        }
    }

    /// Changes a node lacks that a peer holds.
    public struct Need: Codable, Sendable, Equatable {
        /// The peer's name.
        public var from: String
        /// How many transactions it holds that the node does not.
        public var changes: UInt64

        /// `changes` lacking that `from` holds.
        public init(from: String, changes: UInt64) {
            self.from = from
            self.changes = changes
        }
    }

    /// A link between two nodes.
    public struct Link: Codable, Sendable, Equatable {
        /// One end, by node index.
        public var a: Int
        /// The other end, by node index.
        public var b: Int
        /// "lan" or "relay".
        public var kind: String
        /// "live", "down" (not connected) or "partitioned" (cut on purpose, in the demo).
        public var state: String
        /// Whether change sets crossed it since the last state.
        public var pulse: Bool
        /// Bytes that crossed it so far, when known.
        public var bytes: UInt64?

        /// A link between nodes `a` and `b`.
        public init(a: Int, b: Int, kind: String, state: String, pulse: Bool = false, bytes: UInt64? = nil) {
            self.a = a
            self.b = b
            self.kind = kind
            self.state = state
            self.pulse = pulse
            self.bytes = bytes
        }
    }

    /// Propagation latency: from the origin's commit (its clock) to each other node's apply.
    public struct Latency: Codable, Sendable, Equatable {
        /// How many applies were measured.
        public var samples: Int
        /// The median, in milliseconds.
        public var p50Ms: Double?
        /// The 95th percentile, in milliseconds.
        public var p95Ms: Double?

        /// The figures.
        public init(samples: Int = 0, p50Ms: Double? = nil, p95Ms: Double? = nil) {
            self.samples = samples
            self.p50Ms = p50Ms
            self.p95Ms = p95Ms
        }
    }

    /// A recorded conflict.
    public struct Conflict: Codable, Sendable, Equatable {
        /// The node that recorded it.
        public var node: String
        /// The row's table.
        public var table: String
        /// The row's primary key, as text.
        public var key: String
        /// The column both sides wrote.
        public var column: String
        /// The value the node held.
        public var local: String
        /// The value that arrived.
        public var remote: String
        /// "local" or "remote".
        public var winner: String
        /// Why the winner won.
        public var why: String
        /// When it was recorded (milliseconds since the Unix epoch).
        public var atMs: UInt64

        /// A conflict as the page shows it.
        public init(
            node: String,
            table: String,
            key: String,
            column: String,
            local: String,
            remote: String,
            winner: String,
            why: String,
            atMs: UInt64
        ) {
            self.node = node
            self.table = table
            self.key = key
            self.column = column
            self.local = local
            self.remote = remote
            self.winner = winner
            self.why = why
            self.atMs = atMs
        }
    }

    /// A change set, as first seen.
    public struct ChangeSet: Codable, Sendable, Equatable {
        /// The node that wrote it.
        public var origin: String
        /// Its dot, `SITE:SEQ` (the site shortened).
        public var dot: String
        /// The tables it wrote.
        public var tables: [String]
        /// Rows it wrote.
        public var rows: Int
        /// When it was written (the origin's clock, milliseconds since the Unix epoch).
        public var atMs: UInt64

        /// A change set as the page lists it.
        public init(origin: String, dot: String, tables: [String], rows: Int, atMs: UInt64) {
            self.origin = origin
            self.dot = dot
            self.tables = tables
            self.rows = rows
            self.atMs = atMs
        }
    }

    /// The page's title.
    public var title: String
    /// "demo" or "node".
    public var mode: String
    /// Whether the page offers the demo's controls.
    public var controls: Bool
    /// The nodes' cards.
    public var nodes: [DashboardState.Node]
    /// The links between them.
    public var links: [Link]
    /// Whether every running node shows the same digest.
    public var converged: Bool
    /// Propagation latency.
    public var latency: Latency
    /// How long the last heal took to converge (ms), once it did.
    public var lastHealConvergeMs: Double?
    /// Whether a heal is under way (not converged yet).
    public var healing: Bool
    /// Newest first.
    public var conflicts: [Conflict]
    /// Newest first.
    public var changeSets: [ChangeSet]
    /// The last control's outcome, for the page's status line.
    public var message: String?

    /// A state with no nodes yet.
    public init(title: String, mode: String, controls: Bool) {
        self.title = title
        self.mode = mode
        self.controls = controls
        self.nodes = []
        self.links = []
        self.converged = false
        self.latency = Latency()
        self.healing = false
        self.conflicts = []
        self.changeSets = []
    }
}
