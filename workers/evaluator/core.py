"""Run one evaluation request: the suite's prompts against a revision on the serving engine.

The revision is resolved through the catalog (``tenant/policy@N``), its adapter made resident in
the engine's working set (verified digest), the prompts generated with it, each completion
scored with the suite's reward, and ``eval.completed`` built with the metrics, the request's
thresholds and the verdict (``threshold_failures``). Its event id derives from the request's, so
a redelivered request yields the same event and consumers dedupe it.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import structlog

from schemas import Envelope, make_event
from schemas.events import EvalCompleted, EvalRequested, threshold_failures
from workers.evaluator.exceptions import EvaluatorError
from workers.evaluator.suites import get_suite
from workers.serving.engine import GenRequest
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import get_reward
from workers.serving.working_set import AdapterRef, WorkingSet

log = structlog.get_logger()

_NS = uuid.UUID("c4e1b7a0-2d93-4f6e-8a15-7b0d3e9f2c61")


def result_id(request: Envelope[Any]) -> uuid.UUID:
    return uuid.uuid5(_NS, str(request.event_id))


class EvaluatorCore:
    def __init__(self, engine: Any, working_set: WorkingSet, resolver: ResolutionCache, *,
                 engine_id: str) -> None:  # fmt: skip
        self.engine, self.ws, self.resolver = engine, working_set, resolver
        self.producer_name = f"evaluator/{engine_id}"

    def metrics(self, env: Envelope[EvalRequested]) -> dict[str, float]:
        p = env.payload
        suite = get_suite(p.suite)
        reward = get_reward(suite.reward)
        res = self.resolver.resolve(f"{env.tenant}/{env.policy}@{p.revision}")
        if res.digest != p.adapter_digest:
            raise EvaluatorError(
                f"eval request {env.event_id} names {env.policy_id}@{p.revision} with digest "
                f"{p.adapter_digest}, the catalog has {res.digest}: re-request with the right one"
            )
        aref = AdapterRef(res.tenant, res.policy, res.revision, res.digest, res.store_uri)
        handle = self.ws.ensure(aref)
        self.ws.used_in_batch([aref.digest])
        reqs = [GenRequest(q, suite.max_tokens, suite.temperature, suite.seed, n=suite.samples,
                           lora=handle, chat=suite.chat) for q in suite.prompts]  # fmt: skip
        t0 = time.perf_counter()
        results = self.engine.generate(reqs)
        gen_s = time.perf_counter() - t0
        scores, lengths = [], []
        for q, r in zip(suite.prompts, results, strict=True):
            for s in r.samples:
                scores.append(float(reward(q, s.text, s.token_ids)))
                lengths.append(len(s.token_ids))
        mean = sum(scores) / len(scores)
        return {"reward": mean, suite.reward: mean, "min_reward": min(scores),
                "mean_tokens": sum(lengths) / len(lengths), "samples": float(len(scores)),
                "generate_s": gen_s}  # fmt: skip

    def run(self, env: Envelope[EvalRequested]) -> Envelope[EvalCompleted]:
        p = env.payload
        metrics = self.metrics(env)
        failures = threshold_failures(metrics, dict(p.thresholds))
        out = EvalCompleted(revision=p.revision, adapter_digest=p.adapter_digest, suite=p.suite,
                            metrics=metrics, thresholds=p.thresholds, passed=not failures,
                            failures=failures)  # fmt: skip
        log.info("evaluated", policy=env.policy_id, revision=p.revision, suite=p.suite,
                 reward=round(metrics["reward"], 4), passed=not failures)  # fmt: skip
        return make_event(out, tenant=env.tenant, policy=env.policy, producer=self.producer_name,
                          caused_by=env, event_id=result_id(env))  # fmt: skip
