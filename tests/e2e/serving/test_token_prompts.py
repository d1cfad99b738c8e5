"""Token-id prompts (infer.requested prompt_token_ids, what the Tinker API's SamplingClient.sample
sends) on real Kafka, Cassandra and the session's vLLM engine (max_model_len 512): the ids run
as sent (HF + PEFT agrees on the same ids), the answer carries the sampled ids and their
logprobs, and an id outside the vocabulary or a prompt past the context fails alone, in a wave
whose other requests are answered."""

from __future__ import annotations

import uuid

from schemas import make_event
from schemas.events import InferCompleted, InferFailed, InferRequested

from .conftest import PROMPTS

# Not a tokenization of any text: ids a caller computed itself (Tinker's ModelInput chunks).
IDS = [1, 57, 300, 12, 900, 33]


def infer(tenant: str, rid: str, revision: int, ids: list[int] | None = None, **sampling):
    label = f"<{len(ids)} tokens>" if ids is not None else PROMPTS[0]
    return make_event(
        InferRequested(
            request_id=rid,
            prompt=label,
            prompt_token_ids=ids,
            revision=revision,
            logprobs=True,
            **{"max_tokens": 5, **sampling},
        ),
        tenant=tenant,
        policy="tok",
        producer="test/upstream",
    )


def test_token_prompts_run_as_sent_and_bad_ones_fail_alone(
    stack, variant_factory, hf_reference
) -> None:
    t = f"k{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "tok", variant_factory(501))
    vocab = stack.engine.vocab_size
    got = stack.serve(
        [
            infer(t, "greedy", rev.revision, IDS),
            infer(t, "oov", rev.revision, [1, 2, vocab]),
            infer(t, "long", rev.revision, [5] * 700),  # the context is 512
            infer(t, "sampled", rev.revision, IDS, temperature=1.0, seed=7, max_tokens=8),
            infer(t, "text", rev.revision),
        ]
    )
    answers = {rid: env.payload for rid, env in got.items()}

    oov, long = answers["oov"], answers["long"]
    assert isinstance(oov, InferFailed) and (oov.stage, oov.code) == ("validate", "invalid_value")
    assert f"prompt_token_ids[2]={vocab}" in oov.error and f"vocabulary of {vocab}" in oov.error
    assert isinstance(long, InferFailed), long
    assert (long.stage, long.code) == ("validate", "context_length_exceeded")
    assert "prompt has 700 tokens" in long.error
    # Neither bad request took another down: every good one was answered (below).

    greedy = answers["greedy"]
    assert isinstance(greedy, InferCompleted), greedy
    assert greedy.prompt_tokens == len(IDS)  # the ids as sent: no BOS added, nothing re-tokenized
    assert greedy.completion_tokens == len(greedy.token_ids) == len(greedy.logprobs) == 5
    tokens, logprobs = hf_reference.greedy(stack.adapter_dirs[rev.digest], IDS, 5)
    assert greedy.token_ids == tokens
    assert max(abs(a - b) for a, b in zip(greedy.logprobs, logprobs, strict=True)) < 1e-3

    sampled = answers["sampled"]
    assert isinstance(sampled, InferCompleted), sampled
    assert len(sampled.token_ids) == len(sampled.logprobs) == sampled.completion_tokens >= 1
    assert all(lp <= 0.0 for lp in sampled.logprobs)
    assert all(0 <= t < vocab for t in sampled.token_ids)

    text = answers["text"]
    assert isinstance(text, InferCompleted) and len(text.logprobs) == len(text.token_ids)
