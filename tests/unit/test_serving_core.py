"""ServingCore without Kafka or vLLM: requests for one cold adapter wait together behind one
load request, loads run in order of waiting demand, and every request gets a result."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from catalog.exceptions import AliasNotFound
from catalog.models import Resolved
from catalog.refs import Ref
from catalog.store import AdapterStore
from schemas import make_event
from schemas.events import (
    AdapterEvicted,
    AdapterLoaded,
    InferCancel,
    InferCompleted,
    InferFailed,
    InferRequested,
    LoadFailed,
    LoadRequested,
)
from workers.serving import answers as answers_module
from workers.serving.admission import admit
from workers.serving.core import ServingCore
from workers.serving.engine import GenResult, GenSample
from workers.serving.exceptions import EngineError
from workers.serving.resolution import ResolutionCache

from .test_serving import FakeEngine, make_ws, put


class GenEngine(FakeEngine):
    """vLLM's generate and admit, faked: a word is a token (plus one for the BOS), and a batch
    fails as a whole when one of its prompts says "poison" (as vLLM aborts an offline batch)."""

    max_model_len = 32

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []
        self.submitted: list[str] = []
        self.hold: set[str] = set()
        self.running_now: dict[str, tuple] = {}
        self.aborted: set[str] = set()
        self.aborted_error = None

    def admit(self, r):
        return admit(r, prompt_tokens=len(r.prompt.split()) + 1, max_model_len=self.max_model_len)

    def submit(self, r, request_id, on_done, on_delta=None):
        """vLLM's asynchronous engine, faked: each request runs alone, at once."""
        self.submitted.append(request_id)
        if request_id in self.hold:  # keeps running until finish(request_id)
            self.running_now[request_id] = (r, on_done)
            return
        try:
            (result,) = self.generate([r])
        except Exception as e:
            on_done(None, e)
        else:
            on_done(result, None)

    def finish(self, request_id: str) -> None:
        r, on_done = self.running_now.pop(request_id)
        on_done(
            *(
                (None, self.aborted_error)
                if request_id in self.aborted
                else (self.generate([r])[0], None)
            )
        )

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def generate(self, requests):
        if any("poison" in r.prompt for r in requests):
            raise EngineError("vLLM generate failed (ValueError: a poisoned prompt)")
        self.batches.append([r.lora.lora_id for r in requests])
        return [
            GenResult(
                [1, 2],
                [
                    GenSample(f"out-{r.lora.lora_id}-{k}", [r.lora.lora_id % 97], [], "length")
                    for k in range(r.n)
                ],
            )
            for r in requests
        ]


def answers_later(monkeypatch, seconds: float) -> None:
    """The serving answers see the wall clock ``seconds`` ahead (its expires_at checks), as if
    a load or a wave had taken that long."""
    real = answers_module.datetime
    later = staticmethod(lambda tz=None: real.now(tz) + timedelta(seconds=seconds))
    monkeypatch.setattr(answers_module, "datetime", type("Later", (), {"now": later}))


@pytest.fixture
def setup(tmp_path: Path):
    store = AdapterStore(tmp_path / "store")
    refs = {f"p{i}": put(store, tmp_path, i, policy=f"p{i}") for i in range(3)}
    engine = GenEngine()
    ws = make_ws(store, tmp_path, engine, max_cpu_loras=2)

    def resolve(ref: Ref) -> Resolved:
        ref = str(ref)  # the fake reads the rendered form
        path, _, target = ref.partition("@")
        policy = path.split("/")[1]
        if policy not in refs:
            raise AliasNotFound(f"alias {ref} points nowhere")
        r = refs[policy]
        return Resolved("acme", policy, r.revision, r.digest, r.store_uri, "prod")

    core = ServingCore(engine, ws, ResolutionCache(resolve), engine_id="e0", base_model="tiny")
    return core, refs, engine


def req(policy: str, rid: str, prompt: str = "hi", tenant: str = "acme", max_tokens: int = 2, **kw):
    return make_event(
        InferRequested(request_id=rid, prompt=prompt, max_tokens=max_tokens, **kw),
        tenant=tenant,
        policy=policy,
        producer="test",
    )


