"""An engine's ``/metrics`` after cold and warm traffic on real Kafka, Cassandra and the session's
vLLM engine, scraped over HTTP (streams.health); and one request followed by its correlation id
from the request through the engine's log lines to its result."""

from __future__ import annotations

import time
import uuid

import structlog

from schemas.events import InferCompleted
from streams import health
from tests._metrics import scrape, total

from .conftest import PROMPTS


def test_engine_metrics_move_with_cold_and_warm_traffic_and_logs_carry_the_request_ids(
    stack, variant_factory
) -> None:
    port = health.serve(0)
    settings = stack.settings
    t = f"m{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "chat", variant_factory(301))
    before = scrape(port)

    cold = [
        stack.request(t, "chat", f"cold-{i}", PROMPTS[i], revision=rev.revision) for i in range(3)
    ]
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        got = stack.serve(cold)
    warm = stack.request(t, "chat", "warm", PROMPTS[3], revision=rev.revision)
    got.update(stack.serve([warm]))
    deadline = time.monotonic() + 1.5  # the lag gauges refresh at most once a second
    while time.monotonic() < deadline:
        stack.worker.step(timeout_ms=50)
    after = scrape(port)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert all(isinstance(e.payload, InferCompleted) for e in got.values())
    assert [got[e.payload.request_id].payload.cold_load for e in cold] == [True] * 3
    assert got["warm"].payload.cold_load is False

    group = f"{settings.topic_prefix}-serving"
    requests, loads = settings.topic("infer.requests"), settings.topic("load.requests")
    records = "mint_consumer_records_total"
    assert total(after, records, group=group, topic=requests, outcome="handled") == 4
    assert total(after, records, group=group, topic=loads, outcome="handled") == 1  # one load
    lag = [
        v
        for (n, lb), v in after.items()
        if n == "mint_consumer_lag_records" and ("group", group) in lb and ("topic", requests) in lb
    ]
    assert lag and sum(lag) == 0, lag  # every request read
    assert total(after, "mint_consumer_held_records", group=group) == 0  # and answered

    assert delta("mint_serving_infer_latency_seconds_count", load="cold") == 3
    assert delta("mint_serving_infer_latency_seconds_count", load="warm") == 1
    assert delta("mint_adapter_load_seconds_count", source="store") == 1
    assert delta("mint_serving_load_wave_adapters_sum") == 1
    assert delta("mint_serving_generate_seconds_count") == 4  # each request ran on its own
    assert total(after, "mint_serving_running_requests") == 0
    assert delta("mint_working_set_lookups_total", tier="cpu", result="miss") == 1
    assert delta("mint_working_set_lookups_total", tier="cpu", result="hit") >= 4
    assert delta("mint_working_set_lookups_total", tier="gpu") >= 2
    assert total(after, "mint_working_set_adapters", tier="cpu") >= 1
    assert total(after, "mint_working_set_slots", tier="gpu") == stack.engine.config.max_loras

    # One cold request, followed by its correlation id: its load (run in the worker's
    # before_commit, after the record was handled), the wave that answered it, its result.
    first = cold[0]
    cid = str(first.correlation_id)
    mine = [e for e in logs if e.get("correlation_id") == cid]
    events = [e["event"] for e in mine]
    assert "request answered" in events, events
    answered = next(e for e in mine if e["event"] == "request answered")
    assert answered["request_id"] == "cold-0" and answered["cold_load"] is True
    assert answered["event_id"] == str(first.event_id)
    assert {e.get("type") for e in mine} >= {"infer.requested", "load.requested"}
    assert got["cold-0"].correlation_id == first.correlation_id
    assert got["cold-0"].causation_id == first.event_id
