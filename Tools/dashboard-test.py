#!/usr/bin/env python3
"""The dashboard in a real browser: Debian's chromium, headless, driven by selenium through chromium-driver.

Starts `shoal demo --nodes 3 --dashboard 127.0.0.1:0` (a free port), loads the page, and checks that it shows three
cards in one colour once the nodes converge, with no console error; that the page's propagation figures agree with the
ones the demo printed within 10 %; that a browser resuming the event stream with Last-Event-ID gets the events after
it; then, through the page's own controls, it partitions node2 from every other node (pair by pair), writes a burst on
node2, and sees the colours split (node2 alone differs), heals, and sees one colour again; stops node1 and starts it
again, adds a column on node0, and sees every card follow. It saves a PNG screenshot of
the converged page in the output directory (dashboard.png; dashboard-healed.png at the end). Then `shoal serve --dashboard 127.0.0.1:0
--dashboard-token T` on a database of its own: a request without the token is refused (401), the page with it shows the
node's card, with no console error. Every wait has a deadline; exit status 0 only if every check passed.

    Tools/dashboard-test.py PATH_TO_SHOAL OUTPUT_DIRECTORY [NODES]
"""
import http.client
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def fail(message):
    print(f"dashboard test: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) not in (3, 4):
        fail("usage: Tools/dashboard-test.py PATH_TO_SHOAL OUTPUT_DIRECTORY [NODES]")
    shoal, output = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    nodes = int(sys.argv[3]) if len(sys.argv) == 4 else 3
    if nodes < 3:
        fail("the test needs 3 nodes at least")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            fail(f"{path} is missing: install Debian's {package} (Tools/setup.sh --tests does)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
    except ImportError:
        fail("selenium is missing: Tools/setup.sh --tests installs it (Tools/requirements-tests.txt)")
    os.makedirs(output, exist_ok=True)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="shoal-dashboard-test.")
    demo = subprocess.Popen(
        [shoal, "demo", "--nodes", str(nodes), "--writes", "40", "--dir", work, "--dashboard", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    lines, said = [], threading.Condition()

    def read():
        for line in demo.stdout:
            with said:
                lines.append(line.rstrip("\n"))
                said.notify_all()
        with said:
            lines.append(None)
            said.notify_all()

    threading.Thread(target=read, daemon=True).start()

    def wait_line(pattern, seconds):
        deadline = time.monotonic() + seconds
        with said:
            while True:
                for line in lines:
                    if line is None:
                        fail(f"the demo ended before printing /{pattern}/; it said:\n" + "\n".join(l for l in lines if l))
                    match = re.search(pattern, line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0:
                    fail(f"the demo did not print /{pattern}/ within {seconds} s; it said:\n" + "\n".join(lines))
                said.wait(left)

    driver = None
    try:
        url = wait_line(r"^dashboard: (http://\S+)", 60).group(1)
        printed = wait_line(r"propagation .*: p50 ([\d.]+) ms, p95 ([\d.]+) ms over (\d+) applies", 120)
        cli_p50, cli_p95, cli_samples = float(printed.group(1)), float(printed.group(2)), int(printed.group(3))
        print(f"dashboard test: demo at {url}; it printed propagation p50 {cli_p50} ms, p95 {cli_p95} ms ({cli_samples} applies)")

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1050", "--hide-scrollbars"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.get(url)

        def until(what, check, seconds=30):
            deadline = time.monotonic() + seconds
            while True:
                value = check()
                if value:
                    return value
                if time.monotonic() > deadline:
                    fail(f"{what}: not within {seconds} s")
                time.sleep(0.1)  # polling the page's DOM, with a deadline

        colours_js = "return [...document.querySelectorAll('#cards .card .swatch')].map(s => getComputedStyle(s).backgroundColor)"
        until(f"{nodes} cards", lambda: driver.execute_script("return document.querySelectorAll('#cards .card').length") == nodes)
        until("the page says converged", lambda: driver.find_element(By.ID, "converged").text == "converged")
        colours = driver.execute_script(colours_js)
        if len(set(colours)) != 1:
            fail(f"converged, yet the cards show {len(set(colours))} colours: {colours}")
        print(f"dashboard test: {nodes} cards, one colour ({colours[0]})")

        # The page's figures against the ones the demo printed: both from each node's own timing of its applies of
        # the app's change sets, the page's read as the nodes log them and sent over the event stream, the printed ones
        # read by the demo once it converged. Compared once the page counts as many applies as the demo printed (the
        # nodes' later writes of Shoal's own rows are not counted by either).
        def figure(element):
            value = driver.find_element(By.ID, element).get_attribute("data-ms")
            return float(value) if value else None

        def page_latency():
            return driver.execute_script(
                "const n = document.getElementById('latency-n').textContent.match(/\\d+/);"
                " return [document.getElementById('latency-p50').dataset.ms,"
                " document.getElementById('latency-p95').dataset.ms, n ? Number(n[0]) : 0]")
        counted = until(f"the page counts the {cli_samples} applies the demo printed",
                        lambda: (lambda p: p if p[2] == cli_samples and p[0] else None)(page_latency()), 15)
        page_p50, page_p95 = float(counted[0]), float(counted[1])
        for name, page, cli in (("p50", page_p50, cli_p50), ("p95", page_p95, cli_p95)):
            if abs(page - cli) > 0.10 * cli:
                fail(f"propagation {name}: the page shows {page:.1f} ms, the demo printed {cli:.1f} ms "
                     "(more than 10 % apart)")
        print(f"dashboard test: propagation on the page p50 {page_p50:.1f} ms, p95 {page_p95:.1f} ms over {cli_samples} "
              "applies: within 10 % of the figures the demo printed")
        shot = os.path.join(output, "dashboard.png")
        driver.save_screenshot(shot)
        print(f"dashboard test: screenshot of the converged page: {shot}")
        # A browser that reconnects with Last-Event-ID gets the events after it.
        last = int(driver.execute_script("return window.shoalDashboard.lastEventId"))
        host, port = re.match(r"http://([^/:]+):(\d+)/", url).groups()
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", "/events", headers={"Last-Event-ID": str(max(last - 1, 0))})
        response = connection.getresponse()
        if response.status != 200 or not response.getheader("content-type", "").startswith("text/event-stream"):
            fail(f"/events answered {response.status} {response.getheader('content-type')}")
        first_id = None
        while first_id is None:
            line = response.fp.readline().decode()
            if not line:
                fail("the event stream ended before an event")
            if line.startswith("id: "):
                first_id = int(line[4:])
        connection.close()
        if last > 1 and first_id != last:
            fail(f"resumed after event {last - 1}, the stream began at {first_id}, not {last}")
        print(f"dashboard test: resuming after event {max(last - 1, 0)} began at event {first_id}")

        def control(action, node, peer=""):
            Select(driver.find_element(By.ID, "node-a")).select_by_value(str(node))
            Select(driver.find_element(By.ID, "node-b")).select_by_value(str(peer))
            before = driver.find_element(By.ID, "message").text
            driver.find_element(By.ID, f"btn-{action}").click()
            until(f"the {action} control answered", lambda: driver.find_element(By.ID, "message").text not in (before, f"{action}…"), 20)
            message = driver.find_element(By.ID, "message").text
            print(f"dashboard test: {action}: {message}")
            if message.startswith("the control failed") or message.startswith("no "):
                fail(f"the {action} control failed: {message}")

        # The cards and links are drawn anew with each state: read them in one script, never through an element
        # that a later state may have replaced.
        def link_state(a, b):
            return driver.execute_script(
                "const l = document.querySelector(`#topology .link[data-a='${arguments[0]}'][data-b='${arguments[1]}']`);"
                " return l ? l.dataset.state : null", a, b)

        others = [index for index in range(nodes) if index != 2]
        for other in others:
            control("partition", 2, other)
        until("the links of node2 show partitioned",
              lambda: all(link_state(min(2, o), max(2, o)) == "partitioned" for o in others))
        if link_state(0, 1) == "partitioned":
            fail("the link node0-node1 shows partitioned; only node2's were cut")
        control("burst", 2)

        def split():
            colours = driver.execute_script(colours_js)
            rest = {colour for index, colour in enumerate(colours) if index != 2}
            return len(colours) == nodes and len(rest) == 1 and colours[2] not in rest
        until("the colours split (node2 alone differs) after the burst on a partitioned node2", split, 30)
        print("dashboard test: partitioned node2 from the others, wrote on node2: the colours split")
        control("heal", 2)
        until("one colour again after the heal", lambda: len(set(driver.execute_script(colours_js))) == 1
              and driver.find_element(By.ID, "converged").text == "converged", 30)
        until("the page shows how long the heal took", lambda: figure("heal") is not None, 10)
        print(f"dashboard test: healed: one colour again, converged {figure('heal'):.0f} ms after the heal")
        # A node stopped and started again, and a column added on another: the cards follow.
        def stopped(index):
            return driver.execute_script(
                "const c = document.querySelector(`#cards .card[data-node='${arguments[0]}']`);"
                " return c ? c.classList.contains('stopped') : null", index)
        control("stop", 1)
        until("node1's card shows it stopped", lambda: stopped(1) is True)
        control("start", 1)
        until("node1 running and converged again", lambda: stopped(1) is False
              and driver.find_element(By.ID, "converged").text == "converged", 30)
        control("add-column", 0)

        def schema_everywhere():
            values = driver.execute_script(
                "return [...document.querySelectorAll('#cards .card dt')].filter(d => d.textContent === 'schema')"
                ".map(d => d.nextElementSibling.textContent)")
            return len(values) == nodes and all(value.startswith("1") for value in values) \
                and driver.find_element(By.ID, "converged").text == "converged"
        until("every card at schema position 1 after the column was added, converged", schema_everywhere, 30)
        print("dashboard test: stopped and started node1, added a column on node0: every node follows")

        def tombstones():
            values = driver.execute_script(
                "return [...document.querySelectorAll('#cards .card dt')].filter(d => d.textContent === 'tombstones')"
                ".map(d => d.nextElementSibling.textContent)")
            return [int(value) if value.isdigit() else None for value in values]
        def rows():
            return driver.execute_script(
                "return [...document.querySelectorAll('#cards .card dt')].filter(d => d.textContent === 'rows')"
                ".map(d => d.nextElementSibling.textContent)")
        rows_before = rows()
        control("delete-rows", 0)
        until("every card shows fewer rows after deleting rows on node0",
              lambda: len(set(rows())) == 1 and rows()[0].isdigit() and rows_before[0].isdigit()
              and int(rows()[0]) < int(rows_before[0]), 30)
        rows_after = rows()
        # Every member holds the deletes, then every member collects them: the tombstones fall to 0 on every card,
        # and the cards are one colour again.
        until("every card at 0 tombstones after deleting rows, converged, one colour",
              lambda: len(tombstones()) == nodes and all(value == 0 for value in tombstones())
              and driver.find_element(By.ID, "converged").text == "converged"
              and len(set(driver.execute_script(colours_js))) == 1, 60)
        print(f"dashboard test: deleted rows on node0: rows {rows_before[0]} -> {rows_after[0]} on every card, "
              "tombstones 0 everywhere once every member held the deletes, one colour")
        # The rows themselves, read outside Shoal (Python's sqlite3, read-only): the same on every node.
        contents = [read_rows(os.path.join(work, f"node{index}.db")) for index in range(nodes)]
        if any(content != contents[0] for content in contents):
            fail("the nodes' stock tables differ, read with sqlite3: "
                 + "; ".join(f"node{index}: {len(content[1])} rows" for index, content in enumerate(contents)))
        # A card counts the rows of the app's replicated tables (the demo's stock table), not Shoal's own (the roster).
        if str(len(contents[0][1])) != rows_after[0]:
            fail(f"sqlite3 reads {len(contents[0][1])} rows of stock, the cards show {rows_after[0]} rows")
        print(f"dashboard test: sqlite3 reads the same {len(contents[0][1])} stock rows and columns "
              f"({', '.join(contents[0][0])}) in every node's file")
        shot = os.path.join(output, "dashboard-healed.png")
        driver.save_screenshot(shot)
        print(f"dashboard test: screenshot of the page at the end: {shot}")

        errors = [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
        if errors:
            fail("console errors: " + "; ".join(entry.get("message", "") for entry in errors))
        print("dashboard test: no console errors on the demo's page")
        serve_dashboard(shoal, work, driver, until)
        serve_dashboard_tls(shoal, work)
    finally:
        if driver is not None:
            driver.quit()
        if demo.poll() is None and not stop(demo, signal.SIGINT, 30):
            print("dashboard test: the demo did not stop within 30 s of SIGINT", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    if demo.returncode != 0:
        fail(f"the demo exited with status {demo.returncode} after SIGINT")
    print(f"dashboard test: passed in {time.monotonic() - started:.1f} s")


def read_rows(path):
    """The stock table of the database at `path`, read with plain sqlite3 (read-only): its column names in order of
    name, and its rows with their values in that order (two nodes may hold added columns in another order)."""
    import sqlite3
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        names = sorted(row[1] for row in connection.execute("PRAGMA table_info(stock)"))
        quoted = ", ".join('"' + name.replace('"', '""') + '"' for name in names)
        rows = connection.execute(f"SELECT {quoted} FROM stock ORDER BY sku").fetchall()
        return names, rows
    finally:
        connection.close()


def serve_dashboard(shoal, work, driver, until):
    """`shoal serve --dashboard` with a token: refused without it, the node's card with it, no console error."""
    from selenium.webdriver.common.by import By
    database = os.path.join(work, "solo.db")
    subprocess.run([shoal, "init", "--db", database, "--name", "solo"], check=True, capture_output=True)
    token = "t0ken-for-the-test"
    node = subprocess.Popen(
        [shoal, "serve", "--db", database, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0",
         "--dashboard", "127.0.0.1:0", "--dashboard-token", token],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
    )
    try:
        said = queue.Queue()
        threading.Thread(target=lambda: [said.put(line) for line in node.stdout] + [said.put(None)], daemon=True).start()
        url, deadline = None, time.monotonic() + 30
        while url is None:  # the node prints where it listens, then where the dashboard does
            try:
                line = said.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                fail("shoal serve --dashboard did not print its URL within 30 s")
            if line is None:
                fail("shoal serve --dashboard ended before printing its URL")
            if line.startswith("dashboard: "):
                url = line.split(" ", 1)[1].strip()
        if not url.endswith("?token=" + token):
            fail(f"the printed URL does not carry the token: {url}")
        host, port = re.match(r"http://([^/:]+):(\d+)/", url).groups()
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", "/state")
        refused = connection.getresponse()
        refused.read()
        if refused.status != 401:
            fail(f"a request without the token got {refused.status}, not 401")
        driver.get_log("browser")  # what the demo's page logged is behind us
        driver.get(url)
        until("the node's card", lambda: driver.execute_script(
            "return [...document.querySelectorAll('#cards .card .name')].map(e => e.textContent)") == ["solo"])
        if driver.find_element(By.ID, "controls").is_displayed():
            fail("a node's dashboard shows the demo's controls")
        errors = [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]
        if errors:
            fail("console errors on the node's page: " + "; ".join(entry.get("message", "") for entry in errors))
        print("dashboard test: shoal serve --dashboard with a token: 401 without it, the node's card with it, no console errors")
    finally:
        stop(node)


def start_serve(shoal, database, extra):
    """`shoal serve` on `database` with `extra`; the process and the dashboard's URL, once it printed it."""
    node = subprocess.Popen(
        [shoal, "serve", "--db", database, "--no-mdns", "--no-remembered", "--listen", "127.0.0.1:0"] + extra,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
    )
    said = queue.Queue()
    threading.Thread(target=lambda: [said.put(line) for line in node.stdout] + [said.put(None)], daemon=True).start()
    deadline = time.monotonic() + 30
    while True:  # the node prints where it listens, then where the dashboard does
        try:
            line = said.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            stop(node)
            fail("shoal serve --dashboard did not print its URL within 30 s")
        if line is None:
            stop(node)
            fail("shoal serve --dashboard ended before printing its URL")
        if line.startswith("dashboard: "):
            return node, line.split(" ", 1)[1].strip()


def stop(process, sig=signal.SIGTERM, seconds=20):
    """Sends `sig`, waits up to `seconds`, then kills; whether it stopped on the signal."""
    process.send_signal(sig)
    try:
        process.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


def serve_dashboard_tls(shoal, work):
    """`shoal serve --dashboard-tls`: HTTPS with the node's own identity; curl with a member's certificate (written by
    `shoal id --write-tls`) and the node's pin is served; a stranger's certificate, none, or a wrong pin are refused."""
    curl = shutil.which("curl")
    if curl is None:
        fail("curl is missing: install Debian's curl (Tools/setup.sh --tests does)")
    database = os.path.join(work, "solo.db")  # a cluster of one: its own key is the member
    identities = {}
    for name, path in (("member", database), ("stranger", os.path.join(work, "node0.db"))):
        pem = os.path.join(work, f"{name}.pem")
        said = subprocess.run([shoal, "id", "--db", path, "--write-tls", pem], check=True, capture_output=True, text=True)
        pin = re.search(r"^pin: (sha256//\S+)$", said.stdout, re.M)
        if pin is None or not os.path.exists(pem) or os.stat(pem).st_mode & 0o077:
            fail(f"shoal id --write-tls did not print a pin or write {pem} (mode 600): {said.stdout}")
        identities[name] = (pem, pin.group(1))
    node, url = start_serve(shoal, database, ["--dashboard", "127.0.0.1:0", "--dashboard-tls"])
    try:
        if not url.startswith("https://"):
            fail(f"shoal serve --dashboard-tls printed {url}, not an https URL")

        def get(certificate, pin):
            command = [curl, "-sS", "--max-time", "10", "-k", "--pinnedpubkey", pin, url + "state"]
            if certificate:
                command[1:1] = ["--cert", certificate]
            return subprocess.run(command, capture_output=True, text=True)

        served = get(identities["member"][0], identities["member"][1])
        if served.returncode != 0 or '"name":"solo"' not in served.stdout.replace(" ", ""):
            fail(f"curl with the member's certificate was not served the state: {served.returncode} "
                 f"{served.stderr.strip()} {served.stdout[:200]}")
        for what, certificate, pin in (("a stranger's certificate", identities["stranger"][0], identities["member"][1]),
                                       ("no certificate", None, identities["member"][1]),
                                       ("another node's pin", identities["member"][0], identities["stranger"][1])):
            refused = get(certificate, pin)
            if refused.returncode == 0:
                fail(f"curl with {what} was served: {refused.stdout[:200]}")
        print("dashboard test: shoal serve --dashboard-tls: curl with a member's certificate and the node's pin is "
              "served; a stranger's certificate, none, and a wrong pin are refused")
    finally:
        stop(node)


if __name__ == "__main__":
    main()
