"""What a worker's HTTP port says about it: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

One port per process (``MINT_METRICS_PORT``; off when unset):

- ``/healthz``: 200 while the process runs (a liveness probe: an outage of Kafka, Cassandra or the
  store is waited out, so it is no reason to restart the worker), 503 once a consumer's
  ``poll()`` has not returned for ``STUCK_POLL_S``: a client wedged inside itself, which nothing
  in the process can undo (a stall the loop can see is fixed in place: streams.stall). The JSON
  body names each consumer group, whether it is waiting out an outage and since when, and how
  long its poll has been running.
- ``/readyz``: 503 while any of its consumer loops waits out a transient failure (its partitions
  paused), or while the stall watch (streams.stall) suspects one of its consumers: a stall
  condition that has lasted ``SUSPECT_S`` (30 s), long before the watch replaces the consumer
  (90-150 s). The JSON names the group, each condition and since when (``"reason"``: ``<group>:
  stalled: never_fetched on mint.infer.requests[3] since <UTC time>``); ready again as soon as
  the condition clears or the consumer is replaced. 200 otherwise: a readiness probe, and what
  an operator's dashboard shows.
- ``/metrics``: every metric of the process's default registry (prometheus_client's
  ``REGISTRY``): the ``mint_*`` ones and, on an engine, vLLM's ``vllm:*`` (workers.serving.metrics).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Gauge, generate_latest

log = structlog.get_logger()

WAITING = Gauge(
    "mint_consumer_waiting_out_outage",
    "1 while the loop waits out a transient failure with its partitions paused",
    ["group"],
)

# A poll returns within its timeout plus a rebalance (seconds); 2 minutes in one is a client
# wedged inside itself.
STUCK_POLL_S = 120.0
# The stall watch reports what it suspects after each of its looks (every second while the loop
# polls). A suspicion no look confirmed for this long is dropped: its consumer was closed, or its
# loop is busy in a handler, which the watch does not count against it either.
STALL_FRESH_S = 30.0

_lock = threading.Lock()
_waiting_since: dict[str, float] = {}  # group -> wall time the outage began
_polling_since: dict[str, float] = {}  # group -> _clock() when its running poll began
_clock = time.monotonic
_groups: set[str] = set()
# (reader, watch) -> (_clock() of the watch's last look, what it suspects): one entry per consumer,
# as a process may run several of one group (a trainer's --consumers).
_stalled: dict[tuple[str, int], tuple[float, list[dict]]] = {}
_servers: dict[int, ThreadingHTTPServer] = {}


def register(group: str) -> None:
    with _lock:
        _groups.add(group)
    WAITING.labels(group).set(0)


def waiting(group: str, is_waiting: bool) -> None:
    """Mark ``group``'s loop as waiting out an outage (True) or running again (False)."""
    with _lock:
        _groups.add(group)
        if is_waiting:
            _waiting_since.setdefault(group, time.time())
        else:
            _waiting_since.pop(group, None)
    WAITING.labels(group).set(1 if is_waiting else 0)


def polling(group: str, running: bool) -> None:
    """Mark ``group``'s ``poll()`` as running (True, before the call) or returned (False)."""
    with _lock:
        if running:
            _polling_since[group] = _clock()
        else:
            _polling_since.pop(group, None)


def stalled(reader: str, watch: int, conditions: list[dict]) -> None:
    """What the stall watch ``watch`` of ``reader``'s consumer (its group, or a follower's client
    id) suspects now: one dict per condition (``reason``, ``partition``, ``for_s``, ``since``,
    ``detail``), empty when none. streams.stall calls it after each look and on a replacement."""
    with _lock:
        if conditions:
            _stalled[(reader, watch)] = (_clock(), conditions)
        else:
            _stalled.pop((reader, watch), None)


def _suspected(now: float) -> dict[str, list[dict]]:
    by_reader: dict[str, list[dict]] = {}
    for (reader, _), (seen, conditions) in sorted(_stalled.items()):
        if now - seen <= STALL_FRESH_S:
            by_reader.setdefault(reader, []).extend(conditions)
    return by_reader


def report() -> dict:
    now = _clock()
    with _lock:
        suspected = _suspected(now)
        groups = {
            g: {
                "waiting_out_outage": g in _waiting_since,
                "waiting_since": _waiting_since.get(g),
                "polling_for_s": round(now - _polling_since[g], 1) if g in _polling_since else None,
                "stalled": suspected.get(g, []),
            }
            for g in sorted(_groups | set(suspected))
        }
    stuck = sorted(g for g, v in groups.items() if (v["polling_for_s"] or 0) > STUCK_POLL_S)
    reason = "; ".join(
        f"{g}: stalled: {c['reason']} on {c['partition'] or 'the group member'} since {c['since']}"
        for g, conditions in suspected.items()
        for c in conditions
    )
    if stuck:
        status = "stuck_in_poll"
    elif any(v["waiting_out_outage"] for v in groups.values()):
        status = "waiting_out_outage"  # the outage is the cause of what the stall watch sees
    elif suspected:
        status = "stalled"
    else:
        status = "ready"
    return {
        "status": status,
        "reason": reason or None,
        "groups": groups,
        "stuck": stuck,
        "stalled": sorted(suspected),
    }


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/readyz"):
            body = report()
            alive = body["status"] != "stuck_in_poll"
            code = 200 if (alive if path == "/healthz" else body["status"] == "ready") else 503
            self._send(code, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b'{"error": "try /metrics, /healthz or /readyz"}', "application/json")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # scrapes every few seconds: not worth a log line
        pass


def serve(port: int | None, host: str = "0.0.0.0") -> int | None:
    """Serve this process's health and metrics on ``port`` (once per process; None: off; 0: a free
    port). Returns the port it listens on."""
    if port is None:
        return None
    if port in _servers and port != 0:
        return port
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    bound = server.server_address[1]
    _servers[bound] = server
    if port != 0:
        _servers[port] = server
    threading.Thread(target=server.serve_forever, name=f"health-{bound}", daemon=True).start()
    log.info("health and metrics served", port=bound, paths=["/metrics", "/healthz", "/readyz"])
    return bound