def test_cold_requests_wait_together_and_load_by_demand(setup) -> None:
    core, refs, engine = setup
    out = []
    for i, policy in enumerate(["p0", "p1", "p1", "p1", "p0", "nosuch"]):
        out += core.on_infer(req(policy, f"r{i}"))
    loads = [e for e in out if isinstance(e.payload, LoadRequested)]
    failed = [e for e in out if isinstance(e.payload, InferFailed)]
    assert [e.policy for e in loads] == ["p0", "p1"]  # one load per adapter
    assert failed[0].payload.stage == "resolve" and "points nowhere" in failed[0].payload.error
    results = core.on_load_requests(loads)
    kinds = [type(e.payload).__name__ for e in results]
    assert kinds.count("AdapterLoaded") == 2 and kinds.count("InferCompleted") == 5
    # p1 (3 waiting) loaded and served before p0 (2 waiting).
    assert results[0].payload.adapter_digest == refs["p1"].digest
    done = [e.payload for e in results if isinstance(e.payload, InferCompleted)]
    assert all(p.cold_load and p.revision >= 1 for p in done)
    assert {p.request_id for p in done} == {"r0", "r1", "r2", "r3", "r4"}
    # Now warm: served without a load request.
    assert core.on_infer(req("p1", "warm")) == []
    warm = core.serve()
    assert len(warm) == 1 and warm[0].payload.cold_load is False
    # Loading p2 into the full CPU cache (2 slots) evicts the LRU adapter, as an event.
    loads = core.on_infer(req("p2", "third"))
    core.on_load_requests(loads)
    evicted = core.drain_events()
    assert [e.payload.adapter_digest for e in evicted] == [refs["p0"].digest]
    assert isinstance(evicted[0].payload, AdapterEvicted) and evicted[0].payload.reason == "lru"


def test_failed_load_fails_every_waiting_request(setup, tmp_path) -> None:
    core, refs, _ = setup
    weights = Path(refs["p2"].store_uri.removeprefix("file://")) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    out = core.on_infer(req("p2", "a")) + core.on_infer(req("p2", "b"))
    out += core.on_infer(req("p0", "c"))
    loads = [e for e in out if isinstance(e.payload, LoadRequested)]
    results = core.on_load_requests(loads)
    failed = [e.payload for e in results if isinstance(e.payload, LoadFailed)]
    errors = {
        e.payload.request_id: e.payload for e in results if isinstance(e.payload, InferFailed)
    }
    assert len(failed) == 1 and "AdapterDigestMismatch" in failed[0].error
    assert set(errors) == {"a", "b"} and all(e.stage == "load" for e in errors.values())
    assert any(isinstance(e.payload, AdapterLoaded) for e in results)
    assert [e.payload.request_id for e in results if isinstance(e.payload, InferCompleted)] == ["c"]


def test_loads_are_addressed_to_the_engine_that_waits(setup) -> None:
    core, refs, _ = setup
    (load,) = core.on_infer(req("p0", "a"))
    assert load.payload.engine_id == "e0"  # keyed by policy: lands where p0's requests land
    # Another engine's load for p1, which nothing here waits for (that engine lost the
    # partition; its requests, redelivered here, will ask again): not loaded here.
    other = load.model_copy(
        update={
            "payload": load.payload.model_copy(
                update={
                    "engine_id": "e9",
                    "adapter_digest": refs["p1"].digest,
                    "store_uri": refs["p1"].store_uri,
                }
            )
        }
    )
    out = core.on_load_requests([other, load])
    assert not core.ws.resident(refs["p1"].digest) and core.stats["loads_skipped"] == 1
    assert [type(e.payload).__name__ for e in out] == ["AdapterLoaded", "InferCompleted"]
    # Asked again once it is resident and nothing waits: nothing to do.
    assert core.on_load_requests([load]) == []


