"""A request's failure is its own (issue 25): one bad request, load, record or tenant never takes
down an engine or work that is not its own. ServingCore and the serving worker's queue over a
fake vLLM (tests/unit/test_serving_core.GenEngine: a word is a token, and like vLLM it fails a
whole batch for one bad prompt) and a real adapter store; the e2e serving tests run real vLLM."""

from __future__ import annotations

import errno
import shutil
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from catalog.exceptions import AliasNotFound
from catalog.models import Resolved
from catalog.refs import Ref
from catalog.store import AdapterStore
from schemas.events import (
    InferCompleted,
    InferFailed,
    LoadFailed,
    LoadRequested,
)
from streams.records import is_transient
from workers.serving.core import ServingCore
from workers.serving.exceptions import AdapterMissing, EngineError
from workers.serving.resolution import ResolutionCache
from workers.serving.worker import ServingWorker

from .test_serving import FP, make_ws, put, write_adapter
from .test_serving_core import GenEngine, answers_later, req

pytestmark = pytest.mark.unit


class VllmLikeEngine(GenEngine):
    """What the real engine did before each request was admitted alone: SamplingParams (built
    outside generate's try) raises a plain ValueError above temperature 2, a prompt past the
    context aborts the whole batch, and add_lora can fail with an EngineError."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse_lora: set[int] = set()
        self.max_tokens: list[int] = []

    def load(self, handle) -> None:
        if handle.lora_id in self.refuse_lora:
            raise EngineError(f"vLLM add_lora failed for {handle.path} (bad tensor shapes)")
        super().load(handle)

    def generate(self, requests):
        if any(r.temperature > 2 for r in requests):
            raise ValueError("temperature must be in [0, 2], got 5.0.")
        if any(len(r.prompt.split()) + 1 > self.max_model_len for r in requests):
            raise EngineError(
                "vLLM generate failed (VLLMValidationError: The decoder prompt "
                "is longer than the maximum model length of 32)"
            )
        self.max_tokens += [r.max_tokens for r in requests]
        return super().generate(requests)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(tmp_path: Path):
    store = AdapterStore(tmp_path / "store")
    refs = {f"p{i}": put(store, tmp_path, i, policy=f"p{i}") for i in range(3)}
    engine = VllmLikeEngine()
    ws = make_ws(store, tmp_path, engine)
    targets: dict[str, Resolved] = {
        f"acme/{p}@prod": Resolved("acme", p, r.revision, r.digest, r.store_uri, "prod")
        for p, r in refs.items()
    }

    def resolve(ref: Ref) -> Resolved:
        ref = str(ref)  # the fake reads the rendered form
        if ref not in targets:
            raise AliasNotFound(f"alias {ref} points nowhere")
        return targets[ref]

    clock = Clock()
    core = ServingCore(
        engine,
        ws,
        ResolutionCache(resolve, ttl_s=1e9),
        engine_id="e0",
        base_model="tiny",
        clock=clock,
    )
    return SimpleNamespace(
        core=core, refs=refs, engine=engine, ws=ws, store=store, targets=targets, clock=clock
    )


def answers(events) -> dict[str, object]:
    return {e.payload.request_id: e.payload for e in events if e.type.startswith("infer.")}


def loads(events) -> list:
    return [e for e in events if isinstance(e.payload, LoadRequested)]


# 1. Nothing a request or a load raises leaves the core (it was a process exit, redelivered to
#    the next engine).


def test_a_temperature_vllm_refuses_is_that_requests_answer_not_an_engine_crash(world) -> None:
    core = world.core
    out = core.on_infer(req("p0", "hot", temperature=5.0)) + core.on_infer(req("p0", "ok"))
    got = answers(core.on_load_requests(loads(out)))
    hot, ok = got["hot"], got["ok"]
    assert isinstance(hot, InferFailed) and (hot.stage, hot.code) == ("validate", "invalid_value")
    assert "temperature=5.0" in hot.error and "between 0 and 2" in hot.error
    assert isinstance(ok, InferCompleted)


def test_an_engine_error_from_add_lora_fails_that_load_and_its_waiters_only(world) -> None:
    core, refs = world.core, world.refs
    from workers.serving.ids import lora_int_id

    world.engine.refuse_lora.add(lora_int_id(refs["p0"].digest))
    out = core.on_infer(req("p0", "a")) + core.on_infer(req("p0", "b"))
    out += core.on_infer(req("p1", "c"))
    results = core.on_load_requests(loads(out))
    (failed,) = [e.payload for e in results if isinstance(e.payload, LoadFailed)]
    assert failed.adapter_digest == refs["p0"].digest
    assert "EngineRefusedAdapter" in failed.error and "bad tensor shapes" in failed.error
    got = answers(results)
    assert {rid: p.stage for rid, p in got.items() if isinstance(p, InferFailed)} == {
        "a": "load",
        "b": "load",
    }
    assert isinstance(got["c"], InferCompleted)


def test_store_errors_that_stay_fail_the_load_and_an_unavailable_store_is_waited_out(
    world, monkeypatch
) -> None:
    core = world.core
    real = shutil.copyfile

    def denied(src, dst, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(src))

    monkeypatch.setattr(shutil, "copyfile", denied)
    out = core.on_infer(req("p0", "denied"))
    results = core.on_load_requests(loads(out))
    (failed,) = [e.payload for e in results if isinstance(e.payload, LoadFailed)]
    assert "StoreFailed" in failed.error and "Permission denied" in failed.error
    assert answers(results)["denied"].stage == "load"

    def hung(src, dst, *a, **k):
        raise OSError(errno.ETIMEDOUT, "Connection timed out", str(src))  # an NFS store away

    monkeypatch.setattr(shutil, "copyfile", hung)
    asked = loads(core.on_infer(req("p1", "patient")))
    with pytest.raises(OSError) as outage:
        core.on_load_requests(asked)
    assert is_transient(outage.value)  # the consumer loop waits it out, nothing is failed
    assert core.waiting.demand(core_key(world, "p1")) == 1
    monkeypatch.setattr(shutil, "copyfile", real)
    assert isinstance(answers(core.on_load_requests(asked))["patient"], InferCompleted)


def core_key(world, policy: str) -> str:
    r = world.refs[policy]
    return f"acme/{policy}@{r.digest}"


# 2. One prompt past the context (or a batch vLLM fails for any one request) fails alone.


def test_each_request_is_admitted_and_run_alone_so_a_request_vllm_fails_fails_alone(world) -> None:
    core, engine = world.core, world.engine
    long = " ".join(["word"] * 40)  # 41 tokens with the BOS; the context is 32
    envs = [
        req("p0", "long", long),
        req("p0", "greedy", max_tokens=100),
        req("p0", "clamped", " ".join(["w"] * 20), max_tokens=30),
        req("p0", "poison", "poison pill"),
        req("p0", "ok-1"),
        req("p0", "ok-2"),
    ]
    out = [e for env in envs for e in core.on_infer(env)]
    got = answers(core.on_load_requests(loads(out)))
    long_, greedy = got["long"], got["greedy"]
    assert (long_.stage, long_.code) == ("validate", "context_length_exceeded")
    assert "32 tokens" in long_.error and "41 tokens" in long_.error
    assert (greedy.stage, greedy.code) == ("validate", "invalid_value")
    assert "max_tokens=100" in greedy.error and "32" in greedy.error
    # vLLM's asynchronous engine fails a request alone: only the poisoned prompt failed.
    assert got["poison"].stage == "generate"
    assert all(isinstance(got[r], InferCompleted) for r in ("clamped", "ok-1", "ok-2"))
    # As vLLM serve: max_tokens is clamped to the context the prompt leaves (32 - 21).
    assert 11 in engine.max_tokens and 30 not in engine.max_tokens


# 3. Work leaves a queue only once it was answered; a sweep re-asks for lost loads and expires
#    requests that wait past their deadline.


def test_a_wave_interrupted_by_an_outage_is_put_back_and_answered_after_it(
    world, monkeypatch
) -> None:
    core, ws = world.core, world.ws
    core.on_load_requests(loads(core.on_infer(req("p0", "first"))))
    ws.evict(world.refs["p0"].digest)  # the next request's wave must load it again
    core.ready.add(core_key(world, "p0"), _pending(world, "again"))
    real = ws.store.open_path

    def away(*a, **k):
        raise TimeoutError("the store did not answer")

    monkeypatch.setattr(ws.store, "open_path", away)
    with pytest.raises(TimeoutError):
        core.serve()
    assert len(core.ready) == 1  # still queued, not lost
    monkeypatch.setattr(ws.store, "open_path", real)
    assert isinstance(answers(core.serve())["again"], InferCompleted)


def _pending(world, rid: str):
    from workers.serving.core import Pending

    r = world.refs["p0"]
    return Pending(
        req("p0", rid), Resolved("acme", "p0", r.revision, r.digest, r.store_uri), "prod"
    )


class _Deferred:
    def __init__(self) -> None:
        self.held: list = []

    def hold(self, record, key) -> None:
        self.held.append(key)

    def release(self, key) -> bool:
        return True


def _worker(core: ServingCore) -> tuple[ServingWorker, list]:
    """The worker's queue and flush around ``core``, without Kafka."""
    published: list = []
    worker = ServingWorker.__new__(ServingWorker)
    worker.core, worker._outbox, worker._sent = core, [], []
    worker._sent_lock = threading.Lock()
    worker._loads_queued, worker._request_partition = [], {}
    worker._deferred = _Deferred()
    worker.producer = SimpleNamespace(publish_many=published.extend)
    return worker, published


