"""The HTTP API's limits in one place: body sizes, stdin per request, waits, header size,
timeouts and connections (the README's API section states these values)."""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

#: Longest server-side wait a request may ask for (clients loop for longer waits).
MAX_WAIT_S = 300.0
#: Largest seq a request may name (what an SQLite integer holds).
MAX_SEQ = 2**63 - 1
#: Largest byte offset a request may name. Output files are capped at 64 GiB by policy; some
#: filesystems refuse to seek past 16 TiB (ext4: EINVAL, which surfaced as a 500).
MAX_OFFSET = 2**40
#: Live tokens per session; minting more revokes the oldest.
MAX_TOKENS_PER_SESSION = 16

#: Body limit of every route not listed in ``BODY_LIMITS`` (small JSON objects).
DEFAULT_BODY_LIMIT = 64 * KIB
#: Routes whose bodies may be larger. A task spec holds a command of up to 128 KiB and 64 KiB
#: of environment, which JSON escaping can make a few times longer; stdin input is capped at
#: ``MAX_INPUT_BYTES``, which base64 makes 4/3 as long.
BODY_LIMITS: dict[str, int] = {
    "/sessions/{session_id}/tasks": 1 * MIB,
    "/sessions/{session_id}/tasks/{task_id}/input": 2 * MIB,
    # The reviewed digests: ~100 bytes per change, for up to ~80 000 changes.
    "/sessions/{session_id}/workspace/apply": 8 * MIB,
    # Two booleans at most: a body that needs more is not one of ours.
    "/sessions/{session_id}/workspace/undo": 1 * KIB,
    "/sessions/{session_id}/workspace/discard": 1 * KIB,
}
#: Bytes of stdin one ``/input`` request may carry (after base64 decoding).
MAX_INPUT_BYTES = 1 * MIB

#: After answering a request before reading its body (401, 413), the daemon reads and drops
#: at most this much of the body, so the client can read the answer, then closes.
MAX_DRAIN = 8 * MIB

#: Request line plus headers, at most (h11 answers 400 beyond it).
MAX_HEADER_BYTES = 16 * KIB
#: A request's line and headers must arrive within this many seconds of the connection
#: opening, or of the previous response on a kept-alive connection.
HEADER_TIMEOUT_S = 10.0
#: A request's body must arrive within this many seconds of its headers.
BODY_TIMEOUT_S = 30.0
#: An idle kept-alive connection is closed after this many seconds.
KEEP_ALIVE_S = 5
#: Open connections per listener (unix socket, TCP), at most; lowered at start so that all
#: listeners together use at most half of the process's file descriptor limit.
MAX_CONNECTIONS = 2048
#: Connections over the cap that get a 503 answer before being closed; any more are closed
#: at once (a flood of connections must not cost a descriptor per attempt for long).
MAX_REFUSING = 64
#: How long a refused connection may take to read its 503 before it is cut.
REFUSE_LINGER_S = 1.0


#: The dashboard (``sandvisor serve --ui``): its port when ``--listen`` names none (a free one
#: when it is taken), how long a login link and a login's cookie live.
UI_PORT = 8377
UI_LOGIN_TTL_S = 600.0
UI_MAX_LOGIN_TTL_S = 86_400.0
#: The link ``sandvisor serve --ui`` prints: a day, so it still works after lunch.
UI_BANNER_LOGIN_TTL_S = 86_400.0
UI_COOKIE_TTL_S = 7 * 86_400.0


def body_limit(route_path: str) -> int:
    """The body limit of the route with this path template."""
    return BODY_LIMITS.get(route_path, DEFAULT_BODY_LIMIT)
