"""Serving on vLLM's asynchronous engine, on real Kafka, Cassandra and the session's engine
(tiny model, max_model_len 512): a request joins the running batch instead of waiting for it,
only a cold adapter's requests wait for its load, n choices are one request, a streamed request's
text arrives as infer.delta events before its completion, and a cancel aborts a running request."""

from __future__ import annotations

import time
import uuid

from schemas import decode_event, make_event
from schemas.events import InferCancel, InferCompleted, InferFailed, InferRequested
from streams import make_consumer

from .conftest import PROMPTS


def infer(tenant: str, policy: str, rid: str, revision: int, **fields):
    return make_event(
        InferRequested(request_id=rid, prompt=PROMPTS[0], revision=revision, **fields),
        tenant=tenant,
        policy=policy,
        producer="test/upstream",
    )


def test_a_short_request_sent_after_a_long_one_is_answered_first(stack, variant_factory) -> None:
    """Waves answered a request only after the wave before it finished; now it joins at vLLM's
    next step, and a warm request never waits for another adapter's cold load."""
    t = f"c{uuid.uuid4().hex[:8]}"
    warm = stack.register(t, "warm", variant_factory(601))
    cold = stack.register(t, "cold", variant_factory(602))
    stack.serve([infer(t, "warm", "prime", warm.revision, max_tokens=1)])  # warm is resident
    long = infer(t, "warm", "long", warm.revision, max_tokens=400, temperature=1.0, seed=3)
    stack.producer.publish_many([long])
    # the long request is running before the others arrive
    stack.step_until(lambda: stack.core.in_flight == 1)
    stack.producer.publish_many(
        [
            infer(t, "cold", "cold", cold.revision, max_tokens=2),
            infer(t, "warm", "short", warm.revision, max_tokens=2),
        ]
    )
    answers = _answers(stack, {"long", "short", "cold"})
    long_a, short_a, cold_a = answers["long"], answers["short"], answers["cold"]
    assert all(isinstance(a.payload, InferCompleted) for a in (long_a, short_a, cold_a))
    assert long_a.payload.completion_tokens > 20, "the long request must outlast the short one"
    assert short_a.occurred_at < long_a.occurred_at, "joined the running batch"
    assert short_a.payload.loading_ms == 0 and not short_a.payload.cold_load
    assert cold_a.payload.cold_load and short_a.occurred_at < cold_a.occurred_at


def test_n_choices_are_one_request_and_a_streamed_answer_arrives_as_deltas_first(
    stack, variant_factory
) -> None:
    t = f"s{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "stream", variant_factory(603))
    deltas = make_consumer(
        stack.settings, stack.settings.topic("infer.deltas"), group_id=f"d-{uuid.uuid4().hex[:8]}"
    )
    try:
        deltas.poll(timeout_ms=100)  # joined before the request is sent
        env = infer(
            t, "stream", "streamed", rev.revision, max_tokens=40, n=2, temperature=1.0, seed=5
        )
        env = env.model_copy(
            update={"payload": env.payload.model_copy(update={"stream_to": "reader-1"})}
        )
        answer = stack.serve([env])["streamed"]
        got = answer.payload
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(len(d.payload.text) for _, d in seen) < sum(
            len(c.text) for c in got.choices
        ):
            for recs in deltas.poll(timeout_ms=200).values():
                seen += [(r.key, decode_event(r.value)) for r in recs]
    finally:
        deltas.close()
    assert isinstance(got, InferCompleted) and len(got.choices) == 2
    assert got.completion_tokens == sum(len(c.token_ids) for c in got.choices)
    assert got.text == got.choices[0].text
    assert {key for key, _ in seen} == {b"reader-1"}, "keyed by the reader that asked"
    for i, choice in enumerate(got.choices):
        mine = [d.payload for _, d in seen if d.payload.index == i]
        assert len(mine) >= 2, "the text came in several deltas"
        assert [d.seq for d in mine] == list(range(len(mine)))
        assert "".join(d.text for d in mine) == choice.text
        assert all(d.offset == sum(len(x.text) for x in mine[:k]) for k, d in enumerate(mine))
    first = min(d.occurred_at for _, d in seen)
    assert first < answer.occurred_at, "text left before the completion"


def test_a_cancel_aborts_a_running_request_and_answers_it_cancelled(stack, variant_factory):
    """The cancel races the request's own end (450 tokens: a second or two on a quiet
    machine): a request that finished first is answered completed, as it should be, and the
    drill runs again with a fresh request, up to 4 times."""
    t = f"x{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "cancel", variant_factory(604))
    stack.serve([infer(t, "cancel", "prime", rev.revision, max_tokens=1)])
    outcomes = []
    for attempt in range(4):
        rid = f"doomed-{attempt}"
        env = infer(t, "cancel", rid, rev.revision, max_tokens=450, temperature=1.0, seed=9)
        stack.producer.publish_many([env])
        stack.step_until(lambda: stack.core.in_flight == 1)
        cancel = InferCancel(request_id=rid, request_event_id=env.event_id)
        foreign = make_event(  # another tenant guessing the id changes nothing
            cancel, tenant="intruder", policy="cancel", producer="test/upstream"
        )
        mine = make_event(cancel, tenant=t, policy="cancel", producer="test/upstream")
        stack.producer.publish_many([foreign, mine])
        stack.step_until(lambda: stack.core.in_flight == 0)
        answer = _answers(stack, {rid})[rid].payload
        outcomes.append(type(answer).__name__)
        if not isinstance(answer, InferCompleted):  # the cancel arrived while it ran
            break
    assert isinstance(answer, InferFailed), outcomes
    assert (answer.stage, answer.code) == ("expired", "cancelled")


def _answers(stack, want: set[str], timeout_s: float = 60.0) -> dict:
    """Every answer on infer.results for ``want`` (read from the start: the worker may have
    answered before this reader joined), stepping the worker meanwhile."""
    results = make_consumer(
        stack.settings,
        stack.settings.topic("infer.results"),
        group_id=f"all-{uuid.uuid4().hex[:8]}",
    )
    got: dict = {}
    deadline = time.monotonic() + timeout_s
    try:
        while want - set(got) and time.monotonic() < deadline:
            stack.worker.step(timeout_ms=50)
            for recs in results.poll(timeout_ms=100).values():
                for r in recs:
                    env = decode_event(r.value)
                    if env.payload.request_id in want:
                        got[env.payload.request_id] = env
    finally:
        results.close()
    assert not want - set(got), f"no answer for {sorted(want - set(got))}"
    return got
