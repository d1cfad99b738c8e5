"""What an engine answers with: one request's ``infer.completed`` or ``infer.failed`` (with its
stage, reason and, for a refusal, its code), and its ``load.requested``; counted and logged with
the request's ids (workers.serving.metrics)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from catalog.models import Resolved
from catalog.refs import Ref
from schemas.envelope import Envelope, make_event, make_reply
from schemas.events import (
    InferChoice,
    InferCompleted,
    InferFailed,
    InferRequested,
    LoadRequested,
)
from schemas.logs import bound_event
from workers.serving import metrics

log = structlog.get_logger()


@dataclass
class Pending:
    env: Envelope[InferRequested]
    ref: Resolved
    alias: str | None
    received: float = field(default_factory=time.perf_counter)
    load_wait_ms: float = 0.0
    cold: bool = False


def past_deadline(env: Envelope[InferRequested]) -> bool:
    """Has the caller's deadline passed? (wall clocks: engines and gateways keep NTP time)"""
    deadline = env.payload.expires_at
    return deadline is not None and datetime.now(UTC) >= deadline


def bound(env: Envelope[Any]):
    """Bind ``env``'s ids to every log line inside (as the consumer loop does for a record)."""
    return bound_event(
        event_id=str(env.event_id),
        type=env.type,
        policy=env.policy_id,
        correlation_id=str(env.correlation_id),
    )


def request_ref(env: Envelope[Any]) -> Ref:
    """The reference an inference or rollout request names, from its decoded (validated)
    fields: a revision number when it pins one, else its alias."""
    p = env.payload
    if p.revision is not None:
        return Ref(env.tenant, env.policy, revision=p.revision)
    return Ref(env.tenant, env.policy, alias=p.alias)


def _with_prompt_ids(it: Pending, res: Any) -> bool:
    """The prompt's token ids travel back with its logprobs, or when asked for."""
    options = it.env.payload.sampling
    asked = options is not None and bool(options.return_prompt_token_ids)
    return asked or res.prompt_logprobs is not None


def reason(e: BaseException, *, plain: bool = False) -> str:
    """An error's text for an answer: its own words for refusals that name the fix (``plain``),
    prefixed with its type otherwise (which failed: AdapterMissing, EngineError, ...)."""
    return str(e) if plain and str(e) else f"{type(e).__name__}: {e}"


class Answers:
    """Builds one engine's answers and counts them in ``stats`` (completed, failed)."""

    def __init__(self, engine_id: str, base_model: str, stats: dict[str, int]) -> None:
        self.engine_id, self.base_model, self.stats = engine_id, base_model, stats
        self.producer_name = f"serving/{engine_id}"

    def completed(self, it: Pending, res: Any, t0: float, gen_ms: float, running: int):
        """``running``: requests in the engine beside this one when it finished."""
        s = res.samples[0]
        choices = None
        if len(res.samples) > 1:
            choices = [
                InferChoice(
                    index=i,
                    text=c.text,
                    finish_reason=_finish(c.finish_reason),
                    token_ids=c.token_ids,
                    logprobs=c.logprobs if it.env.payload.logprobs else None,
                    token_logprobs=c.token_logprobs,
                    stop_reason=c.stop_reason,
                )
                for i, c in enumerate(res.samples)
            ]
        queued = max(0.0, (t0 - it.received) * 1000 - it.load_wait_ms)
        latency_ms = (time.perf_counter() - it.received) * 1000
        done = self.event(
            it.env,
            InferCompleted(
                request_id=it.env.payload.request_id,
                revision=it.ref.revision,
                adapter_digest=it.ref.digest,
                engine_id=self.engine_id,
                text=s.text,
                finish_reason=_finish(s.finish_reason),
                prompt_tokens=len(res.prompt_token_ids),
                completion_tokens=sum(len(c.token_ids) for c in res.samples),
                latency_ms=latency_ms,
                cold_load=it.cold,
                alias=it.alias,
                token_ids=s.token_ids,
                queued_ms=queued,
                loading_ms=it.load_wait_ms,
                generating_ms=gen_ms,
                logprobs=s.logprobs if it.env.payload.logprobs else None,
                choices=choices,
                token_logprobs=s.token_logprobs,
                stop_reason=s.stop_reason,
                prompt_logprobs=res.prompt_logprobs,
                prompt_token_ids=res.prompt_token_ids if _with_prompt_ids(it, res) else None,
            ),
        )
        self.stats["completed"] += 1
        (metrics.INFER_COLD if it.cold else metrics.INFER_WARM).observe(latency_ms / 1000)
        with bound(it.env):  # answered later than handled: the request's ids again
            log.info(
                "request answered",
                request_id=it.env.payload.request_id,
                revision=it.ref.revision,
                cold_load=it.cold,
                latency_ms=round(latency_ms, 1),
                running=running,
            )
        return done

    def expired(
        self, env, ref: Ref, *, it: Pending | None = None, t0: float | None = None
    ) -> Envelope[Any]:
        return self.failed(
            env,
            ref,
            "expired",
            f"not run: the caller stopped waiting at "
            f"{env.payload.expires_at.isoformat()} (expires_at); send it again "
            "with a later deadline",
            it=it,
            t0=t0,
            retryable=True,
        )

    def cancelled(self, env, ref: Ref, *, it: Pending | None = None) -> Envelope[Any]:
        return self.failed(
            env,
            ref,
            "expired",
            "cancelled: the caller stopped waiting (infer.cancel)",
            it=it,
            code="cancelled",
        )

    def failed(
        self,
        env,
        ref: Ref,
        stage: str,
        error: str,
        *,
        it: Pending | None = None,
        t0: float | None = None,
        retryable: bool = False,
        code: str | None = None,
    ) -> Envelope[Any]:
        """``infer.failed`` at ``stage``; ``code`` (stage validate): the OpenAI error code."""
        started = it.received if it else (t0 or time.perf_counter())
        self.stats["failed"] += 1
        metrics.INFER_FAILURES.labels(stage).inc()
        with bound(env):
            log.warning(
                "request failed",
                request_id=env.payload.request_id,
                ref=str(ref),
                stage=stage,
                code=code,
                error=error[:300],
            )
        return self.event(
            env,
            InferFailed(
                request_id=env.payload.request_id,
                ref=str(ref),
                stage=stage,
                error=error[:4096],
                code=code,
                revision=it.ref.revision if it else None,
                adapter_digest=it.ref.digest if it else None,
                engine_id=self.engine_id,
                retryable=retryable,
                latency_ms=(time.perf_counter() - started) * 1000,
            ),
        )

    def load_request(
        self, cause, aref: Resolved, *, reason: str, demand: int, priority: int = 0
    ) -> Envelope[Any]:
        return make_event(
            LoadRequested(
                revision=aref.revision,
                adapter_digest=aref.digest,
                store_uri=aref.store_uri,
                base_model=self.base_model,
                engine_id=self.engine_id,
                priority=max(priority, min(9, demand)),
                reason=reason,
            ),
            tenant=aref.tenant,
            policy=aref.policy,
            producer=self.producer_name,
            caused_by=cause,
        )

    def event(self, cause: Envelope[Any], payload) -> Envelope[Any]:
        return make_reply(payload, cause, producer=self.producer_name)


def _finish(reason: str | None) -> str:
    """vLLM's finish reason as the contract spells it (an abort is answered as cancelled)."""
    return "stop" if reason == "stop" else "length"
