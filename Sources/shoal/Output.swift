import Foundation
import Shoal

/// Formats results for a terminal or for scripts.
enum Output {
    /// A failure in plain words: what failed, then the detail (a system error's text stays, after its meaning).
    static func failure(_ error: any Error, while activity: String?) -> String {
        let detail: String
        if let error = error as? ShoalError {
            detail = error.message
        } else if let code = systemErrorCode(error) {
            detail = "\(String(cString: strerror(code))) (\(error))"
        } else {
            detail = "\(error)"
        }
        guard let activity else { return detail }
        return "\(activity): \(detail)"
    }

    /// The errno a system-call error carries (NIO's `IOError` keeps it as `errnoCode`), if any.
    private static func systemErrorCode(_ error: any Error) -> Int32? {
        if let posix = error as? POSIXError { return posix.code.rawValue }
        for child in Mirror(reflecting: error).children where child.label == "errnoCode" {
            return child.value as? Int32
        }
        // NIO's IOError describes itself as "call(...): reason (errno: N)".
        let text = "\(error)"
        guard let range = text.range(of: "(errno: ", options: .backwards) else { return nil }
        return Int32(text[range.upperBound...].prefix { $0.isNumber })
    }

    static func table(columns: [String], rows: [[SQLValue]]) -> String {
        let cells = rows.map { $0.map(\.description) }
        var widths = columns.map(\.count)
        for row in cells { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) } }
        func line(_ values: [String]) -> String {
            zip(values, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(separator: " | ")
        }
        var text =
            line(columns) + "\n" + widths.map { String(repeating: "-", count: $0) }.joined(separator: "-+-") + "\n"
        for row in cells { text += line(row) + "\n" }
        return text
    }

    static func jsonLine(columns: [String], row: [SQLValue]) -> String {
        var object: [String: Any] = [:]
        for (column, value) in zip(columns, row) { object[column] = jsonValue(value) }
        return serialize(object)
    }

    static func jsonValue(_ value: SQLValue) -> Any {
        switch value {
        case .null: NSNull()
        case .integer(let integer): integer
        case .real(let real): real.isFinite ? real : String(real)
        case .text(let text): text
        case .invalidText(let bytes): ["text_base64": Data(bytes).base64EncodedString()]
        case .blob(let bytes): ["blob": Data(bytes).base64EncodedString()]
        }
    }

    static func serialize(_ object: Any) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    static func json(
        _ status: StoreStatus,
        live: LiveStatus?,
        keyFile: KeyFile? = nil,
        database: String = "PATH"
    ) -> String {
        let peers: Any =
            live.flatMap { try? JSONSerialization.jsonObject(with: JSONEncoder().encode($0.peers)) } ?? NSNull()
        let pending: Any =
            live.flatMap { try? JSONSerialization.jsonObject(with: JSONEncoder().encode($0.pending ?? [])) } ?? NSNull()
        let relay: Any =
            live?.relay.flatMap { relay in
                (try? JSONSerialization.jsonObject(with: JSONEncoder().encode(relay))) as? [String: Any]
            } ?? NSNull()
        let errors = (live?.peers ?? []).compactMap { peer in
            divergence(of: peer, database: database, plaintextCluster: live?.cluster).map { error in
                [
                    "kind": "diverged", "peer": peer.site, "name": peer.name, "since_ms": error.since,
                    "message": error.message, "run": error.run,
                ] as [String: Any]
            }
        }
        return serialize([
            "errors": errors,
            "relay": relay,
            "node_id": keyFile.map { $0.identity.nodeID.description as Any } ?? NSNull(),
            "cluster_id": keyFile.map { $0.cluster.idHex as Any } ?? NSNull(),
            "security": live?.security.map { $0 as Any } ?? NSNull(),
            "pending_devices": pending,
            "running": live != nil,
            "pending_local_changes": live.map { $0.pendingLocalChanges as Any } ?? NSNull(),
            "clock_ahead_of_peers_ms": live?.clockAheadOfPeersMs.map { $0 as Any } ?? NSNull(),
            "write_lock": live?.writeLock.map { holds in
                [
                    "transactions": holds.transactions, "longest_ms": holds.longestMilliseconds,
                    "over_50_ms": holds.over50Milliseconds, "total_ms": holds.totalMilliseconds,
                ] as [String: Any]
            } ?? NSNull(),
            "peers": peers,
            "members": live.map { live in
                let now = SystemWallClock().nowMilliseconds()
                return (live.members ?? []).map { member in
                    [
                        "site": member.site, "name": member.name.map { $0 as Any } ?? NSNull(),
                        "version_vector": member.versionVector, "reported_at_ms": member.reportedAtMs,
                        "age_ms": now &- min(now, member.reportedAtMs), "source": member.source,
                        "via": member.via.map { $0 as Any } ?? NSNull(),
                    ] as [String: Any]
                } as Any
            } ?? NSNull(),
            "collection": live?.collection.map { collection in
                let now = SystemWallClock().nowMilliseconds()
                let member = { (member: LiveStatus.Collection.Waiting) -> [String: Any] in
                    [
                        "site": member.site, "name": member.name.map { $0 as Any } ?? NSNull(),
                        "node": member.node.map { $0 as Any } ?? NSNull(),
                        "last_report_ms": member.lastReportMs.map { $0 as Any } ?? NSNull(),
                        "silent_ms": member.lastReportMs.map { (now &- min(now, $0)) as Any } ?? NSNull(),
                    ]
                }
                return [
                    "enabled": collection.enabled ?? true,
                    "members_known": collection.membersKnown,
                    "collected": collection.collected,
                    "last_collected_at_ms": collection.lastCollectedAtMs.map { $0 as Any } ?? NSNull(),
                    "tombstones": status.tables.reduce(0) { $0 + $1.tombstones },
                    "waiting_for": collection.waitingFor.map(member),
                    "suspended": (collection.suspended ?? []).map(member),
                    "fresh_states_taken": collection.freshStatesTaken ?? 0,
                    "waits_for_relay": collection.waitsForRelay == true && status.tables.contains { $0.tombstones > 0 },
                ] as [String: Any]
            } ?? NSNull(),
            "site": status.siteID.hex,
            "name": status.nodeName.map { $0 as Any } ?? NSNull(),
            "version_vector": Dictionary(
                uniqueKeysWithValues: status.versionVector.entries.map { ($0.key.hex, $0.value) }
            ),
            "tables": status.tables.map { table in
                [
                    "name": table.name, "rows": table.rows, "tombstones": table.tombstones,
                    "counters": table.counterColumns,
                    "metadata_bytes": table.metadataBytes.map { $0 as Any } ?? NSNull(),
                    "metadata_bytes_per_row": table.metadataBytes.map { bytes -> Any in
                        table.rows + table.tombstones == 0 ? 0 : Double(bytes) / Double(table.rows + table.tombstones)
                    } ?? NSNull(),
                ] as [String: Any]
            },
            "paused_tables": status.pausedTables.map { table in
                ["name": table.name, "change": table.change, "message": table.message] as [String: Any]
            },
            "conflicts": status.conflicts,
            "schema": [
                "changes": status.schemaChanges, "pending": status.schemaPending,
                "conflicts": status.schemaConflicts.map { conflict in
                    [
                        "table": conflict.table, "column": conflict.column, "local": conflict.local,
                        "winner": conflict.winner, "message": conflict.description,
                    ]
                },
                "held_changes": status.heldChanges,
            ] as [String: Any],
            "digest": status.digest.hex,
            "digest_current": status.digestIsCurrent,
            "identity_change": status.identityChange.map {
                ["reason": $0.reason.rawValue, "previous_site": $0.previousSite.hex, "message": $0.description] as Any
            } ?? NSNull(),
            "awaits_fresh_state": status.awaitsFreshState,
        ])
    }

    /// The schema position, what is held for columns and tables not here yet, and schema conflicts.
    static func schemaLines(_ status: StoreStatus) -> String {
        var text = "schema:     \(status.schemaChanges) schema change\(status.schemaChanges == 1 ? "" : "s")"
        if !status.schemaPending.isEmpty {
            text += "; not made here yet: \(status.schemaPending.joined(separator: ", ")) (their values are held)"
        }
        text += "\n"
        let held = status.heldChanges.filter { $0.value > 0 }.sorted { $0.key < $1.key }
        if !held.isEmpty {
            text += "held:       "
                + held.map { "\($0.value) change\($0.value == 1 ? "" : "s") for \($0.key)" }.joined(separator: ", ")
                + " (for tables or columns this node does not have yet; merged when they appear)\n"
        }
        for conflict in status.schemaConflicts { text += "ERROR:      schema conflict: \(conflict)\n" }
        return text
    }

    static func text(
        _ status: StoreStatus,
        live: LiveStatus?,
        keyFile: KeyFile? = nil,
        database: String = "PATH"
    ) -> String {
        var text = "site:       \(status.siteID.hex)\n"
        if let change = status.identityChange { text += "identity:   \(change)\n" }
        if status.awaitsFreshState {
            text += "fresh state: awaited (this database lost history, or peers collected deletes without it): its own "
                + "writes wait until it has compared rows with a peer it can dial, or read the relay's whole state "
                + "through its relay link; serve it with a peer or its relay online\n"
        }
        if let name = status.nodeName { text += "name:       \(name)\n" }
        if let keyFile {
            text += "node id:    \(keyFile.identity.nodeID)\n"
            text += "cluster:    \(keyFile.cluster.idHex)\n"
        }
        text +=
            "version:    \(status.versionVector.sorted.map { "\($0.site.hex.prefix(8)):\($0.seq)" }.joined(separator: " "))\n"
        text += "conflicts:  \(status.conflicts)\n"
        text += "digest:     \(status.digest.hex)"
            + (status.digestIsCurrent ? "\n" : " (not current: the running node is folding in recent changes)\n")
        text += "tables:\n"
        for table in status.tables {
            let counters =
                table.counterColumns.isEmpty ? "" : "  counters: \(table.counterColumns.joined(separator: ", "))"
            text += "  \(table.name): \(table.rows) rows, \(table.tombstones) tombstones\(counters)\n"
        }
        if !status.pausedTables.isEmpty {
            text += "paused (changed by another tool; not replicated until resolved):\n"
            for table in status.pausedTables { text += "  \(table.name): \(table.message)\n" }
        }
        text += schemaLines(status)
        guard let live else { return text + "node:       not running (no shoal serve on this database)\n" }
        for peer in live.peers {
            guard let error = divergence(of: peer, database: database, plaintextCluster: live.cluster) else { continue }
            text += "ERROR:      \(error.message); run `\(error.run)` to list the rows that differ\n"
        }
        if let ahead = live.clockAheadOfPeersMs {
            text += "ERROR:      this machine's clock is \(ahead / 1000) s ahead of its peers': local writes are stamped "
                + "with their time; set the clock right\n"
        }
        text += "pending:    \(live.pendingLocalChanges) local transactions no peer (nor the relay) has acknowledged\n"
        if let holds = live.writeLock {
            text += "write lock: held at most \(String(format: "%.1f", holds.longestMilliseconds)) ms at a time over "
                + "\(holds.transactions) write transactions (\(holds.over50Milliseconds) over 50 ms)\n"
        }
        if let security = live.security { text += "links:      \(security)\n" }
        if let relay = live.relay { text += relayLine(relay) }
        if let devices = live.pending, !devices.isEmpty {
            text += "waiting to be accepted (shoal trust add NODE_ID):\n"
            for device in devices {
                text += "  \(device.node)  \(device.name.isEmpty ? "(no name)" : device.name) from \(device.address), "
                    + "\(device.attempts) attempt\(device.attempts == 1 ? "" : "s")\n"
            }
        }
        text += "peers:\n"
        if live.peers.isEmpty && live.relay == nil { text += "  none yet\n" }
        if let relay = live.relay { text += relayPeerLine(relay) }
        let now = SystemWallClock().nowMilliseconds()
        for peer in live.peers {
            // A failing peer says so even while it reconnects: "live" only once its rounds succeed.
            let state =
                peer.divergedSinceMs != nil
                ? "DIVERGED (error: same version, different rows; see above)\(peer.connected ? " (connected)" : "")"
                : peer.consecutiveFailures > 0
                ? "failing: \(peer.lastError ?? "?")\(peer.connected ? " (connected)" : "")"
                : peer.connected ? "live" : (peer.everConnected ? "gone" : peer.lastError ?? "found, not connected yet")
            let last = peer.lastSuccessfulSyncMs.map { "\(now > $0 ? now - $0 : 0) ms ago" } ?? "never"
            let rounds =
                peer.roundsFinished + peer.roundsFailed == 0
                ? "no rounds yet" : "rounds \(peer.roundsFinished) ok, \(peer.roundsFailed) failed"
            let durations = peer.roundP50Ms.map { "p50 \($0) ms, p99 \(peer.roundP99Ms ?? $0) ms" } ?? "no rounds"
            let addresses = (peer.addresses.isEmpty ? [peer.address] : peer.addresses).joined(separator: ", ")
            let ours = Dictionary(uniqueKeysWithValues: status.versionVector.entries.map { ($0.key.hex, $0.value) })
            // What a peer holds is known only from what it acknowledged, over a connection.
            let version =
                !peer.everConnected ? "version unknown"
                : peer.versionVector == ours ? "same version" : "different version"
            let digest =
                switch (peer.digest, status.digest.hex) {
                case (nil, _): "digest not reported yet"
                case _ where !status.digestIsCurrent: "digest being brought up to date here"
                case (let theirs?, let ours) where theirs == ours: "digest matches"
                default: "digest differs"
                }
            text +=
                "  \(peer.name.isEmpty ? "?" : peer.name) \(peer.site.prefix(8)) (\(peer.foundBy)) at \(addresses): \(state), "
                + "last sync \(last), "
                + "failures in a row \(peer.consecutiveFailures), \(rounds), \(durations), "
                + "\(version), \(digest)"
                + (peer.everConnected ? peer.lacking.map { ", lacks \($0) of this node's transactions" } ?? "" : "")
                + (peer.catchUpChanges.map { changes in
                    ", catching up: \(changes) changes done"
                        + (peer.catchUpBytes.map { " (\(megabytes($0)) received)" } ?? "")
                        + ", \(Int(peer.catchUpRate ?? 0)) changes/s"
                        + (peer.catchUpBytesPerSecond.map { " (\(megabytes(Int($0)))/s)" } ?? "")
                        + ", about \(peer.catchUpRemaining ?? 0) to go"
                        + (peer.catchUpSecondsLeft.map { ", ETA \(Int($0.rounded(.up))) s" } ?? "")
                } ?? "") + "\n"
        }
        text += memberLines(live.members ?? [], ownName: status.nodeName, now: now)
        text += collectionLines(live.collection, tombstones: status.tables.reduce(0) { $0 + $1.tombstones }, now: now)
        return text
    }

    /// `bytes` in megabytes (10^6 bytes), with one decimal.
    static func megabytes(_ bytes: Int) -> String {
        let tenths = (bytes + 50_000) / 100_000
        return "\(tenths / 10).\(tenths % 10) MB"
    }

    /// Whether deletes are collected, and whom their tombstones wait for, with what to do.
    static func collectionLines(_ collection: LiveStatus.Collection?, tombstones: Int, now: UInt64) -> String {
        guard let collection else { return "" }
        var text = ""
        if collection.enabled == false {
            if tombstones > 0 {
                text += "deletes: \(tombstones) tombstones kept: collection is off (the node runs with "
                    + "--no-collect-deletes)\n"
            }
            return text
        }
        if !collection.membersKnown {
            if tombstones > 0 {
                text += "deletes: \(tombstones) tombstones kept: they are collected only in a cluster with a roster "
                    + "(links with TLS), which names every member that must hold a delete first\n"
            }
            return text
        }
        if let suspended = collection.suspended, !suspended.isEmpty {
            let who = suspended.map { member in
                "\(member.name ?? "?") \(member.site.prefix(8))"
                    + (member.lastReportMs.map { " (last heard from \((now &- min(now, $0)) / 1000) s ago)" } ?? "")
            }
            text += "deletes: collected without \(who.joined(separator: ", ")), silent past the horizon: "
                + "\(who.count == 1 ? "it takes" : "they take") a fresh state when back (writes to rows collected "
                + "meanwhile go to \(who.count == 1 ? "its" : "their") conflict log: shoal conflicts --restore)\n"
        }
        if tombstones > 0, !collection.waitingFor.isEmpty {
            let who = collection.waitingFor.map { member in
                let name = "\(member.name ?? "?") \(member.site.prefix(8))"
                guard let last = member.lastReportMs else { return "\(name) (never heard from)" }
                return "\(name) (last heard from \((now &- min(now, last)) / 1000) s ago)"
            }
            let nodes = collection.waitingFor.compactMap(\.node)
            text += "deletes: \(tombstones) tombstones wait for \(who.joined(separator: ", ")), which lack deletes "
                + "this node holds: bring \(who.count == 1 ? "it" : "them") online"
                + (nodes.isEmpty ? "" : ", or remove \(who.count == 1 ? "it" : "them") from the cluster ("
                    + nodes.map { "shoal trust remove \($0)" }.joined(separator: "; ") + ")") + "\n"
        } else if tombstones > 0, collection.waitsForRelay == true {
            text += "deletes: \(tombstones) tombstones wait for the relay to hold their deletes (every member holds "
                + "them): this node has a relay link, and a member that syncs through the relay alone may read its "
                + "state there; they are collected once this node's uploads reach it\n"
        } else if collection.collected > 0 {
            text += "deletes: \(collection.collected) tombstones collected since the node started"
                + (tombstones > 0 ? ", \(tombstones) more once every member holds their deletes" : "") + "\n"
        }
        return text
    }

    /// What every member was last known to hold, how long ago, and who said so.
    static func memberLines(_ members: [LiveStatus.Member], ownName: String?, now: UInt64) -> String {
        guard !members.isEmpty else { return "" }
        let names = Dictionary(members.compactMap { member in member.name.map { (member.site, $0) } }) { a, _ in a }
        var text = "members (what each was last known to hold):\n"
        for member in members {
            let vector = member.versionVector.sorted { $0.key < $1.key }.map { "\($0.key.prefix(8)):\($0.value)" }
            let age = (now &- min(now, member.reportedAtMs)) / 1000
            let source =
                switch member.source {
                case "local": "this node"
                case "direct": "from itself, \(age) s ago"
                case "report": "its report row, \(age) s ago"
                default:
                    "passed on by \(member.via.map { names[$0] ?? String($0.prefix(8)) } ?? "a peer"), \(age) s ago"
                }
            let name = member.name ?? (member.source == "local" ? ownName : nil) ?? "?"
            text += "  \(name) \(member.site.prefix(8)): \(vector.joined(separator: " ")) (\(source))\n"
        }
        return text
    }
}

