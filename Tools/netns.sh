#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, each with its own hostname, D-Bus
# and Avahi daemon, so mDNS discovery between them goes over a real link exactly as between two machines.
#
#   Tools/netns.sh up                 create both hosts (idempotent: an existing pair is left alone)
#   Tools/netns.sh run a|b CMD ...    run CMD on host a or b (its network, hostname and /run/{dbus,avahi-daemon})
#   Tools/netns.sh down               stop everything started on both hosts and remove them
#   Tools/netns.sh demo [SHOAL]       up, one `shoal serve` on each host, no address given to either; prints
#                                     the time from starting the second node to its first sync, checks that
#                                     both converge, then down (SHOAL_NETNS_RIGHT_AWAY=1: start the second node
#                                     at once, without waiting for the first to be announced)
#
# Needs root (or sudo), iproute2 and util-linux. The only addresses used are the ones assigned here, inside the
# two namespaces (10.77.0.1/24 and 10.77.0.2/24, plus the link's own IPv6 link-local addresses); nothing is
# routed anywhere else. SHOAL_NETNS (default "shoal") prefixes every name, so tests can run a pair of their own.
set -euo pipefail

prefix="${SHOAL_NETNS:-shoal}"
state="/run/${prefix}-hosts"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

address() { [ "$1" = a ] && echo 10.77.0.1 || echo 10.77.0.2; }
holder() { cat "$state/$1.pid" 2>/dev/null; }