def test_queued_loads_stay_queued_through_an_outage_and_their_waiters_get_answers(
    world, monkeypatch
) -> None:
    core = world.core
    worker, published = _worker(core)
    record = SimpleNamespace(topic="infer.requests", partition=0, offset=7)
    worker._on_record(req("p0", "cold"), record)
    (load,) = loads(worker._outbox)
    worker._loads_queued.append((None, load))
    calls = {"n": 0}
    real = core.ws.store.open

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("store connection reset")
        return real(*a, **k)

    monkeypatch.setattr(core.ws.store, "open", flaky)
    with pytest.raises(ConnectionError):
        worker._work()  # the consumer loop waits the outage out and calls it again
    assert [env for _, env in worker._loads_queued] == [load]
    worker._work()
    assert worker._loads_queued == []
    assert isinstance(answers(published)["cold"], InferCompleted)


def test_the_sweep_asks_again_for_a_lost_load_and_expires_waiters(world, monkeypatch) -> None:
    core, clock = world.core, world.clock
    soon = datetime.now(UTC) + timedelta(seconds=5)
    lost = loads(core.on_infer(req("p0", "a")) + core.on_infer(req("p0", "b")))
    core.on_infer(req("p0", "deadline", expires_at=soon))
    assert len(lost) == 1  # only the first waiter asks; this load.requested is never delivered
    clock.now += 5
    assert core.sweep() == []  # not yet: load_retry_s is 30 s
    answers_later(monkeypatch, 10)
    clock.now += 30
    out = core.sweep()
    expired = answers(out)["deadline"]
    assert expired.stage == "expired" and core.waiting.demand(core_key(world, "p0")) == 2
    (again,) = loads(out)
    assert again.payload.adapter_digest == world.refs["p0"].digest
    assert "asked again" in again.payload.reason and core.stats["loads_reissued"] == 1
    got = answers(core.on_load_requests([again]))
    assert isinstance(got["a"], InferCompleted) and isinstance(got["b"], InferCompleted)


