#!/usr/bin/env bash
# Shoal's offline demo: three databases on this machine make concurrent, conflicting writes and deletes,
# exchange changes with `shoal changes | shoal apply` (no network at all), and end with identical digests.
# Exit status 0 only if all three digests match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# SHOAL_DEMO_BUILT=1 (the test command, which has set up and built everything already): neither again.
if [ -z "${SHOAL_DEMO_BUILT:-}" ]; then
    "$root/Tools/setup.sh"
    swift build --product shoal 2>&1 | tail -n 1 >&2
fi
shoal="$root/.build/debug/shoal"
dir=${SHOAL_DEMO_DIR:-$(mktemp -d /tmp/shoal-demo.XXXXXX)}
mkdir -p "$dir"
rm -f "$dir"/*.db "$dir"/*.db-wal "$dir"/*.db-shm
nodes=(lisbon oslo quito)
quiet=${SHOAL_DEMO_QUIET:-}

say() { if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi; }
sql() { "$shoal" sql --db "$dir/$1.db" "$2"; }
sync_pair() {
    printf '%-7s -> %-7s ' "$1" "$2"
    "$shoal" changes --db "$dir/$1.db" | "$shoal" apply --db "$dir/$2.db" 2>/dev/null
}

say "Three nodes, each with its own SQLite file in $dir"
for node in "${nodes[@]}"; do
    printf '%-7s site id ' "$node"
    "$shoal" init --db "$dir/$node.db" --name "$node"
    sql "$node" "CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY, name TEXT, price REAL, shelf TEXT, sold INTEGER DEFAULT 0)"
    "$shoal" replicate --db "$dir/$node.db" stock --counter sold >/dev/null
done

say "lisbon creates the catalogue; everyone syncs"
sql lisbon "INSERT INTO stock(sku, name, price, shelf) VALUES
    ('A1', 'anchor', 12.5, 'north'), ('B2', 'buoy', 7.0, 'north'), ('C3', 'compass', 30.0, 'east'),
    ('D4', 'deck brush', 4.25, 'west'), ('E5', 'ensign', 9.99, 'east')"
for target in oslo quito; do sync_pair lisbon "$target"; done

say "Offline, all three write at once"
echo "lisbon: reprices the anchor, sells 2 buoys, deletes the deck brush"
sql lisbon "UPDATE stock SET price = 13.0 WHERE sku = 'A1'; UPDATE stock SET sold = sold + 2 WHERE sku = 'B2'; DELETE FROM stock WHERE sku = 'D4'"
echo "oslo:   reprices the anchor too (a conflict), moves it to another shelf (a different column: both survive),"
echo "        sells 3 buoys (counters add up), and edits the deck brush lisbon is deleting (the delete wins)"
sql oslo "UPDATE stock SET price = 14.0, shelf = 'south' WHERE sku = 'A1'; UPDATE stock SET sold = sold + 3 WHERE sku = 'B2'; UPDATE stock SET price = 5.0 WHERE sku = 'D4'"
echo "quito:  adds a flare, renames the compass, sells 1 buoy, in one transaction"
sql quito "BEGIN; INSERT INTO stock(sku, name, price, shelf) VALUES ('F6', 'flare', 3.5, 'west'); UPDATE stock SET name = 'brass compass' WHERE sku = 'C3'; UPDATE stock SET sold = sold + 1 WHERE sku = 'B2'; COMMIT"

if [ -z "$quiet" ]; then
    for node in "${nodes[@]}"; do echo "-- $node before exchanging"; sql "$node" "SELECT * FROM stock ORDER BY sku"; done
fi

say "Exchange changes, every pair both ways, with shoal changes | shoal apply"
for from in "${nodes[@]}"; do
    for to in "${nodes[@]}"; do
        [ "$from" = "$to" ] || sync_pair "$from" "$to"
    done
done

say "Every node now holds"
for node in "${nodes[@]}"; do echo "-- $node"; sql "$node" "SELECT * FROM stock ORDER BY sku"; done
[ -z "$quiet" ] && { echo "-- conflicts seen by oslo"; "$shoal" conflicts --db "$dir/oslo.db"; }

say "Digests side by side"
declare -A digests
for node in "${nodes[@]}"; do
    digests[$node]=$("$shoal" digest --db "$dir/$node.db" | tail -n 1)
    printf '%-7s %s\n' "$node" "${digests[$node]}"
done
if [ "${digests[lisbon]}" = "${digests[oslo]}" ] && [ "${digests[oslo]}" = "${digests[quito]}" ]; then
    echo "converged: all three digests match"
else
    echo "NOT converged: digests differ" >&2
    exit 1
fi
