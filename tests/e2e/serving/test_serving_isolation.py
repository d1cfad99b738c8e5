"""A request's failure is its own, on real Kafka, Cassandra and the session's vLLM engine
(max_model_len 512): requests vLLM cannot run share a wave with an ordinary one, and only they
fail, each with its own answer (stage validate and an OpenAI error code); a re-sent request is
answered once; the engine goes on serving."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from schemas import decode_event, make_event
from schemas.events import InferCompleted, InferFailed, InferRequested
from streams import make_consumer
from workers.serving.engine import GenRequest

from .conftest import PROMPTS


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    return AutoTokenizer.from_pretrained(tiny_llama)


def infer(tenant: str, rid: str, prompt: str, revision: int, **sampling):
    return make_event(
        InferRequested(
            request_id=rid, prompt=prompt, revision=revision, **{"max_tokens": 4, **sampling}
        ),
        tenant=tenant,
        policy="chat",
        producer="test/upstream",
    )


def test_bad_requests_fail_alone_in_one_wave_and_the_engine_keeps_serving(
    stack, variant_factory, tokenizer
) -> None:
    t = f"i{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "chat", variant_factory(401)).revision
    ok = infer(t, "ok", PROMPTS[0], rev)
    # "ok" is sent twice: re-sent by its producer with the same event id.
    envs = [
        infer(t, "hot", PROMPTS[1], rev, temperature=5.0),  # vLLM runs 0 to 2
        infer(t, "long", "hello " * 700, rev),  # ~700 tokens, the context is 512
        infer(t, "greedy", PROMPTS[2], rev, max_tokens=30_000),
        ok,
        ok,
    ]
    results = make_consumer(
        stack.settings,
        stack.settings.topic("infer.results"),
        group_id=f"collect-{uuid.uuid4().hex[:8]}",
    )
    got: dict[str, list] = {}
    try:
        stack.producer.publish_many(envs)
        deadline, quiet_until = time.monotonic() + 120, None
        while time.monotonic() < deadline and (
            quiet_until is None or time.monotonic() < quiet_until
        ):
            stack.worker.step(timeout_ms=50)
            for recs in results.poll(timeout_ms=10).values():
                for r in recs:
                    env = decode_event(r.value)
                    got.setdefault(env.payload.request_id, []).append(env.payload)
            if quiet_until is None and {"ok", "hot", "long", "greedy"} <= set(got):
                quiet_until = time.monotonic() + 2  # a second answer to "ok" would come now
    finally:
        results.close()
    assert {rid: len(answers) for rid, answers in got.items()} == {
        "ok": 1,
        "hot": 1,
        "long": 1,
        "greedy": 1,
    }
    (done,), (hot,), (long,), (greedy,) = got["ok"], got["hot"], got["long"], got["greedy"]
    assert isinstance(done, InferCompleted) and done.completion_tokens == 4
    for refused, code, words in [
        (hot, "invalid_value", "temperature=5.0"),
        (long, "context_length_exceeded", "512 tokens"),
        (greedy, "invalid_value", "max_tokens=30000"),
    ]:
        assert isinstance(refused, InferFailed) and refused.stage == "validate", refused
        assert refused.code == code and words in refused.error, refused.error
    assert "tokens" in long.error and str(len(tokenizer("hello " * 700).input_ids)) in long.error
    assert stack.core.stats["duplicates"] == 1
    # The ids the engine counted and ran are vLLM's own tokenization of the text.
    assert done.prompt_tokens == len(tokenizer(PROMPTS[0]).input_ids)
    handle = stack.ws.handle(done.adapter_digest)
    (direct,) = stack.engine.generate([GenRequest(PROMPTS[0], 4, 0.0, lora=handle)])
    assert direct.samples[0].token_ids == done.token_ids
    # And the engine goes on serving.
    after = stack.serve([infer(t, "after", PROMPTS[3], rev)])["after"]
    assert isinstance(after.payload, InferCompleted)
