"""The metric helpers, without a broker or a model: what each point of work counts, and the
correlation ids on the log lines of work done after a request's record was handled."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import structlog
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import IllegalStateError
from prometheus_client import REGISTRY

from catalog.models import Resolved
from catalog.refs import Ref
from catalog.store import AdapterStore
from schemas import encode_event, make_event
from schemas.events import InferRequested, LoadRequested, PromoteCommand
from schemas.settings import MintSettings
from streams import metrics as stream_metrics
from streams.records import RecordLoop, RetryPolicy
from workers.controller.logic import Refusal
from workers.serving.core import ServingCore
from workers.serving.resolution import ResolutionCache
from workers.trainer import metrics as trainer_metrics

from .test_controller import completed, ctl, export, moved  # noqa: F401 (ctl: a fixture)
from .test_serving import FakeEngine, make_ws, put
from .test_serving_core import GenEngine

SETTINGS = MintSettings(topic_prefix="unitmetrics")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Delta:
    """Sample values now, to compare with later: ``d(name, **labels)`` is the change since."""

    def __init__(self, *samples: tuple[str, dict[str, str]]) -> None:
        self.before = {(n, tuple(sorted(lb.items()))): value(n, **lb) for n, lb in samples}

    def __call__(self, name: str, **labels: str) -> float:
        return value(name, **labels) - self.before.get((name, tuple(sorted(labels.items()))), 0.0)


def record(topic: str, value_bytes: bytes | None, offset: int = 0) -> ConsumerRecord:
    return ConsumerRecord(
        topic, 0, -1, offset, 0, 0, b"acme/p", value_bytes, [], None, 6, len(value_bytes or b""), 0
    )


# -- the consumer loop ------------------------------------------------------------------------


def test_records_are_counted_per_topic_and_outcome_and_dead_letters_per_reason() -> None:
    group, topic = "unit-metrics-records", "unitmetrics.serving.commands"
    letters = []
    calls = {"n": 0}

    def handler(env, rec) -> None:
        calls["n"] += 1
        if rec.offset == 2:
            raise RuntimeError("this record always fails")  # unknown: retried, then dead-lettered

    loop = RecordLoop(
        SETTINGS,
        group,
        handler,
        RetryPolicy(2, 0.001, 0.001),
        None,
        threading.Event(),
        dead_letter_sink=lambda *letter: letters.append(letter),
    )
    good = encode_event(
        make_event(
            PromoteCommand(alias="prod", revision=1), tenant="acme", policy="p", producer="t"
        )
    )
    for offset, raw in enumerate([good, b"not json", good, good]):
        loop.process(record(topic, raw, offset))
    labels = {"group": group, "topic": topic}
    assert value("mint_consumer_records_total", **labels, outcome="handled") == 2
    assert value("mint_consumer_records_total", **labels, outcome="dead_lettered") == 2
    assert value("mint_consumer_dead_letters_total", **labels, reason="undecodable") == 1
    assert value("mint_consumer_dead_letters_total", **labels, reason="handler_failed") == 1
    assert len(letters) == 2 and calls["n"] == 4  # 2 good + 2 attempts of the failing one


class FakeConsumer:
    def __init__(self) -> None:
        self.high: dict[TopicPartition, int | None] = {}
        self.pos: dict[TopicPartition, int] = {}
        self.position_calls = 0

    def assignment(self) -> set[TopicPartition]:
        return set(self.high)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high[tp]

    def position(self, tp: TopicPartition, timeout_ms: int | None = None) -> int:
        assert timeout_ms == 0, "never wait on the broker for a metric"
        self.position_calls += 1
        if tp not in self.pos:
            raise IllegalStateError("not assigned")
        return self.pos[tp]


def test_lag_per_partition_follows_the_assignment_and_is_refreshed_at_most_every_interval():
    group = "unit-metrics-lag"
    a, b, c = (TopicPartition("unitmetrics.infer.requests", p) for p in range(3))
    consumer = FakeConsumer()
    gauges = stream_metrics.ConsumerGauges(group, every_s=3600)
    gauges.update(consumer, lambda: 1)  # nothing assigned yet: tried again at the next poll
    consumer.high = {a: 10, b: 5, c: None}  # c: not fetched yet, no sample
    consumer.pos = {a: 4, b: 5}
    gauges.update(consumer, lambda: 3)

    def lag(tp: TopicPartition) -> float | None:
        return REGISTRY.get_sample_value(
            "mint_consumer_lag_records",
            {"group": group, "topic": tp.topic, "partition": str(tp.partition)},
        )

    assert (lag(a), lag(b), lag(c)) == (6, 0, None)
    assert value("mint_consumer_held_records", group=group) == 3
    consumer.pos[a] = 10
    gauges.update(consumer, lambda: 0)  # within the interval: not refreshed, no broker call
    assert lag(a) == 6 and consumer.position_calls == 2
    gauges._due = 0
    del consumer.high[b], consumer.pos[b]  # b was revoked: its sample goes
    gauges.update(consumer, lambda: 0)
    assert (lag(a), lag(b)) == (0, None)
    gauges._due = 0
    consumer.high[b] = 9  # assigned again, but its position is not known: no sample yet
    gauges.update(consumer, lambda: 0)
    assert (lag(a), lag(b)) == (0, None)
    gauges.clear()
    assert (lag(a), lag(b)) == (None, None)
    assert value("mint_consumer_held_records", group=group) == 0


# -- the engine -------------------------------------------------------------------------------


def test_working_set_counts_hits_and_misses_per_tier_loads_and_occupancy(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "store")
    refs = [put(store, tmp_path, i) for i in range(3)]
    d = Delta(
        *[
            ("mint_working_set_lookups_total", {"tier": t, "result": r})
            for t in ("gpu", "cpu", "disk")
            for r in ("hit", "miss")
        ],
        ("mint_adapter_load_seconds_count", {"source": "store"}),
        ("mint_adapter_load_seconds_count", {"source": "disk"}),
        ("mint_working_set_evictions_total", {"tier": "cpu", "reason": "lru"}),
        ("mint_working_set_evictions_total", {"tier": "cpu", "reason": "requested"}),
    )
    ws = make_ws(store, tmp_path, FakeEngine(), max_loras=1, max_cpu_loras=2)
    assert value("mint_working_set_slots", tier="gpu") == 1
    assert value("mint_working_set_slots", tier="cpu") == 2
    ws.ensure(refs[0])  # cold: cpu miss, disk miss (fetched from the store)
    ws.ensure(refs[0])  # cpu hit
    ws.evict(refs[0].digest)
    ws.ensure(refs[0])  # cpu miss, disk hit (the files are still in the local cache)
    assert d("mint_working_set_lookups_total", tier="cpu", result="miss") == 2
    assert d("mint_working_set_lookups_total", tier="cpu", result="hit") == 1
    assert d("mint_working_set_lookups_total", tier="disk", result="miss") == 1
    assert d("mint_working_set_lookups_total", tier="disk", result="hit") == 1
    assert d("mint_adapter_load_seconds_count", source="store") == 1
    assert d("mint_adapter_load_seconds_count", source="disk") == 1
    assert d("mint_working_set_evictions_total", tier="cpu", reason="requested") == 1
    ws.used_in_batch([refs[0].digest])
    ws.used_in_batch([refs[0].digest])
    assert d("mint_working_set_lookups_total", tier="gpu", result="miss") == 1
    assert d("mint_working_set_lookups_total", tier="gpu", result="hit") == 1
    ws.ensure(refs[1])
    ws.ensure(refs[2])  # the CPU cache holds 2: the LRU goes
    assert d("mint_working_set_evictions_total", tier="cpu", reason="lru") == 1
    assert [value("mint_working_set_adapters", tier=t) for t in ("gpu", "cpu", "disk")] == [0, 2, 3]


@pytest.fixture
def core(tmp_path: Path) -> tuple[ServingCore, dict]:
    store = AdapterStore(tmp_path / "store")
    refs = {f"p{i}": put(store, tmp_path, i, policy=f"p{i}") for i in range(2)}
    engine = GenEngine()
    ws = make_ws(store, tmp_path, engine, max_loras=2, max_cpu_loras=2)

    def resolve(ref: Ref) -> Resolved:
        ref = str(ref)  # the fake reads the rendered form
        policy = ref.partition("@")[0].split("/")[1]
        r = refs[policy]
        return Resolved("acme", policy, r.revision, r.digest, r.store_uri, "prod")

    return ServingCore(
        engine, ws, ResolutionCache(resolve), engine_id="e0", base_model="tiny"
    ), refs


def infer(policy: str, rid: str):
    return make_event(
        InferRequested(request_id=rid, prompt="hi", max_tokens=2),
        tenant="acme",
        policy=policy,
        producer="test",
    )


def test_cold_and_warm_latency_load_waves_and_the_request_ids_on_later_log_lines(core) -> None:
    core, _ = core
    d = Delta(
        ("mint_serving_infer_latency_seconds_count", {"load": "cold"}),
        ("mint_serving_infer_latency_seconds_count", {"load": "warm"}),
        ("mint_serving_load_wave_adapters_sum", {}),
        ("mint_serving_load_wave_adapters_count", {}),
        ("mint_serving_generate_seconds_count", {}),
    )
    cold = [infer("p0", "a"), infer("p0", "b"), infer("p1", "c")]
    loads = [e for env in cold for e in core.on_infer(env)]
    assert [type(e.payload) for e in loads] == [LoadRequested, LoadRequested]
    # The loads and the waves that answer the requests run later (the worker's before_commit),
    # outside the consumer loop's binding of the record being handled.
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        core.on_load_requests(loads)
        core.on_infer(infer("p1", "warm"))
        core.serve()
    assert structlog.contextvars.get_contextvars() == {}, "nothing stays bound"
    answered = {e["request_id"]: e for e in logs if e["event"] == "request answered"}
    assert set(answered) == {"a", "b", "c", "warm"}
    for env in cold:
        line = answered[env.payload.request_id]
        assert line["correlation_id"] == str(env.correlation_id), line
        assert line["event_id"] == str(env.event_id) and line["cold_load"] is True
    assert answered["warm"]["cold_load"] is False
    assert d("mint_serving_infer_latency_seconds_count", load="cold") == 3
    assert d("mint_serving_infer_latency_seconds_count", load="warm") == 1
    # one wave of two loads (each served as soon as loaded); every request runs on its own
    assert d("mint_serving_load_wave_adapters_count") == 1
    assert d("mint_serving_load_wave_adapters_sum") == 2
    assert d("mint_serving_generate_seconds_count") == 4
    assert REGISTRY.get_sample_value("mint_serving_running_requests") == 0  # all finished


def test_failed_requests_are_counted_by_stage_and_logged_with_their_ids(core) -> None:
    core, refs = core
    d = Delta(
        ("mint_serving_infer_failures_total", {"stage": "load"}),
        ("mint_adapter_load_failures_total", {"error": "AdapterDigestMismatch"}),
    )
    weights = Path(refs["p1"].store_uri.removeprefix("file://")) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    env = infer("p1", "bad")
    (load,) = core.on_infer(env)
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        core.on_load_requests([load])
    (line,) = [e for e in logs if e["event"] == "request failed"]
    assert line["correlation_id"] == str(env.correlation_id) and line["request_id"] == "bad"
    assert d("mint_serving_infer_failures_total", stage="load") == 1
    assert d("mint_adapter_load_failures_total", error="AdapterDigestMismatch") == 1


# -- trainer and controller -------------------------------------------------------------------


def test_a_train_step_is_timed_and_its_tokens_counted() -> None:
    d = Delta(
        ("mint_trainer_step_seconds_count", {"objective": "rl"}),
        ("mint_trainer_step_seconds_sum", {"objective": "rl"}),
        ("mint_trainer_tokens_total", {"objective": "rl"}),
    )
    trainer_metrics.observe_step("rl", 0.5, 1000)
    assert d("mint_trainer_step_seconds_count", objective="rl") == 1
    assert d("mint_trainer_step_seconds_sum", objective="rl") == 0.5
    assert d("mint_trainer_tokens_total", objective="rl") == 1000
    assert value("mint_trainer_tokens_per_second") == 2000


def test_gate_verdicts_alias_moves_and_refusals_count_once_per_input(ctl) -> None:  # noqa: F811
    d = Delta(
        ("mint_controller_gate_verdicts_total", {"verdict": "passed"}),
        ("mint_controller_gate_verdicts_total", {"verdict": "failed"}),
        ("mint_controller_alias_moves_total", {"cause": "promote"}),
        ("mint_controller_refusals_total", {"command": "serving.promote"}),
        ("mint_controller_events_total", {"type": "serving.promote"}),
    )
    (req1,) = ctl.handle(export(1))
    ctl.handle(req1)
    done1 = completed(req1, {"reward": 0.7})
    (cmd,) = ctl.handle(done1)
    ctl.handle(done1)  # a redelivery: the same outputs, nothing counted again
    assert d("mint_controller_gate_verdicts_total", verdict="passed") == 1
    assert d("mint_controller_events_total", type="serving.promote") == 1
    (executed,) = ctl.handle(cmd, moved(cmd, None))
    ctl.handle(cmd, moved(cmd, None))
    assert executed.payload.cause == "promote"
    assert d("mint_controller_alias_moves_total", cause="promote") == 1
    (req2,) = ctl.handle(export(2))
    ctl.handle(req2)
    assert ctl.handle(completed(req2, {"reward": 0.4})) == []
    assert d("mint_controller_gate_verdicts_total", verdict="failed") == 1
    stale = make_event(
        PromoteCommand(alias="prod", revision=2, expected_revision=7),
        tenant="acme",
        policy="math",
        producer="test",
    )
    (refused,) = ctl.handle(stale, None, Refusal("at revision 1", 1))
    assert refused.type == "serving.refused"
    assert d("mint_controller_refusals_total", command="serving.promote") == 1