extension Output {
    /// A peer's divergence, as an error a person can act on: what happened, since when, and the command that lists
    /// the rows that differ.
    static func divergence(
        of peer: LiveStatus.Peer,
        database: String,
        plaintextCluster: String?
    ) -> (since: UInt64, message: String, run: String)? {
        guard let since = peer.divergedSinceMs else { return nil }
        let now = SystemWallClock().nowMilliseconds()
        let elapsed = now > since ? now - since : 0
        let name = "\(peer.name.isEmpty ? "" : peer.name + " ")\(peer.site.prefix(8))"
        let message =
            "diverged from \(name) for \(elapsed < 1_000 ? "\(elapsed) ms" : "\(elapsed / 1000) s"): it holds the same "
            + "changes as this node but different rows (different digests at the same version), and syncing will not "
            + "mend it"
        let address = peer.listeningAddress ?? "HOST:PORT"
        let run =
            "shoal verify --db \(database) --peer \(address)"
            + (plaintextCluster.map { " --insecure-plaintext --cluster \($0)" } ?? "")
            + (peer.listeningAddress == nil ? " (HOST:PORT: the peer's address)" : "")
        return (since, message, run)
    }

    /// The relay as one of the peers: its state, its last sync (the later of its last push and pull), what it moved
    /// and what it acknowledged of this node's writes.
    static func relayPeerLine(_ relay: RelayStatus) -> String {
        let now = SystemWallClock().nowMilliseconds()
        let state =
            switch relay.reachable {
            case nil: "not tried yet"
            case true?: relay.unauthorized ? "failing: \(relay.lastError ?? "it refuses the token")" : "live"
            case false?: "failing: \(relay.problem?.words ?? "unreachable")"
            }
        let synced = [relay.lastPushMs, relay.lastPullMs].compactMap { $0 }.max()
        let last = synced.map { "\(now > $0 ? now - $0 : 0) ms ago" } ?? "never"
        let acknowledged =
            switch relay.lacking {
            case nil: "acknowledgement not known yet"
            case 0?: "holds every write of this node's"
            case let lacking?: "lacks \(lacking) of this node's transactions"
            }
        return "  relay \(relay.url) (relay): \(state), last sync \(last), \(relay.uploaded) chunks uploaded, "
            + "\(relay.applied) changes applied from it, \(acknowledged)\n"
    }

