import Logging
import ShoalCore

/// Divergence is loud: a peer that holds the same changes as this node (equal version vectors) but a different
/// digest has different rows, and no sync mends that, since neither side lacks a change. Each acknowledgement that
/// carries the peer's digest is compared with this node's (``DivergenceWatch`` decides); a divergence is an error in
/// the peer's status (``PeerStatus/divergence``), in the log (once at error level, then with a count), in the
/// metrics (`shoal_node_diverged_peers`, `shoal_node_peer_diverged`) and in the events (``NodeEvent/peerDiverged``),
/// each saying what to run: `shoal verify --peer`, which lists the rows that differ.
extension SyncNode {
    /// Compares the digests peers acknowledged since the last comparison with this node's. When this node's digest
    /// is stale, a refresh starts in the background (with `refreshing`; at most every 2 s, once the data is quiet),
    /// and the comparison runs again when it ends: so acknowledgements carry digests, and divergence is found, without
    /// anyone asking for the status.
    func compareAcknowledgedDigests(refreshing: Bool) async {
        // Answers at once: from memory while the digest is current (an idle round costs no database work).
        if refreshing { _ = try? await refreshDigest(waiting: false) }
        guard !uncomparedDigests.isEmpty, let state = try? await worker.comparableState(),
            let digest = state.digest
        else { return }
        let vector = state.versionVector
        let peers = uncomparedDigests
        uncomparedDigests.removeAll()
        for peer in peers {
            guard let status = directory.status(of: peer), let theirs = status.digest else { continue }
            let verdict = divergenceWatch.compare(
                peer: peer,
                peerVector: status.versionVector,
                peerDigest: theirs,
                localVector: vector,
                localDigest: digest.hex,
                now: configuration.clock.nowMilliseconds()
            )
            report(verdict, peer: peer)
        }
    }

    private func report(_ verdict: DivergenceWatch.Verdict, peer: SiteID) {
        let status = directory.status(of: peer)
        let name = status?.name ?? ""
        let label = "\(name.isEmpty ? "" : name.printable() + " ")\(peer.hex.prefix(8))"
        let address = status?.listeningAddress
        let key = "diverged \(peer.hex)"
        switch verdict {
        case .none:
            return
        case .diverged(let divergence), .stillDiverged(let divergence):
            directory.setDivergence(peer, divergence)
            let run =
                address.map { "shoal verify --peer \($0)" } ?? "shoal verify --peer HOST:PORT (the peer's address)"
            let reason =
                "replicas diverged: peer \(label) holds the same changes as this node but different rows (different "
                + "digests at the same version); syncing between these two will not mend it (a third node that holds the rows may); run `\(run)` to list the rows that differ"
            guard let line = failures.note(key, reason, retrying: false) else { return }
            configuration.logger.error(
                "\(line)",
                metadata: [
                    "peer": "\(peer.hex.prefix(8))", "localDigest": "\(divergence.localDigest)",
                    "peerDigest": "\(divergence.peerDigest)",
                ]
            )
            if case .diverged = verdict {
                eventSink.yield(.peerDiverged(peer, name: name, address: address, divergence))
            }
        case .converged:
            directory.setDivergence(peer, nil)
            failures.clear(key)
            configuration.logger.info(
                "replicas converged again: equal digests at the same version",
                metadata: ["peer": "\(peer.hex.prefix(8))"]
            )
            eventSink.yield(.peerConverged(peer, name: name))
        }
    }
}
