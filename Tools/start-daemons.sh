#!/usr/bin/env bash
# Starts the system D-Bus and the Avahi daemon where no init system does (idempotent: a running daemon is
# left alone). mDNS discovery needs both; nodes still run without them, with static peers only.
set -u
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if ! pgrep -x dbus-daemon >/dev/null 2>&1 || [ ! -S /run/dbus/system_bus_socket ]; then
    $sudo mkdir -p /run/dbus
    # A killed dbus-daemon leaves its pid file behind, and the next start fails until it is removed.
    $sudo rm -f /run/dbus/pid
    $sudo dbus-daemon --system --fork
fi
if ! pgrep -x avahi-daemon >/dev/null 2>&1; then
    $sudo avahi-daemon -D 2>/dev/null || $sudo avahi-daemon -D --no-drop-root
fi
# Wait (bounded) until the daemon answers on D-Bus.
for _ in $(seq 1 50); do
    avahi-browse -at -p >/dev/null 2>&1 && exit 0
    sleep 0.1
done
echo "the Avahi daemon did not come up; mDNS discovery will be off" >&2
exit 1
