#!/usr/bin/env python3
"""The docs check, run by the test command after the build.

1. Every relative link in README.md, CHANGELOG.md and docs/*.md points to a file or folder that exists, and, when it
   names a heading (`file.md#heading`, `#heading`), to a heading of that file (GitHub's anchors).
2. The README's quick start runs: its `sh` blocks, as one bash script with `set -euo pipefail`, in a fresh temporary
   directory, with the built `shoal` first on PATH. `swift build` and the `alias shoal=...` line are skipped (the
   binary is built, and on PATH); a line that starts `shoal serve` (which runs until stopped) runs in the background,
   waited for until it prints `listening on` (at most 30 s), and is stopped by its pid with SIGTERM at the end; the
   README's port 7400 is replaced by a free one, so that the check never meets another process on it; a line whose
   comment begins `same digest` (two `shoal digest` commands) must print the same twice. A command that fails, or a
   run past its deadline, fails the check with the README line it ran.

The README's Swift example is checked by EmbeddingExampleTests (it must match Tools/EmbeddingExample, which the
tests build and run).

    Tools/check-quickstart.py [--verbose] [SHOAL]    SHOAL: the built binary (default: .build/debug/shoal);
                                                     --verbose: print the quick start's output when it passes too
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE_SECONDS = 180
FENCE = re.compile(r"^\s*(```|~~~)")


def without_code(text):
    """The text with fenced blocks and inline code blanked out (lines kept, so line numbers stay right)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        elif fenced:
            lines.append("")
        else:
            lines.append(re.sub(r"`[^`]*`", "", line))
    return lines


def anchor(heading):
    """GitHub's anchor for a heading: its text without markup, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    for line in without_code(open(path, encoding="utf-8").read()) if path.endswith(".md") else []:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = anchor(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def check_links():
    files = ["README.md", "CHANGELOG.md"] + sorted(
        os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
    problems, checked = [], 0
    for name in files:
        path = os.path.join(ROOT, name)
        if not os.path.exists(path):
            problems.append(f"{name}: missing")
            continue
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        for number, line in enumerate(without_code(text), 1):
            for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto: and the like: not checked here
                checked += 1
                file_part, _, heading = target.partition("#")
                linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(linked):
                    missing = os.path.relpath(linked, ROOT)
                    problems.append(f"{name}:{number}: link to {target}: {missing} does not exist")
                elif heading and heading not in anchors(linked):
                    problems.append(f"{name}:{number}: link to {target}: no heading with that anchor in "
                                    f"{os.path.relpath(linked, ROOT)}")
    return problems, checked


PROLOGUE = r"""
set -Eeuo pipefail
__fail() { [ -s "$__failed" ] || echo "$2 $1" >"$__failed"; }
trap '__fail $? $LINENO' ERR
trap 'echo $LINENO >"$__current"' DEBUG
__alive() {  # running (not gone, not a zombie waiting to be reaped)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ $stat != *") Z "* ]]
}
background() {
    local log="$__logs/background-$(($(wc -l <"$__pids") + 1)).log"
    "$@" >"$log" 2>&1 &
    local pid=$!
    echo "$pid" >>"$__pids"
    for _ in $(seq 1 300); do
        if grep -q 'listening on ' "$log"; then
            echo "started in the background (pid $pid): $(grep -m 1 'listening on ' "$log")"
            return 0
        fi
        if ! __alive "$pid"; then
            echo "it exited before it was listening; its output:" >&2
            cat "$log" >&2
            return 1
        fi
        sleep 0.1
    done
    echo "it did not say 'listening on' within 30 s; its output:" >&2
    cat "$log" >&2
    return 1
}
__same() {  # the output of two commands that must print the same: its first half is its second
    printf '%s\n' "$1"
    local lines half
    lines=$(printf '%s\n' "$1" | wc -l)
    half=$((lines / 2))
    if [ $((lines % 2)) -ne 0 ] ||
        [ "$(printf '%s\n' "$1" | head -n "$half")" != "$(printf '%s\n' "$1" | tail -n "$half")" ]; then
        echo "the two digests differ" >&2
        return 1
    fi
}
__stop() {
    local pid
    while read -r pid; do
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 1 100); do __alive "$pid" || break; sleep 0.1; done
        if __alive "$pid"; then
            echo "warning: pid $pid did not stop within 10 s of SIGTERM: killed" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done <"$__pids"
}
trap '__stop' EXIT
trap 'exit 143' TERM
""".strip("\n")


def signal_group(group, number):
    try:
        os.killpg(group, number)
    except (ProcessLookupError, PermissionError):
        pass


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def quick_start_script(readme):
    """The quick start's shell blocks as one script, one line for each README line, and where each line came from."""
    lines = readme.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Quick start"), None)
    if start is None:
        raise SystemExit("check-quickstart: README.md has no '## Quick start' section")
    port = str(free_port())
    script, origin, block, shell = [], [], False, False
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if not block and line.startswith("## "):
            break
        if FENCE.match(line):
            block = not block
            shell = block and line.strip() in ("```sh", "```bash", "```shell")
            continue
        if not shell:
            continue
        command = line.replace("127.0.0.1:7400", f"127.0.0.1:{port}")
        stripped = command.strip()
        if stripped == "swift build" or stripped.startswith("swift build "):
            command = ": skipped: the test command built shoal already"
        elif stripped.startswith("alias shoal="):
            command = ": skipped: shoal is first on PATH"
        elif stripped.startswith("shoal serve ") or stripped.startswith("shoal relay serve "):
            command = "background " + stripped
        elif re.search(r"#\s*same digest", stripped):
            body = stripped.split("#", 1)[0].rstrip().rstrip(";")
            command = f"__out=$({body}); __same \"$__out\""
        script.append(command)
        origin.append((index + 1, line.strip()))
    if not script:
        raise SystemExit("check-quickstart: the README's quick start has no sh block")
    return script, origin, port


