"""The rollout worker: sample completions from a revision and score them.

Consumes ``rollout.requested`` (revision or alias, prompts, sampling, n per prompt, reward by
name), generates with that adapter, scores each sample with the named reward, writes the rows
(prompt, completion, token ids, logprobs, reward) to the store as JSONL (the claim check) and
publishes ``rollout.completed`` with its URI and summary figures.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import structlog

from catalog.claims import read_jsonl, write_jsonl
from catalog.store import AdapterStore
from schemas.envelope import Envelope, make_event
from schemas.events import RolloutCompleted, RolloutRequested
from schemas.settings import MintSettings
from streams.consumer import RetryPolicy, run_consumer
from streams.producer import EventProducer
from workers.serving.engine import GenRequest
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import get_reward
from workers.serving.working_set import AdapterRef, WorkingSet

log = structlog.get_logger()


class RolloutCore:
    def __init__(self, engine: Any, working_set: WorkingSet, resolver: ResolutionCache,
                 store: AdapterStore, *, engine_id: str) -> None:  # fmt: skip
        self.engine, self.ws, self.resolver, self.store = engine, working_set, resolver, store
        self.producer_name = f"rollout/{engine_id}"

    def run(self, env: Envelope[RolloutRequested]) -> Envelope[RolloutCompleted]:
        p = env.payload
        t0 = time.perf_counter()
        reward = get_reward(p.reward)  # unknown names fail before any generation
        target = p.revision if p.revision is not None else p.alias
        res = self.resolver.resolve(f"{env.tenant}/{env.policy}@{target}")
        aref = AdapterRef(res.tenant, res.policy, res.revision, res.digest, res.store_uri)
        handle = self.ws.ensure(aref)
        prompts = list(p.prompts)
        if p.prompts_uri:
            prompts += [
                r["prompt"]
                for r in read_jsonl(self.store, p.prompts_uri, owner=(env.tenant, env.policy))
            ]
        reqs = [
            GenRequest(q, p.max_tokens, p.temperature, p.seed, n=p.samples_per_prompt,
                       logprobs=True, lora=handle, chat=p.chat)
            for q in prompts
        ]  # fmt: skip
        self.ws.used_in_batch([aref.digest])
        results = self.engine.generate(reqs)
        rows = []
        for i, (q, r) in enumerate(zip(prompts, results, strict=True)):
            for j, s in enumerate(r.samples):
                rows.append({"prompt_index": i, "sample": j, "prompt": q,
                             "prompt_token_ids": r.prompt_token_ids, "completion": s.text,
                             "token_ids": s.token_ids, "logprobs": s.logprobs,
                             "finish_reason": s.finish_reason,
                             "reward": reward(q, s.text, s.token_ids)})  # fmt: skip
        uri = write_jsonl(self.store, env.tenant, env.policy, "rollouts", str(env.event_id), rows)
        mean = sum(r["reward"] for r in rows) / len(rows) if rows else None
        out = RolloutCompleted(revision=aref.revision, adapter_digest=aref.digest,
                               rollouts_uri=uri, num_rollouts=len(rows), mean_reward=mean,
                               duration_s=time.perf_counter() - t0)  # fmt: skip
        log.info("rollout done", revision=aref.revision, rollouts=len(rows), mean_reward=mean)
        return make_event(out, tenant=env.tenant, policy=env.policy, producer=self.producer_name,
                          caused_by=env)  # fmt: skip


def run_rollout_worker(
    settings: MintSettings,
    core: RolloutCore,
    *,
    stop: threading.Event | None = None,
    idle_timeout_s: float | None = None,
    max_records: int | None = None,
):
    """Consume rollout requests (group ``<prefix>-rollout``) until stopped; a request that fails
    twice (unknown reward, unresolvable revision, failed load) goes to the dead-letter topic."""
    producer = EventProducer(settings, client_id=f"{core.producer_name}")

    def handle(env: Envelope[Any], _record: Any) -> None:
        if isinstance(env.payload, RolloutRequested):
            producer.publish(core.run(env))

    try:
        return run_consumer(settings, ["rollout.requests"], f"{settings.topic_prefix}-rollout",
                            handle, stop=stop, idle_timeout_s=idle_timeout_s,
                            max_records=max_records, producer=producer,
                            answers={"rollout.requests": "rollout.results"},
                            retry=RetryPolicy(max_attempts=2, backoff_s=0.1))  # fmt: skip
    finally:
        producer.close()
