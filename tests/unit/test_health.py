"""streams.health: what a worker's port tells a probe."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from streams import health


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