def run_quick_start(shoal, verbose):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    script, origin, port = quick_start_script(readme)
    with tempfile.TemporaryDirectory(prefix="shoal-quickstart-") as work:
        bin_dir, logs, run_dir = (os.path.join(work, name) for name in ("bin", "logs", "run"))
        for folder in (bin_dir, logs, run_dir):
            os.mkdir(folder)
        os.symlink(shoal, os.path.join(bin_dir, "shoal"))
        state = {name: os.path.join(logs, name) for name in ("failed", "current", "pids")}
        for path in state.values():
            open(path, "w").close()
        prologue = PROLOGUE.split("\n")
        with open(os.path.join(work, "quickstart.sh"), "w") as handle:
            handle.write("\n".join(prologue + script) + "\n")
        environment = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
                           __failed=state["failed"], __current=state["current"], __pids=state["pids"], __logs=logs)
        output_path = os.path.join(logs, "output")
        with open(output_path, "w") as output:
            # A process group of its own (led by the script, whose pid is its id), so that a command hanging in the
            # foreground can be stopped with everything else the script started, and nothing else.
            process = subprocess.Popen(["bash", os.path.join(work, "quickstart.sh")], cwd=run_dir, env=environment,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            timed_out = False
            try:
                process.wait(timeout=DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                timed_out = True
                current = open(state["current"]).read().strip()
            finally:
                if process.poll() is None:  # timed out, or this check was interrupted
                    signal_group(process.pid, signal.SIGTERM)  # the script's EXIT trap then stops its background jobs
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        signal_group(process.pid, signal.SIGKILL)
                        process.wait()
                signal_group(process.pid, signal.SIGKILL)  # anything of the script's still running
        def readme_line(script_line):
            index = int(script_line) - len(prologue) - 1
            return origin[index] if 0 <= index < len(origin) else ("?", f"(the check's own line {script_line})")

        output = open(output_path, errors="replace").read()
        commands = sum(1 for _, line in origin if line and not line.startswith("#"))
        if timed_out:
            number, line = readme_line(current or "0")
            return [f"README.md:{number}: the quick start did not finish within {DEADLINE_SECONDS} s; "
                    f"it was running: {line}"], output
        if process.returncode != 0:
            failed = open(state["failed"]).read().split()
            if failed:
                number, line = readme_line(failed[0])
                return [f"README.md:{number}: quick start command failed (exit {failed[1]}): {line}"], output
            return [f"the quick start failed (exit {process.returncode}) before running a command"], output
        summary = f"its {commands} lines ran in a fresh directory (port 7400 replaced by {port})"
        return [], output + summary if verbose else summary


def main():
    arguments = sys.argv[1:]
    verbose = "--verbose" in arguments
    arguments = [argument for argument in arguments if argument != "--verbose"]
    shoal = os.path.abspath(arguments[0] if arguments else os.path.join(ROOT, ".build/debug/shoal"))
    if not os.access(shoal, os.X_OK):
        raise SystemExit(f"check-quickstart: {shoal} is not an executable: build first (swift build)")
    problems, checked = check_links()
    for problem in problems:
        print(f"check-quickstart: {problem}", file=sys.stderr)
    print(f"links: {checked} relative links checked, {len(problems)} broken")
    failures, report = run_quick_start(shoal, verbose)
    if failures:
        print("check-quickstart: the quick start's output:\n" + "\n".join(report.rstrip().split("\n")[-60:]),
              file=sys.stderr)
        for failure in failures:
            print(f"check-quickstart: {failure}", file=sys.stderr)
    else:
        print(f"quick start: {report}")
    sys.exit(1 if problems or failures else 0)


if __name__ == "__main__":
    main()
