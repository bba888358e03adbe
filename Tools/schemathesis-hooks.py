"""Schemathesis hooks for Tools/schemathesis.sh (loaded through SCHEMATHESIS_HOOKS)."""

import struct

import schemathesis

ENVELOPES = "application/vnd.shoal.changesets"

# Envelope lists are bytes: sent as generated, like application/octet-stream.
schemathesis.serializer.alias(ENVELOPES, "application/octet-stream")

# The smallest envelope: "SHRL", version, flags, cluster length, a cluster of one byte, epoch, site, from, to, upload,
# index, sealed length, and a sealed body of nonce and tag.
SMALLEST_ENVELOPE = 4 + 1 + 1 + 1 + 1 + 4 + 16 + 8 + 8 + 8 + 4 + 4 + 28


@schemathesis.deserializer(ENVELOPES)
def envelope_list(ctx, response):
    """A pull's page must be an envelope list: each envelope's length (u32, big-endian), then an envelope that starts
    with "SHRL" and holds its sealed body exactly. Checked here; the document's schema (a binary string) gets the
    bytes as text."""
    body = response.content or b""
    position = 0
    while position < len(body):
        if len(body) - position < 4:
            raise ValueError(f"the envelope list ends inside a length, at byte {position}")
        (length,) = struct.unpack_from(">I", body, position)
        envelope = body[position + 4 : position + 4 + length]
        if len(envelope) != length or length < SMALLEST_ENVELOPE or envelope[:4] != b"SHRL":
            raise ValueError(f"the envelope at byte {position} is cut short or is not one")
        header = 4 + 1 + 1 + 1 + envelope[6] + 4 + 16 + 8 + 8 + 8 + 4
        if length < header + 4 or header + 4 + struct.unpack_from(">I", envelope, header)[0] != length:
            raise ValueError(f"the envelope at byte {position} does not hold its sealed body exactly")
        position += 4 + length
    return body.decode("latin-1")


# With nothing to answer, a pull or a grants request waits as long as it asks (up to 30 s): every long-poll is cut to
# this many milliseconds, so the run stays short. The waiting itself is tested by the relay's process tests.
LONGEST_WAIT_MS = 20


def _shorter(value):
    if isinstance(value, list):
        return [_shorter(item) for item in value]
    if isinstance(value, bool):
        return value
    try:
        wait = int(value)
    except (TypeError, ValueError):
        return value
    if wait <= LONGEST_WAIT_MS:
        return value
    return LONGEST_WAIT_MS if isinstance(value, int) else str(LONGEST_WAIT_MS)


@schemathesis.hook
def before_call(context, case, kwargs):
    if isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = _shorter(case.query["wait"])
    if isinstance(case.body, dict) and "waitMilliseconds" in case.body:
        case.body["waitMilliseconds"] = _shorter(case.body["waitMilliseconds"])