alive() {
    local pid
    pid="$(holder "$1")" || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

host_up() {
    local host="$1" ns="${prefix}-$1"
    alive "$host" && return 0
    $sudo mkdir -p "$state"
    # The holder keeps a private mount namespace (own /run/dbus and /run/avahi-daemon) and UTS namespace (own
    # hostname, so the two Avahi daemons do not claim the same host name) alive inside the network namespace;
    # everything else enters it with nsenter.
    # The holder and the daemons outlive this script, so they must not keep the caller's descriptors open
    # (a caller waiting for this script's output, or for its exit, would wait for them too).
    (
        for fd in $(ls /proc/$BASHPID/fd); do
            [ "$fd" -gt 2 ] && eval "exec $fd>&-"
        done
        exec $sudo ip netns exec "$ns" unshare --mount --uts --propagation private --fork -- /bin/sh -c '
        set -e
        hostname "$1"
        mount -t tmpfs tmpfs /run/dbus
        mount -t tmpfs tmpfs /run/avahi-daemon
        mkdir -p /run/dbus/containers
        dbus-daemon --system --fork
        avahi-daemon -D --no-rlimits 2>/dev/null || avahi-daemon -D --no-drop-root --no-rlimits
        echo $$ > "$2"
        exec sleep infinity
    ' holder "$ns" "$state/$host.pid" </dev/null >"$state/$host.log" 2>&1
    ) &
    disown
    for _ in $(seq 1 100); do
        alive "$host" && break
        sleep 0.1
    done
    alive "$host" || { cat "$state/$host.log" >&2; echo "host $host did not start" >&2; exit 1; }
    # Wait (bounded) until this host's Avahi daemon answers on its D-Bus.
    for _ in $(seq 1 100); do
        run "$host" avahi-browse -at -p >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "the Avahi daemon of host $host did not come up" >&2
    exit 1
}

up() {
    local a="${prefix}-a" b="${prefix}-b"
    if ! $sudo ip netns list | grep -qw "$a"; then
        $sudo ip netns add "$a"
        $sudo ip netns add "$b"
        $sudo ip link add "${prefix}-va" netns "$a" type veth peer name "${prefix}-vb" netns "$b"
        $sudo ip -n "$a" addr add 10.77.0.1/24 dev "${prefix}-va"
        $sudo ip -n "$b" addr add 10.77.0.2/24 dev "${prefix}-vb"
        for ns in "$a" "$b"; do
            $sudo ip -n "$ns" link set lo up
        done
        $sudo ip -n "$a" link set "${prefix}-va" up
        $sudo ip -n "$b" link set "${prefix}-vb" up
    fi
    host_up a
    host_up b
}

run() {
    local host="$1"
    shift
    local pid
    pid="$(holder "$host")"
    # Absolute paths: the host's mount namespace may not resolve the caller's relative ones the same way.
    $sudo nsenter --target "$pid" --net --mount --uts -- "$@"
}

down() {
    for host in a b; do
        if alive "$host"; then
            # Everything started on the host (daemons, nodes) shares its network namespace: stop it all.
            for pid in $($sudo ip netns pids "${prefix}-$host" 2>/dev/null); do
                $sudo kill -9 "$pid" 2>/dev/null || true
            done
        fi
        $sudo ip netns del "${prefix}-$host" 2>/dev/null || true
    done
    $sudo rm -rf "$state"
}

demo() {
    local shoal
    shoal="$(readlink -f "${1:-.build/debug/shoal}")"
    [ -x "$shoal" ] || { echo "no shoal binary at $shoal (swift build first)" >&2; exit 1; }
    trap down EXIT
    down
    up
    local work
    work="$(mktemp -d)"
    # The folder goes after the nodes have stopped (they write into it until they do).
    demo_work="$work"
    trap 'down; rm -rf "$demo_work"' EXIT
    for host in a b; do
        "$shoal" init --db "$work/$host.db" --name "host-$host" >/dev/null
        "$shoal" sql --db "$work/$host.db" "CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)" >/dev/null
        "$shoal" replicate --db "$work/$host.db" notes >/dev/null
    done
    "$shoal" sql --db "$work/a.db" "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
        INSERT INTO notes (id, body) SELECT 'a-' || i, 'written on host a' FROM n" >/dev/null
    "$shoal" sql --db "$work/b.db" "INSERT INTO notes (id, body) VALUES ('b-1', 'written on host b')" >/dev/null
    run a "$shoal" serve --db "$work/a.db" --name host-a --listen "$(address a):7400" >"$work/a.log" 2>&1 &
    # The first node has registered once its own daemon lists it (unless SHOAL_NETNS_RIGHT_AWAY is set: then the
    # second node starts at once, while the first is still probing for its name).
    if [ -z "${SHOAL_NETNS_RIGHT_AWAY:-}" ]; then
        for _ in $(seq 1 100); do
            run a avahi-browse -pt _shoal._tcp 2>/dev/null | grep -q host-a && break
            sleep 0.1
        done
    fi
    # Host b joins host a's cluster across the link with an invite code made on a (peer links are mutual TLS).
    local code
    code="$("$shoal" invite --db "$work/a.db" | tail -n 1)"
    for _ in $(seq 1 100); do grep -q "listening on" "$work/a.log" && break; sleep 0.1; done
    run b "$shoal" join "$code" --db "$work/b.db" --peer "$(address a):7400" \
        || { cat "$work/a.log" >&2; echo "host b could not join host a's cluster" >&2; exit 1; }
    echo "host b joined host a's cluster with invite code $code"
    local started
    started="$(date +%s.%N)"
    run b "$shoal" serve --db "$work/b.db" --name host-b --listen "$(address b):7400" >"$work/b.log" 2>&1 &
    local synced=""
    for _ in $(seq 1 300); do
        if grep -q "synced" "$work/b.log"; then
            synced="$(date +%s.%N)"
            break
        fi
        sleep 0.01
    done
    [ -n "$synced" ] || { cat "$work/a.log" "$work/b.log" >&2; echo "host b never synced with host a" >&2; exit 1; }
    printf 'second node to first sync across the veth link: %.2f s\n' "$(awk "BEGIN { print $synced - $started }")"
    local digest_a digest_b
    for _ in $(seq 1 100); do
        digest_a="$("$shoal" digest --db "$work/a.db")"
        digest_b="$("$shoal" digest --db "$work/b.db")"
        [ "$digest_a" = "$digest_b" ] && break
        sleep 0.1
    done
    [ "$digest_a" = "$digest_b" ] || { echo "the two hosts did not converge" >&2; exit 1; }
    sed 's/^/host b: /' "$work/b.log"
    echo "both hosts: $(echo "$digest_a" | tr '\n' ' ')"
    echo "converged over mDNS across two network namespaces"
}

command="${1:-}"
shift || true
case "$command" in
    up) up ;;
    run)
        # exec, so the caller's process is the command itself (signals reach it directly).
        alive "${1:-}" || { echo "host ${1:-?} is not up (Tools/netns.sh up)" >&2; exit 1; }
        pid="$(holder "$1")"
        shift
        exec $sudo nsenter --target "$pid" --net --mount --uts -- "$@"
        ;;
    down) down ;;
    demo) demo "$@" ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
