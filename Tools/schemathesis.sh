#!/usr/bin/env bash
# Checks the relay against its API description with schemathesis (from PyPI; Tools/setup.sh --tests installs it):
# starts a relay on loopback (a temporary --data directory, a free port), makes a token, and sends every operation of
# /openapi.json generated requests, valid and invalid. No answer may be a server error, and every one must be as the
# document says: status, content type, headers and body. Bounded in examples per operation; exit status 0 only if
# every check passed.
#   Tools/schemathesis.sh PATH_TO_SHOAL [SCHEMATHESIS OPTIONS...]   (for instance --seed N to repeat a run)
# SHOAL_SCHEMATHESIS_EXAMPLES sets the examples per operation and phase (100).
set -euo pipefail
shoal=${1:?usage: Tools/schemathesis.sh PATH_TO_SHOAL [SCHEMATHESIS OPTIONS...]}
shift
shoal=$(cd "$(dirname "$shoal")" && pwd)/$(basename "$shoal")
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d /tmp/shoal-schemathesis.XXXXXX)
relay=""
cleanup() {
    if [ -n "$relay" ]; then
        kill "$relay" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$relay" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$relay" 2>/dev/null || true
        wait "$relay" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

# The files exist before the relay starts: the background job opens its redirects only when it runs, and the loop
# below may read first.
: >"$dir/relay.out"
: >"$dir/relay.log"
# Far above what the run sends, so no answer is 429 (the limit and its Retry-After are tested by the relay's tests).
"$shoal" relay serve --data "$dir/relay" --listen 127.0.0.1:0 --rate-limit 1000000 \
    >>"$dir/relay.out" 2>>"$dir/relay.log" &
relay=$!
url=""
for _ in $(seq 1 300); do
    url=$(sed -n 's/^relay listening on //p' "$dir/relay.out")
    [ -n "$url" ] && break
    kill -0 "$relay" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "FAILED: the relay did not start:" >&2
    cat "$dir/relay.log" >&2
    exit 1
fi
token() { "$shoal" relay token create --data "$dir/relay" --cluster "$1" 2>/dev/null | tail -n 1; }

checks=not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance
checks+=,response_schema_conformance
check() { # TOKEN OPTIONS...: runs schemathesis with the token on the operations the options name
    local token=$1
    shift
    (cd "$dir" && SCHEMATHESIS_HOOKS="$root/Tools/schemathesis-hooks.py" python3 -m schemathesis.cli run \
        "$url/openapi.json" -H "Authorization: Bearer $token" --checks "$checks" \
        --max-examples "${SHOAL_SCHEMATHESIS_EXAMPLES:-100}" --request-timeout 10 --generation-database none \
        --no-color "$@")
}
# Something to answer with, made as members make it: a rotation to epoch 1 (the token it brings, its upload key, a
# grant), then a range of two chunks, the first larger than the smallest page, so pulls get envelopes and Shoal-More.
seeded=$(python3 - "$url" "$(token schemathesis)" <<'EOF'
import base64, hashlib, hmac, json, os, struct, sys, urllib.request

url, token = sys.argv[1], sys.argv[2]


def call(path, body, content_type="application/json", headers={}):
    request = urllib.request.Request(url + path, data=body, method="POST")
    request.add_header("Authorization", "Bearer " + token)
    request.add_header("Content-Type", content_type)
    for name, value in headers.items():
        request.add_header(name, value)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


successor = "shoal-relay-" + os.urandom(32).hex()
key = os.urandom(32)
rotation = {
    "epoch": 1,
    "tokenHash": hashlib.sha256(successor.encode()).hexdigest(),
    "grants": [{"epoch": 1, "recipient": "schemathesis", "body": base64.b64encode(os.urandom(96)).decode()}],
    "uploadKey": base64.b64encode(key).decode(),
}
call("/v1/rotate", json.dumps(rotation).encode())
token = successor
site, upload, cluster = os.urandom(16), struct.unpack(">Q", os.urandom(8))[0], b"schemathesis"


def envelope(index, flags, to, sealed):
    header = b"SHRL" + bytes([1, flags, len(cluster)]) + cluster + struct.pack(">I", 1) + site
    return header + struct.pack(">QQQII", 0, to, upload, index, len(sealed)) + sealed


chunks = [envelope(0, 0, 0, os.urandom(70_000)), envelope(1, 3, 5, os.urandom(28))]
body = b"".join(struct.pack(">I", len(chunk)) + chunk for chunk in chunks)
authentication = hmac.new(key, body, hashlib.sha256).hexdigest()
result = call(
    "/v1/changesets", body, "application/vnd.shoal.changesets",
    {"Shoal-Upload-Epoch": "1", "Shoal-Upload-Auth": authentication},
)
assert result["stored"] == 2, result
print(successor)
EOF
)
status=0
# A rotation retires every token of its cluster: it runs on its own, with a token of another cluster.
check "$seeded" --exclude-operation-id rotate "$@" || status=1
check "$(token schemathesis-rotation)" --include-operation-id rotate "$@" || status=1
if ! kill -0 "$relay" 2>/dev/null; then
    echo "FAILED: the relay stopped during the run" >&2
    status=1
fi
if [ $status != 0 ]; then
    echo "the relay's log:" >&2
    cat "$dir/relay.log" >&2
fi
exit $status
