"""Run one evaluation request: the suite's prompts against a revision on the serving engine.

The revision is resolved through the catalog (``tenant/policy@N``), its adapter made resident in
the engine's working set (verified digest), the prompts generated with it, each completion
scored with the suite's reward, and ``eval.completed`` built with the metrics, the request's
thresholds and the verdict (``threshold_failures``). Its event id derives from the request's, so
a redelivered request yields the same event and consumers dedupe it.

Only the suite configured for the policy is run: anyone allowed to write ``eval.requests`` could
otherwise have any suite's numbers judged against the policy's gate. A request for another suite
(or for a policy with no configuration) is answered at once with an ``eval.completed`` whose
``refused`` says why, without loading or generating anything.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

import structlog

from catalog.refs import Ref
from schemas import Envelope
from schemas.envelope import make_reply
from schemas.events import EvalCompleted, EvalRequested, threshold_failures
from schemas.events.lifecycle import suite_refusal
from workers.evaluator.exceptions import EvaluatorError
from workers.evaluator.suites import get_suite
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import get_reward
from workers.serving.rollout import adapter_requests
from workers.serving.working_set import WorkingSet

log = structlog.get_logger()

_NS = uuid.UUID("c4e1b7a0-2d93-4f6e-8a15-7b0d3e9f2c61")


def result_id(request: Envelope[Any]) -> uuid.UUID:
    return uuid.uuid5(_NS, str(request.event_id))


class Configs(Protocol):
    """The policies' latest ``policy.configured`` payloads by policy id (the controller's
    ``controller.configs`` worker state, catalog.state.StateTable)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...


class EvaluatorCore:
    def __init__(
        self,
        engine: Any,
        working_set: WorkingSet,
        resolver: ResolutionCache,
        *,
        engine_id: str,
        configs: Configs | None = None,
    ) -> None:
        """``configs``: where each policy's configured suite is read; None runs any registered
        suite (in-process use and tests without a controller)."""
        self.engine, self.ws, self.resolver, self.configs = engine, working_set, resolver, configs
        self.producer_name = f"evaluator/{engine_id}"

    def metrics(self, env: Envelope[EvalRequested]) -> dict[str, float]:
        p = env.payload
        suite = get_suite(p.suite)
        reward = get_reward(suite.reward)
        res = self.resolver.resolve(Ref(env.tenant, env.policy, revision=p.revision))
        if res.digest != p.adapter_digest:
            raise EvaluatorError(
                f"eval request {env.event_id} names {env.policy_id}@{p.revision} with digest "
                f"{p.adapter_digest}, the catalog has {res.digest}: re-request with the right one"
            )
        reqs = adapter_requests(self.ws, res, suite.prompts, suite, suite.samples)
        t0 = time.perf_counter()
        results = self.engine.generate(reqs)
        gen_s = time.perf_counter() - t0
        scores, lengths = [], []
        for q, r in zip(suite.prompts, results, strict=True):
            for s in r.samples:
                scores.append(float(reward(q, s.text, s.token_ids)))
                lengths.append(len(s.token_ids))
        mean = sum(scores) / len(scores)
        return {
            "reward": mean,
            suite.reward_metric: mean,
            "min_reward": min(scores),
            "mean_tokens": sum(lengths) / len(lengths),
            "samples": float(len(scores)),
            "generate_s": gen_s,
        }

    def run(self, env: Envelope[EvalRequested]) -> Envelope[EvalCompleted]:
        p = env.payload
        if self.configs is not None:
            why = suite_refusal(env.policy_id, self.configs.get(env.policy_id), p.suite)
            if why is not None:
                log.warning(
                    "evaluation refused",
                    policy=env.policy_id,
                    revision=p.revision,
                    suite=p.suite,
                    reason=why,
                )
                out = EvalCompleted(
                    revision=p.revision,
                    adapter_digest=p.adapter_digest,
                    suite=p.suite,
                    metrics={},
                    thresholds=p.thresholds,
                    passed=False,
                    refused=why,
                )
                return self._answer(env, out)
        metrics = self.metrics(env)
        failures = threshold_failures(metrics, dict(p.thresholds))
        out = EvalCompleted(
            revision=p.revision,
            adapter_digest=p.adapter_digest,
            suite=p.suite,
            metrics=metrics,
            thresholds=p.thresholds,
            passed=not failures,
            failures=failures,
        )
        log.info(
            "evaluated",
            policy=env.policy_id,
            revision=p.revision,
            suite=p.suite,
            reward=round(metrics["reward"], 4),
            passed=not failures,
        )
        return self._answer(env, out)

    def _answer(self, env: Envelope[EvalRequested], out: EvalCompleted) -> Envelope[EvalCompleted]:
        return make_reply(out, env, producer=self.producer_name, event_id=result_id(env))