def test_requests_of_revoked_partitions_are_dropped_not_answered(setup) -> None:
    core, refs, _ = setup
    envs = [req("p0", "cold-a"), req("p0", "cold-b"), req("p1", "cold-c")]
    loads = [e for env in envs for e in core.on_infer(env)]
    assert core.drop({envs[0].event_id, envs[2].event_id}) == 2
    out = core.on_load_requests(loads)
    answered = [e.payload.request_id for e in out if isinstance(e.payload, InferCompleted)]
    assert answered == ["cold-b"]  # the dropped ones are the new owner's to answer
    # p1's load, asked here, waits for nobody now: not loaded (the new owner loads it)
    assert not core.ws.resident(refs["p1"].digest) and core.stats["loads_skipped"] == 1
    assert not any(
        isinstance(e.payload, AdapterLoaded) and e.payload.adapter_digest == refs["p1"].digest
        for e in out
    )


def test_requests_past_their_deadline_are_answered_expired_not_run(setup, monkeypatch) -> None:
    # The gateway stamps expires_at (its answer timeout): once the caller has its 503, an engine
    # must not spend a cold load or a generation slot on the request, and still answer it.
    core, refs, engine = setup
    now = datetime.now(UTC)

    def until(rid: str, policy: str, seconds: float):
        env = req(policy, rid)
        return env.model_copy(
            update={
                "payload": env.payload.model_copy(
                    update={"expires_at": now + timedelta(seconds=seconds)}
                )
            }
        )

    (gone,) = core.on_infer(until("late", "p0", -1))  # expired on arrival: no load for it
    assert isinstance(gone.payload, InferFailed) and gone.payload.stage == "expired"
    assert gone.payload.retryable and "expires_at" in gone.payload.error
    loads = core.on_infer(until("soon", "p1", 30)) + core.on_infer(until("later", "p1", 300))
    assert [type(e.payload).__name__ for e in loads] == ["LoadRequested"]
    # The load takes 60 s (the clock moves): "soon" has expired by its wave, "later" has not.
    answers_later(monkeypatch, 60)
    out = core.on_load_requests(loads)
    answers = {e.payload.request_id: e.payload for e in out if e.type.startswith("infer.")}
    assert answers["soon"].stage == "expired" and isinstance(answers["later"], InferCompleted)
    assert [len(b) for b in engine.batches] == [1]  # one generation, for "later" only


def _cancel(policy: str, target, tenant: str = "acme", rid: str | None = None):
    return make_event(
        InferCancel(request_id=rid or target.payload.request_id, request_event_id=target.event_id),
        tenant=tenant,
        policy=policy,
        producer="test",
    )


def test_a_cancel_answers_a_waiting_request_and_aborts_a_running_one_of_its_own_caller(
    setup,
) -> None:
    core, refs, engine = setup
    waiting, again = req("p0", "waiting"), req("p1", "running")
    engine.hold.add(str(again.event_id))  # the fake keeps it running until finish()
    loads = core.on_infer(waiting) + core.on_infer(again)
    core.on_load_requests([e for e in loads if e.policy == "p1"])  # p1 loaded: it starts
    assert core.in_flight == 1
    # Another tenant, or the right id under another request id, cancels nothing.
    assert core.cancel(_cancel("p1", again, tenant="other")) == []
    assert core.cancel(_cancel("p1", again, rid="guess")) == []
    assert not engine.aborted
    assert core.cancel(_cancel("p1", again)) == []  # running: aborted, answered when it ends
    assert engine.aborted == {str(again.event_id)}
    engine.finish(str(again.event_id))
    (ended,) = core.serve()
    assert (ended.payload.stage, ended.payload.code) == ("expired", "cancelled")
    (answer,) = core.cancel(_cancel("p0", waiting))  # waiting for its load: answered now
    assert (answer.payload.request_id, answer.payload.code) == ("waiting", "cancelled")
    assert core.cancel(_cancel("p0", waiting)) == []  # answered already: nothing more


def test_n_choices_are_one_engine_request_answered_with_every_choice(setup) -> None:
    core, refs, engine = setup
    loads = core.on_infer(req("p0", "multi", n=3))
    out = core.on_load_requests(loads)
    (done,) = [e.payload for e in out if isinstance(e.payload, InferCompleted)]
    assert len(engine.submitted) == 1
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert done.completion_tokens == 3 and done.text == done.choices[0].text
