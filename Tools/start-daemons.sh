#!/usr/bin/env bash
# Starts the system D-Bus and the Avahi daemon where no init system does (idempotent: a running daemon is
# left alone). mDNS discovery needs both; nodes still run without them, with static peers only.
set -u
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
# Whether a live (not zombie) process has this name: a killed daemon may linger as a zombie.
running() { ps -C "$1" -o stat= 2>/dev/null | grep -qv '^Z'; }
if ! running dbus-daemon; then
    $sudo mkdir -p /run/dbus
    # A killed dbus-daemon leaves its pid file and socket behind, and the next start fails until they go.
    $sudo rm -f /run/dbus/pid /run/dbus/system_bus_socket
    $sudo dbus-daemon --system --fork
fi
if ! running avahi-daemon; then
    # Likewise for a killed avahi-daemon.
    $sudo rm -f /run/avahi-daemon/pid /run/avahi-daemon/socket
    $sudo avahi-daemon -D 2>/dev/null || $sudo avahi-daemon -D --no-drop-root
fi
# Wait (bounded) until the daemon answers on D-Bus.
for _ in $(seq 1 50); do
    avahi-browse -at -p >/dev/null 2>&1 && exit 0
    sleep 0.1
done
echo "the Avahi daemon did not come up; mDNS discovery will be off" >&2
exit 1
