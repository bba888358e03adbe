#!/usr/bin/env bash
# Shoal's main demo: N live nodes (`shoal serve` processes) on this machine write at once and converge.
# Arguments go to `shoal demo` (try --nodes 8 --writes 1000). Exit status 0 only if all digests match.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/Tools/setup.sh"
"$root/Tools/start-daemons.sh" || true  # without them the demo still runs, on static peers
cd "$root"
swift build --product shoal 2>&1 | tail -n 1 >&2
exec "$root/.build/debug/shoal" demo "$@"
