#!/usr/bin/env bash
# Starts a PostgreSQL server of Shoal's own for the relay's tests, demos and benchmarks (idempotent: a server already
# running in the data directory is left alone), on loopback only, with no init system; prints its URL (last line).
#
#   Tools/start-postgres.sh            data in $SHOAL_PG_DIR (default /tmp/shoal-postgres), port $SHOAL_PG_PORT (54329)
#   Tools/start-postgres.sh --stop     stops that server
#
# It runs with synchronous_commit=off, like the embedded relay's SQLite (WAL, synchronous=NORMAL): a commit is durable
# once its WAL is flushed, a moment later. It trusts local connections (loopback only, a throwaway data directory):
# never point it at real data.
# Installs Debian's postgresql package when it is missing.
set -euo pipefail
dir=${SHOAL_PG_DIR:-/tmp/shoal-postgres}
port=${SHOAL_PG_PORT:-54329}
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "installing: postgresql" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2
    bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

# PostgreSQL refuses to run as root: as root, it runs as the postgres account the Debian package made.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [ "${1:-}" = "--stop" ]; then
    [ -f "$dir/data/postmaster.pid" ] && as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    exit 0
fi

mkdir -p "$dir"
[ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_owner "$bindir/initdb" -D "$dir/data" -U shoal --auth=trust -E UTF8 --no-sync >/dev/null
fi
if ! as_owner "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    # A killed server leaves its pid file behind; pg_ctl start copes with a stale one.
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c synchronous_commit=off" \
        start >/dev/null
fi
for _ in $(seq 1 100); do
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" && break
    sleep 0.1
done
"$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" || { echo "PostgreSQL did not come up; see $dir/server.log" >&2; exit 1; }
if ! "$bindir/psql" -h 127.0.0.1 -p "$port" -U shoal -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'shoal'" | grep -q 1; then
    "$bindir/psql" -h 127.0.0.1 -p "$port" -U shoal -d postgres -qc "CREATE DATABASE shoal" >/dev/null
fi
echo "postgres://shoal@127.0.0.1:$port/shoal?sslmode=disable"
