#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer (the one in the Swift toolchain) and AddressSanitizer.
#   Tools/fuzz.sh --list                  the targets
#   Tools/fuzz.sh TARGET SECONDS [ARGS]   build (once; cached in .build-fuzz), then fuzz TARGET for SECONDS
#   Tools/fuzz.sh all SECONDS [ARGS]      every target, one after another
#   Tools/fuzz.sh --build                 only build
#   Tools/fuzz.sh --seed                  write the seed corpus (Tools/Fuzz/Corpus/TARGET/) from real messages
# ARGS go to libFuzzer, e.g. `-runs=10000000` (then SECONDS is only an upper bound; 0 means none).
# The harnesses are the root package's ShoalFuzzing library (Tools/Fuzz/ShoalFuzzing); the libFuzzer binary is
# the small package in Tools/Fuzz/Runner, built in release with -sanitize=fuzzer,address. New inputs go to
# .fuzz/corpus/TARGET/, the committed corpus is only read. On a crash the reproducing input is left in
# .fuzz/crashes/TARGET/ and the script exits non-zero; replay it with
#   SHOAL_FUZZ_TARGET=TARGET .build-fuzz/release/shoal-fuzz FILE
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
targets=(frame codec stream apply hello join)
binary="$root/.build-fuzz/release/shoal-fuzz"

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

build() {
    # SwiftPM's --sanitize passes -sanitize=fuzzer and -sanitize=address to swiftc as two flags, and swiftc keeps
    # only the last one (no coverage at all); the combined flag after them is the one that counts for Swift code.
    # The --sanitize flags stay for the C targets and the link.
    local started=$SECONDS
    swift build --package-path "$root/Tools/Fuzz/Runner" --scratch-path "$root/.build-fuzz" -c release \
        --sanitize=fuzzer --sanitize=address -Xswiftc -sanitize=fuzzer,address 2>&1 \
        | grep -v -e "Cannot export local symbol '__asan" -e '^\[[0-9]*/[0-9]*\]' >&2 || true
    [ -x "$binary" ] || { echo "fuzz build failed" >&2; exit 1; }
    echo "fuzz build: $((SECONDS - started)) s" >&2
}

max_len() {
    case "$1" in
        frame) echo 131072 ;;
        codec | stream) echo 65536 ;;
        apply) echo 16384 ;;
        hello | join) echo 70000 ;;
    esac
}

fuzz() {
    local target=$1 seconds=$2
    shift 2
    local work="$root/.fuzz/corpus/$target" crashes="$root/.fuzz/crashes/$target"
    mkdir -p "$work" "$crashes"
    local dict=()
    [ -f "$root/Tools/Fuzz/$target.dict" ] && dict=("-dict=$root/Tools/Fuzz/$target.dict")
    echo "== fuzzing $target for ${seconds}s (crashes go to .fuzz/crashes/$target/)" >&2
    local log="$root/.fuzz/$target.log" status=0
    # Leak checking is off: the Swift runtime's caches look like leaks at exit. Swift's own backtracer is off:
    # AddressSanitizer reports the crash.
    SWIFT_BACKTRACE=enable=no SHOAL_FUZZ_TARGET=$target "$binary" -max_total_time="$seconds" \
        -max_len="$(max_len "$target")" -timeout=20 -rss_limit_mb=4096 -detect_leaks=0 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "${dict[@]}" "$@" "$work" "$root/Tools/Fuzz/Corpus/$target" >"$log" 2>&1 \
        || status=$?
    grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" >&2 || true
    if [ $status -ne 0 ]; then
        tail -n 40 "$log" >&2
        echo "FAIL: $target crashed (exit $status); the input is in $crashes/:" >&2
        ls -t "$crashes" | head -n 3 | sed "s|^|  $crashes/|" >&2
        echo "replay: SHOAL_FUZZ_TARGET=$target $binary FILE (full log: $log)" >&2
        return 1
    fi
}

case "${1:-}" in
    --list) printf '%s\n' "${targets[@]}" ;;
    --build) build ;;
    --seed)
        SHOAL_WRITE_FUZZ_CORPUS=1 swift test --filter FuzzCorpusTests/writeSeeds
        ;;
    all)
        [ $# -ge 2 ] || usage
        seconds=$2
        shift 2
        build
        failed=0
        for target in "${targets[@]}"; do fuzz "$target" "$seconds" "$@" || failed=1; done
        exit $failed
        ;;
    "" | -h | --help) usage ;;
    *)
        [ $# -ge 2 ] || usage
        target=$1
        seconds=$2
        shift 2
        printf '%s\n' "${targets[@]}" | grep -qx -- "$target" || { echo "unknown target $target" >&2; usage; }
        build
        fuzz "$target" "$seconds" "$@"
        ;;
esac
