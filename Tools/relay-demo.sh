#!/usr/bin/env bash
# Shoal's relay demo: a relay and two groups of nodes that cannot reach each other (no mDNS, no peers across
# groups; each group is a LAN of its own on loopback) converge through the relay. Only one node per group knows
# the relay. Then one group goes offline, both groups write, it comes back, and everything converges again.
# The digests are printed side by side; exit status 0 only if they all match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# SHOAL_DEMO_BUILT=1 (the test command, which has set up and built everything already): neither again.
if [ -z "${SHOAL_DEMO_BUILT:-}" ]; then
    "$root/Tools/setup.sh"
    swift build --product shoal 2>&1 | tail -n 1 >&2
fi
shoal="$root/.build/debug/shoal"
dir=${SHOAL_DEMO_DIR:-$(mktemp -d /tmp/shoal-relay-demo.XXXXXX)}
mkdir -p "$dir"
rm -rf "$dir"/*.db* "$dir"/relay "$dir"/*.log
# Shop "harbour" (two tills on one LAN) and shop "hilltop" (two tills on another), in different cities.
nodes=(harbour1 harbour2 hilltop1 hilltop2)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

say() { if [ -t 1 ]; then printf '\n\033[1m== %s\033[0m\n' "$*"; else printf '\n== %s\n' "$*"; fi; }
sql() { "$shoal" sql --db "$dir/$1.db" "$2"; }
digest() { "$shoal" digest --db "$dir/$1.db" | tail -n 1; }
wait_line() { # FILE PATTERN: waits (up to 30 s) for a line in a log, prints it
    for _ in $(seq 1 300); do
        if grep -m1 "$2" "$1" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "timed out waiting for '$2' in $1" >&2
    return 1
}
converged() { # NODES...: waits (up to 60 s) until every node's digest is the same, then prints them side by side
    for _ in $(seq 1 600); do
        local first="" same=1
        for node in "$@"; do
            local d
            d=$(digest "$node")
            [ -z "$first" ] && first=$d
            [ "$d" = "$first" ] || same=0
        done
        if [ $same = 1 ]; then
            for node in "$@"; do printf '  %-9s %s  rows %s\n' "$node" "$(digest "$node")" "$(sql "$node" "SELECT count(*) FROM sales" | tail -n 1 | tr -d ' ')"; done
            return 0
        fi
        sleep 0.1
    done
    echo "FAILED: the digests never matched:" >&2
    for node in "$@"; do printf '  %-9s %s\n' "$node" "$(digest "$node")" >&2; done
    return 1
}
serve() { # NODE [extra arguments]: starts a node in the background, waits until it listens, records its port
    local node=$1
    shift
    "$shoal" serve --db "$dir/$node.db" --name "$node" --no-mdns --no-remembered "$@" \
        >"$dir/$node.out" 2>>"$dir/$node.log" &
    pids+=($!)
    eval "pid_$node=$!"
    local line
    line=$(wait_line "$dir/$node.out" "^listening on ")
    eval "port_$node=${line##*:}"
}

say "A relay on loopback (plain HTTP is allowed on loopback only; give it --tls-cert/--tls-key elsewhere)"
"$shoal" relay serve --data "$dir/relay" --listen 127.0.0.1:0 >"$dir/relay.out" 2>"$dir/relay.log" &
pids+=($!)
relay_line=$(wait_line "$dir/relay.out" "^relay listening on ")
url=${relay_line#relay listening on }
echo "relay at $url (data in $dir/relay)"

say "Four tills in one cluster: harbour1 founds it, the others join with invite codes"
for node in "${nodes[@]}"; do
    "$shoal" init --db "$dir/$node.db" --name "$node" >/dev/null
    sql "$node" "CREATE TABLE sales(id TEXT PRIMARY KEY, till TEXT, item TEXT, amount REAL)"
    "$shoal" replicate --db "$dir/$node.db" sales >/dev/null
done
for node in harbour2 hilltop1 hilltop2; do
    code=$("$shoal" invite --db "$dir/harbour1.db" 2>/dev/null | tail -n 1)
    "$shoal" join "$code" --db "$dir/$node.db" --member-db "$dir/harbour1.db" 2>&1 | head -n 1
done
cluster=$("$shoal" status --db "$dir/harbour1.db" | awk '/^cluster:/ {print $2}')
token=$("$shoal" relay token create --data "$dir/relay" --cluster "$cluster" 2>/dev/null | tail -n 1)
echo "$token" >"$dir/relay.token"
chmod 600 "$dir/relay.token"
echo "a relay token for cluster $cluster (in $dir/relay.token)"

say "Each shop is a LAN of its own; only harbour1 and hilltop1 know the relay"
serve harbour1 --relay "$url" --relay-token-file "$dir/relay.token"
serve harbour2 --peer "127.0.0.1:$port_harbour1"
serve hilltop1 --relay "$url" --relay-token-file "$dir/relay.token"
serve hilltop2 --peer "127.0.0.1:$port_hilltop1"
echo "harbour1 :$port_harbour1  harbour2 :$port_harbour2  (a LAN)"
echo "hilltop1 :$port_hilltop1  hilltop2 :$port_hilltop2  (another LAN)"

say "Every till sells something"
for node in "${nodes[@]}"; do
    sql "$node" "INSERT INTO sales VALUES ('$node-1', '$node', 'rope', 12.5), ('$node-2', '$node', 'chart', 30)"
done
converged "${nodes[@]}"

say "hilltop loses its connection (both tills stop); both shops keep selling"
kill "$pid_hilltop1" "$pid_hilltop2"
wait "$pid_hilltop1" "$pid_hilltop2" 2>/dev/null || true
for node in harbour1 harbour2; do sql "$node" "INSERT INTO sales VALUES ('$node-3', '$node', 'lantern', 45)"; done
sql harbour1 "UPDATE sales SET amount = 11.0 WHERE id = 'hilltop1-1'"
for node in hilltop1 hilltop2; do sql "$node" "INSERT INTO sales VALUES ('$node-3', '$node', 'flare', 3.5)"; done
sql hilltop2 "DELETE FROM sales WHERE id = 'harbour2-2'"
echo "while apart:"
for node in "${nodes[@]}"; do printf '  %-9s %s\n' "$node" "$(digest "$node")"; done

say "hilltop comes back"
serve hilltop1 --relay "$url" --relay-token-file "$dir/relay.token"
serve hilltop2 --peer "127.0.0.1:$port_hilltop1"
converged "${nodes[@]}"

say "harbour updates its till app: a new column (payment); hilltop's app is not updated yet and keeps selling"
sql harbour1 "ALTER TABLE sales ADD COLUMN payment TEXT DEFAULT 'cash'"
sql harbour1 "INSERT INTO sales(id, till, item, amount, payment) VALUES ('harbour1-4', 'harbour1', 'compass', 80, 'card')"
sql hilltop2 "INSERT INTO sales(id, till, item, amount) VALUES ('hilltop2-4', 'hilltop2', 'bucket', 6)"
converged "${nodes[@]}"
echo "the column reached every till (through the relay too), in order with the sales; old and new sales alike:"
sql hilltop2 "SELECT id, payment FROM sales WHERE id IN ('harbour1-4', 'hilltop2-4') ORDER BY id"
"$shoal" status --db "$dir/hilltop2.db" | grep '^schema:'
echo
"$shoal" status --db "$dir/harbour1.db" | grep -A2 '^relay:'
echo
echo "the relay holds sealed change sets only: $(sqlite3 "$dir/relay/relay.sqlite" 'SELECT count(*) FROM chunks') chunks, \
$(sqlite3 "$dir/relay/relay.sqlite" 'SELECT count(DISTINCT site) FROM ranges') sites"
if grep -rqa "lantern" "$dir/relay"; then
    echo "FAILED: the relay's files hold a value in clear" >&2
    exit 1
fi
if grep -rqa "payment" "$dir/relay"; then
    echo "FAILED: the relay's files hold the new column's name in clear" >&2
    exit 1
fi
echo "no value of the table, and not the new column's name, appears in the relay's files"
