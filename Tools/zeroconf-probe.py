#!/usr/bin/env python3
"""An independent mDNS implementation (python-zeroconf) facing Shoal nodes, for the interoperability tests.

    zeroconf-probe.py browse --interface ADDR --site HEX [--timeout S]
        Waits until a _shoal._tcp service whose TXT has site=HEX is resolved, prints it as one line "found JSON"
        (instance, addresses, port, txt) and exits 0 at once; exits 1 if none is resolved by the timeout (a deadline,
        60 s unless given). Other output (warnings on standard error) may come before or after that line.

    zeroconf-probe.py publish --interface ADDR --service SITE:HINT [--service ...] [--timeout S]
        For each service, listens on a free TCP port of ADDR and publishes _shoal._tcp there with TXT
        site/hint/proto. Prints "published SITE PORT" per service, then "dialled SITE" the first time
        something connects to that service's port, and "received SITE N FIRST" with how many bytes the caller
        sent within a second and the first of them, in decimal (22: a TLS handshake record). Runs until killed or the
        timeout.

Multicast needs a real link (the loopback interface has none), so the tests run this inside the network
namespaces of Tools/netns.sh, bound to the address given there.
"""

import argparse
import json
import queue
import selectors
import signal
import socket
import sys
import threading
import time

from zeroconf import ServiceBrowser, ServiceInfo, ServiceListener, Zeroconf

SERVICE_TYPE = "_shoal._tcp.local."


def say(line: str) -> None:
    print(line, flush=True)


def browse(arguments: argparse.Namespace) -> int:
    # The listener only queues names: resolving (a blocking query) happens here, retried until the deadline, so a
    # query that times out on a busy machine is asked again instead of losing the service for good.
    zeroconf = Zeroconf(interfaces=[arguments.interface])
    names: "queue.Queue[str]" = queue.Queue()

    class Listener(ServiceListener):
        def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.put(name)

        def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            names.put(name)

        def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
            pass

    deadline = time.monotonic() + arguments.timeout
    found = None
    browser = ServiceBrowser(zeroconf, SERVICE_TYPE, Listener())
    try:
        pending: list[str] = []
        while found is None and time.monotonic() < deadline:
            try:
                name = names.get(timeout=0.2 if pending else max(0.0, deadline - time.monotonic()))
                if name not in pending:
                    pending.append(name)
            except queue.Empty:
                pass
            for name in list(pending):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                info = zeroconf.get_service_info(SERVICE_TYPE, name, timeout=int(min(left, 3.0) * 1000))
                if info is None:
                    continue  # not answered yet: asked again on the next turn
                pending.remove(name)
                txt = {key.decode(): (value or b"").decode() for key, value in info.properties.items()}
                if txt.get("site") == arguments.site:
                    found = {
                        "instance": name[: -len(SERVICE_TYPE) - 1],
                        "addresses": info.parsed_addresses(),
                        "port": info.port,
                        "txt": txt,
                    }
                    break
    finally:
        browser.cancel()
        zeroconf.close()
    if found is None:
        print(f"no _shoal._tcp service with site={arguments.site} within {arguments.timeout} s", file=sys.stderr)
        return 1
    say("found " + json.dumps(found, sort_keys=True))
    return 0


def stop(*_) -> None:
    raise KeyboardInterrupt


def publish(arguments: argparse.Namespace) -> int:
    # Stopped with SIGTERM: unregister (mDNS goodbye packets) on the way out. A parent may have left the signal
    # blocked in the mask we inherited (test runners do), so unblock it too.
    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM, signal.SIGINT])
    zeroconf = Zeroconf(interfaces=[arguments.interface])
    selector = selectors.DefaultSelector()
    infos = []
    for service in arguments.service:
        site, hint = service.split(":", 1)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((arguments.interface, 0))
        listener.listen()
        port = listener.getsockname()[1]
        selector.register(listener, selectors.EVENT_READ, site)
        info = ServiceInfo(
            SERVICE_TYPE,
            f"zeroconf {hint[:8]} {site[-4:]}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(arguments.interface)],
            port=port,
            properties={"site": site, "hint": hint, "proto": "1"},
            server=f"zeroconf-{site[-4:]}.local.",
        )
        zeroconf.register_service(info)
        infos.append(info)
        say(f"published {site} {port}")
    dialled = set()
    deadline = time.monotonic() + arguments.timeout
    try:
        while time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                connection, _ = key.fileobj.accept()
                connection.settimeout(1.0)
                received = b""
                try:
                    while len(received) < 65536:
                        chunk = connection.recv(4096)
                        if not chunk:
                            break
                        received += chunk
                except OSError:
                    pass
                connection.close()
                if key.data not in dialled:
                    dialled.add(key.data)
                    say(f"dialled {key.data}")
                    first = received[0] if received else -1
                    say(f"received {key.data} {len(received)} {first}")
    except KeyboardInterrupt:
        pass
    finally:
        for info in infos:
            zeroconf.unregister_service(info)
        zeroconf.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    browsing = commands.add_parser("browse")
    browsing.add_argument("--interface", required=True)
    browsing.add_argument("--site", required=True)
    browsing.add_argument("--timeout", type=float, default=60)
    publishing = commands.add_parser("publish")
    publishing.add_argument("--interface", required=True)
    publishing.add_argument("--service", action="append", required=True, help="SITE:CLUSTER")
    publishing.add_argument("--timeout", type=float, default=120)
    arguments = parser.parse_args()
    return browse(arguments) if arguments.command == "browse" else publish(arguments)


if __name__ == "__main__":
    sys.exit(main())
