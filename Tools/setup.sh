#!/usr/bin/env bash
# Installs what Shoal needs on Debian (idempotent). Runs as root, or uses sudo.
#   Tools/setup.sh           what building and running need
#   Tools/setup.sh --tests   also what the tests need: iproute2 (network namespaces for the two-host tests),
#                            openssl (an outside TLS client), python-zeroconf from PyPI (an independent mDNS
#                            implementation), schemathesis from PyPI (checks the relay against its API description;
#                            both at the versions pinned in Tools/requirements-tests.txt),
#                            postgresql (the relay's PostgreSQL storage; Tools/start-postgres.sh runs a server of its
#                            own), curl, and Debian's chromium with chromium-driver (the dashboard's browser test,
#                            driven by selenium from PyPI)
set -euo pipefail

packages=(libsqlite3-dev sqlite3 zlib1g-dev libavahi-compat-libdnssd-dev avahi-daemon avahi-utils dbus libnss-mdns)
tests=""
if [ "${1:-}" = "--tests" ]; then
    tests=1
    packages+=(iproute2 util-linux python3 python3-pip openssl postgresql curl chromium chromium-driver)
fi
missing=()
for package in "${packages[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "installing: ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
fi
command -v swift >/dev/null || { echo "Swift 6 is required (swift not found on PATH)" >&2; exit 1; }
if [ -n "$tests" ]; then
    # The PyPI packages at the versions the tests were run with (Tools/requirements-tests.txt): installed when any
    # is missing or at another version.
    requirements="$(cd "$(dirname "$0")" && pwd)/requirements-tests.txt"
    if ! python3 - "$requirements" <<'PYTHON'
import importlib.metadata, sys
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            print(f"{name}: {installed or 'not installed'}, tested with {version}", file=sys.stderr)
            sys.exit(1)
PYTHON
    then
        echo "installing the tests' PyPI packages (Tools/requirements-tests.txt)" >&2
        # Debian's own Python refuses system-wide pip installs unless told otherwise (PEP 668).
        python3 -m pip install --quiet -r "$requirements" 2>/dev/null \
            || python3 -m pip install --quiet --break-system-packages -r "$requirements"
    fi
fi