# 11a. A re-sent request (same event id) is answered once, within a poll and across polls.


def test_a_request_delivered_twice_is_answered_once(world) -> None:
    core = world.core
    worker, published = _worker(core)
    env = req("p0", "twice")
    record = SimpleNamespace(topic="infer.requests", partition=0, offset=1)
    worker._on_record(env, record)
    worker._on_record(env, SimpleNamespace(topic="infer.requests", partition=0, offset=2))
    assert worker._deferred.held == [env.event_id]  # the copy holds nothing
    worker._loads_queued = [(None, e) for e in loads(worker._outbox)]
    worker._work()
    worker._on_record(env, SimpleNamespace(topic="infer.requests", partition=0, offset=3))
    worker._work()  # a later poll
    assert [e.payload.request_id for e in published if e.type.startswith("infer.")] == ["twice"]
    assert core.stats["duplicates"] == 2
    # A request dropped with its partition is taken again when the partition comes back.
    other = req("p1", "moved")
    core.on_infer(other)
    assert core.drop({other.event_id}) == 1 and not core.seen(other.event_id)


# 12a. The working set checks the owner on every use, a resident adapter included.


def test_a_foreign_digest_fails_like_a_missing_one_even_when_resident(world, tmp_path) -> None:
    core, ws, refs = world.core, world.ws, world.refs
    core.on_load_requests(loads(core.on_infer(req("p0", "owner"))))
    assert ws.resident(refs["p0"].digest)
    a = refs["p0"]
    # A forged alias (or load request) of tenant "evil" naming acme's digest, with acme's
    # files or with a path of its own: refused, the same way as a digest that exists nowhere.
    for uri in (a.store_uri, world.store.uri_for("evil", "x", a.digest)):
        with pytest.raises(AdapterMissing) as foreign:
            ws.ensure(Resolved("evil", "x", 1, a.digest, uri))
        nowhere = "sha256:" + "9" * 64
        with pytest.raises(AdapterMissing) as missing:
            ws.ensure(Resolved("evil", "x", 1, nowhere, uri.replace(a.digest[7:], nowhere[7:])))
        assert str(foreign.value).replace(a.digest[7:], "D") == str(missing.value).replace(
            nowhere[7:], "D"
        )
    # Through the core (events refuse a store URI outside the tenant's namespace, so a forged
    # alias names a path of its own).
    forged = world.store.uri_for("evil", "x", a.digest)
    world.targets["evil/x@prod"] = Resolved("evil", "x", 1, a.digest, forged, "prod")
    out = core.on_infer(req("x", "foreign", tenant="evil"))
    out += core.serve() + core.on_load_requests(loads(out))
    got = answers(out)["foreign"]
    assert isinstance(got, InferFailed) and got.stage == "load" and "AdapterMissing" in got.error
    # The owner's adapter and its requests are untouched.
    assert ws.resident(a.digest)
    core.on_infer(req("p0", "owner-again"))
    assert isinstance(answers(core.serve())["owner-again"], InferCompleted)


