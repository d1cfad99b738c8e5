"""The rollout worker: sample completions from a revision and score them.

Consumes ``rollout.requested`` (revision or alias, prompts, sampling, n per prompt, reward by
name), generates with that adapter, scores each sample with the named reward, writes the rows
(prompt, completion, token ids, logprobs, reward) to the store as JSONL (the claim check) and
publishes ``rollout.completed`` with its URI and summary figures.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import structlog

from catalog.claims import read_jsonl, write_jsonl
from catalog.models import Resolved
from catalog.store import AdapterStore
from schemas.envelope import Envelope, make_reply
from schemas.events import RolloutCompleted, RolloutRequested
from schemas.settings import MintSettings
from streams.records import ConsumerStats
from workers.serving.answers import request_ref
from workers.serving.engine import GenRequest
from workers.serving.lanes import ROLLOUT, run_lane
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import get_reward
from workers.serving.working_set import WorkingSet

log = structlog.get_logger()


class Sampling(Protocol):
    """How to sample: a rollout request and an evaluation suite both say it."""

    max_tokens: int
    temperature: float
    seed: int | None
    chat: bool


def adapter_requests(
    ws: WorkingSet,
    aref: Resolved,
    prompts: Sequence[str],
    how: Sampling,
    n: int,
    *,
    logprobs: bool = False,
) -> list[GenRequest]:
    """The engine requests for ``n`` samples of each prompt from ``aref``'s adapter, which is
    made resident first and counted as used by one batch (rollouts, evaluation suites)."""
    handle = ws.ensure(aref)
    ws.used_in_batch([aref.digest])
    return [
        GenRequest(
            q,
            how.max_tokens,
            how.temperature,
            how.seed,
            n=n,
            logprobs=logprobs,
            lora=handle,
            chat=how.chat,
        )
        for q in prompts
    ]


class RolloutCore:
    def __init__(
        self,
        engine: Any,
        working_set: WorkingSet,
        resolver: ResolutionCache,
        store: AdapterStore,
        *,
        engine_id: str,
    ) -> None:
        self.engine, self.ws, self.resolver, self.store = engine, working_set, resolver, store
        self.producer_name = f"rollout/{engine_id}"

    def run(self, env: Envelope[RolloutRequested]) -> Envelope[RolloutCompleted]:
        p = env.payload
        t0 = time.perf_counter()
        reward = get_reward(p.reward)  # unknown names fail before any generation
        aref = self.resolver.resolve(request_ref(env))
        prompts = list(p.prompts)
        if p.prompts_uri:
            prompts += [
                r["prompt"]
                for r in read_jsonl(self.store, p.prompts_uri, owner=(env.tenant, env.policy))
            ]
        reqs = adapter_requests(self.ws, aref, prompts, p, p.samples_per_prompt, logprobs=True)
        results = self.engine.generate(reqs)
        rows = []
        for i, (q, r) in enumerate(zip(prompts, results, strict=True)):
            for j, s in enumerate(r.samples):
                rows.append(
                    {
                        "prompt_index": i,
                        "sample": j,
                        "prompt": q,
                        "prompt_token_ids": r.prompt_token_ids,
                        "completion": s.text,
                        "token_ids": s.token_ids,
                        "logprobs": s.logprobs,
                        "finish_reason": s.finish_reason,
                        "reward": reward(q, s.text, s.token_ids),
                    }
                )
        uri = write_jsonl(self.store, env.tenant, env.policy, "rollouts", str(env.event_id), rows)
        mean = sum(r["reward"] for r in rows) / len(rows) if rows else None
        out = RolloutCompleted(
            revision=aref.revision,
            adapter_digest=aref.digest,
            rollouts_uri=uri,
            num_rollouts=len(rows),
            mean_reward=mean,
            duration_s=time.perf_counter() - t0,
        )
        log.info("rollout done", revision=aref.revision, rollouts=len(rows), mean_reward=mean)
        return make_reply(out, env, producer=self.producer_name)


def run_rollout_worker(settings: MintSettings, core: RolloutCore, **options: Any) -> ConsumerStats:
    """Consume rollout requests (group ``<prefix>-rollout``) until stopped (workers.serving.lanes:
    ``stop``, ``idle_timeout_s``, ``max_records``)."""
    return run_lane(settings, ROLLOUT, core, **options)