    /// The relay's state in a few lines: reachable or not and since when, last upload and pull, what it lacks.
    static func relayLine(_ relay: RelayStatus) -> String {
        let now = SystemWallClock().nowMilliseconds()
        func ago(_ milliseconds: UInt64?) -> String {
            guard let milliseconds else { return "never" }
            let elapsed = now > milliseconds ? now - milliseconds : 0
            return elapsed < 1_000 ? "\(elapsed) ms ago" : "\(elapsed / 1000) s ago"
        }
        let state =
            switch relay.reachable {
            case nil: "not tried yet"
            case true?: relay.unauthorized ? "reachable, but it refuses the token" : "reachable"
            case false?: relay.problem?.words ?? "unreachable"
            }
        var text = "relay:      \(relay.url): \(state)"
        if relay.unauthorized, relay.reachable == true {
            text += " (since \(ago(relay.lastErrorMs)))"
        } else if relay.reachable != nil {
            text += " since \(ago(relay.sinceMs))"
        }
        if relay.epoch > 0 { text += ", key epoch \(relay.epoch)" }
        text += "\n            last push \(ago(relay.lastPushMs)), last pull \(ago(relay.lastPullMs)); "
        switch relay.lacking {
        case nil:
            text += "what it lacks is not known yet (its heads were never read)\n"
        case 0?:
            text += "it holds everything this node holds\n"
        case let lacking?:
            text += "it lacks \(lacking) transaction\(lacking == 1 ? "" : "s") of this node's, for \(ago(relay.lackingSinceMs).replacingOccurrences(of: " ago", with: ""))\n"
        }
        if let error = relay.lastError {
            text += "            last error (\(ago(relay.lastErrorMs))): \(error)\n"
        }
        return text
    }
}

/// Buffered stdout for large streams.
struct FileHandleOutput {
    private var buffer = [UInt8]()

    mutating func write(_ line: String) {
        buffer.append(contentsOf: line.utf8)
        buffer.append(10)
        if buffer.count > 1 << 16 { flush() }
    }

    mutating func flush() {
        FileHandle.standardOutput.write(Data(buffer))
        buffer.removeAll(keepingCapacity: true)
    }
}
