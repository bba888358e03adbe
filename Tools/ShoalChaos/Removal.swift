import ArgumentParser
import Foundation
import Shoal
import ShoalProcesses

/// A member removed during the run: `shoal trust remove` of its node id, run on another member's file as an operator
/// would while that member runs. The removal rotates the relay's sealing key to a new epoch; the removed node keeps
/// running and writing.
///
/// Which of its writes count is the line the roster draws: each removal carries a *cut* (the highest seq of the
/// removed node's site its signer held), and every member fences that site at the highest cut of its removals. A
/// write of the removed node at or below the fence was seen before the removal and must survive as any other; one
/// beyond it must appear on no remaining member. A site the roster draws no line for (the node's fresh site after a
/// restore from a backup, which the roster does not know) falls back to when the write was made: after the removal,
/// it must appear on no remaining member; before, it survives when a remaining member holds it.
struct Removal {
    /// The removed node.
    let node: Int
    /// The member that signed the removal.
    let signer: Int

    /// Removes node `node` by running `shoal trust remove` on the first of `signers` whose file does not await its
    /// fresh state (the command refuses such a file, as an operator would then see); `nil` when every one does.
    static func perform(node: Int, signers: [Int], paths: [String]) throws -> Removal? {
        let said = try shoal(["id", "--db", paths[node]])
        guard let id = said.split(separator: "\n").last.map(String.init), !id.isEmpty else {
            throw ChaosError("shoal id printed no node id for node\(node)")
        }
        for signer in signers {
            do {
                _ = try shoal(["trust", "remove", id, "--db", paths[signer]])
                return Removal(node: node, signer: signer)
            } catch let error as ChaosError where error.description.contains("fresh state: awaited") {
                print("node\(signer) awaits its fresh state and refused to remove node\(node): another member signs")
            }
        }
        return nil
    }

    /// Runs `shoal ARGUMENTS` and returns what it printed, or throws with its standard error.
    static func shoal(_ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = ServeProcess.executable()
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let complaint = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw ChaosError("shoal \(arguments.joined(separator: " ")) failed: \(complaint)")
        }
        return said
    }

    /// Checks the line on the remaining members' stores (`remaining`, by node index) and returns the write log
    /// without the removed node's writes that do not count: those beyond the line, and those before it that no
    /// remaining member got. Fails the run when a remaining member holds one beyond the line, or the members draw
    /// different lines.
    func settle(log: [AcknowledgedWrite], remaining: [(node: Int, store: Store)]) throws -> (
        log: [AcknowledgedWrite], summary: String
    ) {
        let fences = try remaining.map { try $0.store.fences() }
        for (index, other) in fences.enumerated() where other != fences[0] {
            print(
                "FAILED: node\(remaining[index].node) fences \(Self.describe(other)) but node\(remaining[0].node) "
                    + "fences \(Self.describe(fences[0]))"
            )
            throw ExitCode(1)
        }
        let fence = fences.first ?? [:]
        var kept: [AcknowledgedWrite] = []
        var (before, beyond, unseen) = (0, 0, 0)
        for write in log {
            guard write.node == node else {
                kept.append(write)
                continue
            }
            let counts: Bool
            if let line = fence[write.stamp.site] {
                counts = write.stamp.seq <= line
            } else {
                counts = try !write.afterRemoval && remaining.contains { try $0.store.versionVector().covers(write.stamp.dot) }
                if !counts && !write.afterRemoval {
                    // Made before the removal and held by no remaining member: it never got out, nothing to check.
                    unseen += 1
                    continue
                }
            }
            if counts {
                kept.append(write)
                before += 1
                continue
            }
            beyond += 1
            for (member, store) in remaining {
                let state = try store.rowState(table: "t", primaryKey: [.integer(write.key)])
                if try store.versionVector().covers(write.stamp.dot) || state?.dots.contains(write.stamp.dot) == true {
                    let line = fence[write.stamp.site].map { "its site's fence is \($0)" } ?? "no fence covers its site"
                    print(
                        "FAILED: node\(member) holds node\(node)'s write to key \(write.key) at \(write.stamp), made after "
                            + "its removal by node\(signer) (\(line); fences: \(Self.describe(fence)))"
                    )
                    throw ExitCode(1)
                }
            }
        }
        // No remaining member holds anything of a fenced site beyond its fence, whoever wrote it.
        for (member, store) in remaining {
            let vector = try store.versionVector()
            for (site, line) in fence where vector[site] > line {
                print("FAILED: node\(member) claims \(site.hex.prefix(8)):\(vector[site]) beyond its fence \(line)")
                throw ExitCode(1)
            }
            for key in Int64(0)..<12 {
                guard let state = try store.rowState(table: "t", primaryKey: [.integer(key)]) else { continue }
                for dot in state.dots {
                    if let line = fence[dot.site], dot.seq > line {
                        print("FAILED: node\(member)'s row \(key) holds \(dot), beyond its site's fence \(line)")
                        throw ExitCode(1)
                    }
                }
            }
        }
        let summary =
            "node\(node) removed by node\(signer) (fences \(Self.describe(fence))): \(before) of its writes counted, "
            + "\(beyond) made beyond the line are on no remaining member"
            + (unseen > 0 ? ", \(unseen) made before it reached no one" : "")
        return (kept, summary)
    }

    static func describe(_ fences: [SiteID: UInt64]) -> String {
        fences.isEmpty
            ? "none" : fences.sorted { $0.key.hex < $1.key.hex }.map { "\($0.key.hex.prefix(8)):\($0.value)" }.joined(separator: ", ")
    }
}
