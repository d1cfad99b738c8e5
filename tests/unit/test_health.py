"""streams.health: what a worker's port tells a probe."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from streams import health


@pytest.fixture(autouse=True)
def _own_health(monkeypatch) -> None:
    """Each test's suspicions stay its own (streams.health keeps them per process)."""
    monkeypatch.setattr(health, "_stalled", {})


def get(port: int, path: str) -> tuple[int, dict | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            body = r.read().decode()
            return r.status, json.loads(body) if path != "/metrics" else body
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def test_readyz_is_503_while_a_group_waits_out_an_outage_and_healthz_stays_200() -> None:
    port = health.serve(0)
    health.register("unit-health")
    assert get(port, "/readyz")[0] == 200
    health.waiting("unit-health", True)
    code, body = get(port, "/readyz")
    assert code == 503 and body["status"] == "waiting_out_outage"
    assert body["groups"]["unit-health"]["waiting_out_outage"] is True
    assert get(port, "/healthz")[0] == 200  # an outage is no reason to restart the worker
    code, metrics = get(port, "/metrics")
    assert 'mint_consumer_waiting_out_outage{group="unit-health"} 1.0' in metrics
    health.waiting("unit-health", False)
    assert get(port, "/readyz")[0] == 200
    assert get(port, "/nope")[0] == 404


def test_healthz_is_503_once_a_poll_has_not_returned_for_two_minutes(monkeypatch) -> None:
    port = health.serve(0)
    health.register("unit-stuck")
    clock = [1000.0]
    monkeypatch.setattr(health, "_clock", lambda: clock[0])
    health.polling("unit-stuck", True)
    clock[0] += 60  # a long poll (a rebalance) is no reason to restart
    assert get(port, "/healthz")[0] == 200
    clock[0] += health.STUCK_POLL_S
    code, body = get(port, "/healthz")
    assert code == 503 and body["status"] == "stuck_in_poll" and body["stuck"] == ["unit-stuck"]
    assert body["groups"]["unit-stuck"]["polling_for_s"] == 180.0
    assert get(port, "/readyz")[0] == 503
    health.polling("unit-stuck", False)  # it returned: alive again
    assert get(port, "/healthz")[0] == 200


STALL = {
    "reason": "never_fetched",
    "partition": "mint.infer.requests[3]",
    "for_s": 31.0,
    "since": "2026-12-07T10:00:00+00:00",
    "detail": "mint.infer.requests[3]: assigned 31 s ago and never fetched",
}


def test_readyz_is_503_while_the_stall_watch_suspects_a_consumer(monkeypatch) -> None:
    """Not ready from the stall watch's suspicion (30 s), not from the replacement (90-150 s);
    alive all along: the watch mends it in place."""
    port = health.serve(0)
    health.register("unit-stalled")
    clock = [5000.0]
    monkeypatch.setattr(health, "_clock", lambda: clock[0])
    health.stalled("unit-stalled", 1, [STALL])
    code, body = get(port, "/readyz")
    assert code == 503 and body["status"] == "stalled" and body["stalled"] == ["unit-stalled"]
    assert body["groups"]["unit-stalled"]["stalled"] == [STALL]
    assert body["reason"] == (
        "unit-stalled: stalled: never_fetched on mint.infer.requests[3] "
        "since 2026-12-07T10:00:00+00:00"
    )
    assert get(port, "/healthz")[0] == 200
    health.stalled("unit-stalled", 2, [])  # another consumer of the group: says nothing of this one
    assert get(port, "/readyz")[0] == 503
    health.stalled("unit-stalled", 1, [])  # cleared, or replaced
    code, body = get(port, "/readyz")
    assert (
        code == 200 and body["reason"] is None and body["groups"]["unit-stalled"]["stalled"] == []
    )


def test_a_suspicion_no_look_confirms_expires(monkeypatch) -> None:
    """A consumer closed while suspected (or a loop busy in a handler) holds no process back."""
    health.register("unit-gone")
    clock = [5000.0]
    monkeypatch.setattr(health, "_clock", lambda: clock[0])
    health.stalled("unit-gone", 1, [STALL])
    clock[0] += health.STALL_FRESH_S
    assert health.report()["status"] == "stalled"
    clock[0] += 1
    assert health.report()["status"] == "ready"


def test_a_stuck_poll_outranks_an_outage_and_an_outage_a_stall(monkeypatch) -> None:
    """An outage explains what the stall watch sees (no coordinator while the broker is away);
    the reason names the stall all the same."""
    health.register("unit-rank")
    clock = [5000.0]
    monkeypatch.setattr(health, "_clock", lambda: clock[0])
    health.stalled("unit-rank", 1, [STALL])
    assert health.report()["status"] == "stalled"
    health.waiting("unit-rank", True)
    body = health.report()
    assert body["status"] == "waiting_out_outage" and body["reason"].startswith("unit-rank: ")
    health.polling("unit-rank", True)
    clock[0] += health.STUCK_POLL_S + 1
    health.stalled("unit-rank", 1, [STALL])
    assert health.report()["status"] == "stuck_in_poll"
    health.polling("unit-rank", False)
    health.stalled("unit-rank", 1, [])
    health.waiting("unit-rank", False)
    assert health.report() | {"groups": None} == {
        "status": "ready",
        "reason": None,
        "groups": None,
        "stuck": [],
        "stalled": [],
    }
