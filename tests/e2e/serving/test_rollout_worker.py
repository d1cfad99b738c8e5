"""The rollout worker: token ids, logprobs and rewards for a revision, by claim check."""

from __future__ import annotations

import threading
import uuid

from catalog.claims import read_jsonl
from schemas import decode_event, make_event
from schemas.events import RolloutCompleted, RolloutRequested
from streams import make_consumer
from workers.serving.rewards import get_reward
from workers.serving.rollout import RolloutCore, run_rollout_worker

from .conftest import PROMPTS


def test_rollout_request_yields_tokens_logprobs_rewards(
    stack, variant_factory, hf_reference
) -> None:
    t = f"r{uuid.uuid4().hex[:8]}"
    rev = stack.register(t, "math", variant_factory(301))
    core = RolloutCore(
        stack.engine, stack.ws, stack.resolver, stack.store, engine_id=stack.engine.config.engine_id
    )
    greedy = make_event(
        RolloutRequested(
            base_model="tiny-llama",
            revision=rev.revision,
            prompts=PROMPTS[:2],
            samples_per_prompt=1,
            max_tokens=5,
            temperature=0.0,
            reward="distinct",
        ),
        tenant=t,
        policy="math",
        producer="test/trainer",
    )
    sampled = make_event(
        RolloutRequested(
            base_model="tiny-llama",
            revision=rev.revision,
            prompts=PROMPTS[:2],
            samples_per_prompt=3,
            max_tokens=5,
            temperature=1.0,
            seed=3,
            reward="length",
        ),
        tenant=t,
        policy="math",
        producer="test/trainer",
    )
    stack.producer.publish_many([greedy, sampled])
    stats = run_rollout_worker(
        stack.settings, core, stop=threading.Event(), max_records=2, idle_timeout_s=60
    )
    assert stats.handled == 2 and stats.dead_lettered == 0
    results = make_consumer(
        stack.settings,
        stack.settings.topic("rollout.results"),
        group_id=f"c-{uuid.uuid4().hex[:6]}",
    )
    got = {}
    for _ in range(50):
        for recs in results.poll(timeout_ms=200).values():
            for r in recs:
                env = decode_event(r.value)
                got[env.causation_id] = env.payload
        if len(got) == 2:
            break
    results.close()
    g, s = got[greedy.event_id], got[sampled.event_id]
    assert isinstance(g, RolloutCompleted) and g.revision == rev.revision
    assert (g.num_rollouts, s.num_rollouts) == (2, 6)
    rows = read_jsonl(stack.store, g.rollouts_uri)
    for row in rows:  # greedy rows are HF + PEFT's greedy continuation, logprobs included
        tokens, lps = hf_reference.greedy(
            stack.adapter_dirs[rev.digest], row["prompt_token_ids"], len(row["token_ids"])
        )
        assert row["token_ids"] == tokens
        assert max(abs(a - b) for a, b in zip(row["logprobs"], lps, strict=True)) < 1e-3
        assert row["reward"] == get_reward("distinct")("", row["completion"], row["token_ids"])
    assert g.mean_reward == sum(r["reward"] for r in rows) / len(rows)
    srows = read_jsonl(stack.store, s.rollouts_uri)
    assert all(r["reward"] == len(r["token_ids"]) for r in srows)
    assert all(len(r["logprobs"]) == len(r["token_ids"]) for r in srows)
    assert len({tuple(r["token_ids"]) for r in srows}) > 1  # sampling at T=1 differs
