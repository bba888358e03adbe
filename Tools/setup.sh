#!/usr/bin/env bash
# Installs what Shoal needs on Debian (idempotent). Runs as root, or uses sudo.
set -euo pipefail

packages=(libsqlite3-dev sqlite3 libavahi-compat-libdnssd-dev avahi-daemon avahi-utils dbus libnss-mdns)
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
