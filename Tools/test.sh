#!/usr/bin/env bash
# Runs every Shoal test: installs what is missing, builds, runs both demos as smoke tests, then the suite.
# Each step prints its wall time as it ends, and the run its total.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
started=$SECONDS
step() {
    local name=$1 began=$SECONDS
    shift
    "$@"
    echo "== $name: $((SECONDS - began)) s (run so far: $((SECONDS - started)) s)" >&2
}
step "setup" "$root/Tools/setup.sh" --tests
# The mDNS tests need the daemons; they fail loudly (they do not skip) if these could not start.
step "daemons" "$root/Tools/start-daemons.sh"
# The relay's PostgreSQL tests use a server of the run's own (loopback only, a throwaway data directory); they fail
# loudly if it could not start.
SHOAL_TEST_POSTGRES_URL=$("$root/Tools/start-postgres.sh" | tail -n 1)
export SHOAL_TEST_POSTGRES_URL
build() { swift build --build-tests 2>&1 | tail -n 3; }
step "build (with the tests)" build
# The docs: every relative link in README.md, CHANGELOG.md and docs/ resolves, and the README's quick start runs
# (in a fresh temporary directory, with the shoal just built first on PATH).
step "docs: links and the quick start" python3 "$root/Tools/check-quickstart.py" "$root/.build/debug/shoal"
# Everything is built: the demos neither set up nor build again.
export SHOAL_DEMO_BUILT=1
step "offline demo" env SHOAL_DEMO_QUIET=1 "$root/Tools/offline-demo.sh"
step "live demo" "$root/.build/debug/shoal" demo --nodes 3 --writes 50
# The demo's dashboard in a real browser (Debian's headless chromium, driven by selenium): cards, colours, a partition
# and its heal through the page's controls, propagation against the demo's own figures; it fails loudly if chromium,
# chromium-driver or selenium is missing. The screenshot of the converged page goes to the run's output directory.
output=${SHOAL_TEST_OUTPUT:-$root/.build/test-output}
step "dashboard in a browser" python3 "$root/Tools/dashboard-test.py" "$root/.build/debug/shoal" "$output"
step "chaos" "$root/.build/debug/shoal-chaos" --nodes 4 --seconds 6
# Deletes collected with a horizon: one node is cut off for three horizons while the others collect without it; back,
# it takes a fresh state, and nothing collected comes back.
step "chaos past the gc horizon" "$root/.build/debug/shoal-chaos" --horizon-ms 1500 --nodes 4 --seconds 6
# The relay path: the nodes never meet; the relay is killed (-9) at random, loses its storage, is restored from an
# older copy (across a key rotation), and tampers with pull answers; a member is removed during the run.
step "chaos through a hostile relay" "$root/.build/debug/shoal-chaos" --relay-hostile --nodes 4 --seconds 6
# The same on PostgreSQL: two relay instances on one database, one of them killed (-9) at random.
step "chaos through relays on PostgreSQL" \
    "$root/.build/debug/shoal-chaos" --postgres "$SHOAL_TEST_POSTGRES_URL" --nodes 4 --seconds 6
# Two hosts on one machine (network namespaces on a veth link): discovery and convergence across the link.
if unshare --net --mount --uts true 2>/dev/null || sudo -n unshare --net --mount --uts true 2>/dev/null; then
    step "two-host demo" env SHOAL_NETNS=shoaldemo "$root/Tools/netns.sh" demo "$root/.build/debug/shoal"
else
    echo "NOTE: this machine does not allow network namespaces: the two-host demo and tests do not run" >&2
fi
# Two groups of nodes that never meet converge through a relay, also after one group was offline.
relay_demo() { SHOAL_DEMO_QUIET=1 "$root/Tools/relay-demo.sh" >/dev/null; }
step "relay demo" relay_demo
# The relay against its API description (/openapi.json): no server error, no answer the document does not allow.
step "schemathesis" "$root/Tools/schemathesis.sh" "$root/.build/debug/shoal"
# The in-process tests include FuzzCorpusTests, which replays every committed fuzz input (Tools/Fuzz/Corpus) through
# the harnesses; the coverage-guided campaigns need a release build of their own and run apart (Tools/fuzz.sh).
step "tests" swift test --skip-build --skip ShoalRelayTests
# The relay's process tests (each a relay and up to five nodes, one test at a time) run on their own, after the rest:
# beside the in-process tests they would starve those of the machine's two cores.
step "relay tests" swift test --skip-build --filter ShoalRelayTests
echo "== all passed in $((SECONDS - started)) s" >&2