def test_two_policies_with_the_same_bytes_each_use_their_own_verified_copy(tmp_path) -> None:
    store = AdapterStore(tmp_path / "store")
    src = write_adapter(tmp_path / "src", seed=3)
    one = store.put(src, tenant="acme", policy="one", base_model="tiny", base_model_fingerprint=FP)
    two = store.put(src, tenant="beta", policy="two", base_model="tiny", base_model_fingerprint=FP)
    assert one.digest == two.digest  # the digest is the content
    engine = GenEngine()
    ws = make_ws(store, tmp_path, engine, max_cpu_loras=2)
    h1 = ws.ensure(Resolved("acme", "one", 1, one.digest, one.uri))
    h2 = ws.ensure(Resolved("beta", "two", 1, two.digest, two.uri))
    assert h1 == h2 and engine.calls == [f"load:{h1.lora_id}"]  # loaded once, vouched twice
    shutil.rmtree(Path(two.uri.removeprefix("file://")))  # beta's copy is gone
    ws2 = make_ws(store, tmp_path, engine, max_cpu_loras=2)
    ws2.ensure(Resolved("acme", "one", 1, one.digest, one.uri))
    with pytest.raises(AdapterMissing):  # acme's copy in the engine does not serve beta
        ws2.ensure(Resolved("beta", "two", 1, two.digest, two.uri))
