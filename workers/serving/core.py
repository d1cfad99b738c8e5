"""The serving logic of one engine, without Kafka: resolve, wait for cold loads together, run
demand-ordered waves, answer every request (a result or an error result).

Cold loads are addressed to the engine that asked (``engine_id`` on ``load.requested``) and,
keyed by policy like the requests, land on the partition this engine consumes (README: routing).

The worker (workers.serving.worker) feeds it events from the topics and publishes what it
returns; the sweep benchmark drives it directly.

Work done after a request's record was handled (its cold load, the wave that answers it: the
worker's ``before_commit``) logs with that request's correlation id bound, so one request can be
followed by its correlation id from the gateway through the engine to its result. Metrics:
workers.serving.metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from catalog.exceptions import CatalogError, CatalogUnavailable
from schemas.envelope import Envelope, make_event
from schemas.events import (
    AdapterEvicted,
    AdapterLoaded,
    AliasMoved,
    InferCompleted,
    InferFailed,
    InferRequested,
    LoadFailed,
    LoadRequested,
)
from schemas.logs import bound_event
from workers.serving import metrics
from workers.serving.engine import GenRequest
from workers.serving.exceptions import EngineError, LoadError
from workers.serving.resolution import ResolutionCache
from workers.serving.scheduler import DemandScheduler
from workers.serving.working_set import AdapterRef, WorkingSet

log = structlog.get_logger()


@dataclass
class Pending:
    env: Envelope[InferRequested]
    ref: AdapterRef
    alias: str | None
    received: float = field(default_factory=time.perf_counter)
    load_wait_ms: float = 0.0
    cold: bool = False


def _past_deadline(env: Envelope[InferRequested]) -> bool:
    """Has the caller's deadline passed? (wall clocks: engines and gateways keep NTP time)"""
    deadline = env.payload.expires_at
    return deadline is not None and datetime.now(UTC) >= deadline


def _bound(env: Envelope[Any]):
    """Bind ``env``'s ids to every log line inside (as the consumer loop does for a record)."""
    return bound_event(event_id=str(env.event_id), type=env.type, policy=env.policy_id,
                       correlation_id=str(env.correlation_id))  # fmt: skip


def ref_text(env: Envelope[InferRequested]) -> str:
    p = env.payload
    return f"{env.tenant}/{env.policy}@{p.revision if p.revision is not None else p.alias}"


class ServingCore:
    def __init__(
        self,
        engine: Any,  # VllmEngine (generate)
        working_set: WorkingSet,
        resolver: ResolutionCache,
        *,
        engine_id: str,
        base_model: str,
        max_num_seqs: int = 32,
        fifo: bool = False,
    ) -> None:
        self.engine, self.ws, self.resolver = engine, working_set, resolver
        self.engine_id, self.base_model, self.max_num_seqs = engine_id, base_model, max_num_seqs
        self.producer_name = f"serving/{engine_id}"
        self.ready: DemandScheduler[Pending] = DemandScheduler(fifo=fifo)
        self.waiting: DemandScheduler[Pending] = DemandScheduler()
        self._wait_since: dict[str, float] = {}
        self.stats = {"completed": 0, "failed": 0, "waves": 0, "load_requests": 0,
                      "loads_skipped": 0}  # fmt: skip
        # serves(tenant, policy): does this engine own the policy's partition? (the worker sets
        # it from its assignment; alone, an engine serves everything)
        self.serves: Callable[[str, str], bool] = lambda tenant, policy: True
        # emit(events): hand results over as soon as each wave (and each load) ran, instead of
        # returning them when the whole batch is done (the worker publishes them at once, so the
        # most waited-for adapters' answers are out before the later waves run). None: return.
        self.emit: Callable[[list[Envelope[Any]]], None] | None = None
        self._evicted: list[Envelope[Any]] = []
        self.started_at = datetime.now(UTC)
        if working_set.on_evict is None:
            working_set.on_evict = self._on_evict

    def _on_evict(self, ref: AdapterRef, tier: str, reason: str) -> None:
        """Evictions become load.evicted events, published with the next batch of output."""
        self._evicted.append(make_event(
            AdapterEvicted(engine_id=self.engine_id, revision=ref.revision,
                           adapter_digest=ref.digest, tier=tier, reason=reason),
            tenant=ref.tenant, policy=ref.policy, producer=self.producer_name))  # fmt: skip

    def drain_events(self) -> list[Envelope[Any]]:
        out, self._evicted = self._evicted, []
        return out

    # Inputs.

    def on_infer(self, env: Envelope[InferRequested]) -> list[Envelope[Any]]:
        """A request arrives: resolve it; queue it (resident) or park it behind a load request."""
        t0 = time.perf_counter()
        ref = ref_text(env)
        if _past_deadline(env):  # the caller gave up already: no resolve, nothing to load or run
            return [self._expired(env, ref, t0=t0)]
        try:
            res = self.resolver.resolve(ref)
        except CatalogUnavailable:
            raise  # not the request's fault: the consumer loop waits the outage out
        except CatalogError as e:
            return [self._failed(env, ref, "resolve", str(e), t0=t0)]
        aref = AdapterRef(res.tenant, res.policy, res.revision, res.digest, res.store_uri)
        pending = Pending(env, aref, res.alias, received=t0)
        if self.ws.resident(aref.digest):
            self.ready.add(aref.digest, pending)
            return []
        pending.cold = True
        first = self.waiting.add(aref.digest, pending)
        if not first:
            return []  # it waits with the others for the same adapter
        self._wait_since[aref.digest] = t0
        self.stats["load_requests"] += 1
        return [self._load_request(env, aref, reason="cold request")]

    def on_alias_moved(self, env: Envelope[AliasMoved]) -> list[Envelope[Any]]:
        """Promotion/rollback: the next request sees the new target; prefetch its adapter."""
        res = self.resolver.apply(env)
        # Moves from before this engine started (a replay of the topic) only refresh the cache;
        # only the engine that serves the policy prefetches its adapter.
        if res is None or env.occurred_at < self.started_at or self.ws.resident(res.digest):
            return []
        if not self.serves(env.tenant, env.policy):
            return []
        aref = AdapterRef(res.tenant, res.policy, res.revision, res.digest, res.store_uri)
        return [self._load_request(env, aref, reason="promotion prefetch", priority=9)]

    def on_load_requests(self, envs: list[Envelope[LoadRequested]]) -> list[Envelope[Any]]:
        """This engine's share of the load topic (the partitions of the policies it serves):
        load in order of waiting demand. A load asked by another engine that nothing here waits
        for is skipped: that engine lost the partition, and its requests, now redelivered here,
        ask again."""
        if not self.ready.fifo:  # the FIFO baseline loads in arrival order
            envs = sorted(envs, key=lambda e: (-self.waiting.demand(e.payload.adapter_digest),
                                               -e.payload.priority))  # fmt: skip
        out: list[Envelope[Any]] = []
        loaded = 0
        for env in envs:
            with _bound(env):
                p = env.payload
                mine = p.engine_id in (None, self.engine_id)
                if not mine and self.waiting.demand(p.adapter_digest) == 0:
                    self.stats["loads_skipped"] += 1
                    continue
                if (
                    self.ws.resident(p.adapter_digest)
                    and self.waiting.demand(p.adapter_digest) == 0
                ):
                    continue  # asked twice (a redelivery, or requests dropped and asked again)
                aref = AdapterRef(env.tenant, env.policy, p.revision, p.adapter_digest, p.store_uri)
                t0 = time.perf_counter()
                try:
                    if p.base_model != self.base_model:
                        raise LoadError(
                            f"load of {aref.digest} asks for base model {p.base_model!r} but engine "
                            f"{self.engine_id} serves {self.base_model!r}; route it to that model"
                        )
                    self.ws.ensure(aref)
                except LoadError as e:
                    out.append(self._event(env, LoadFailed(
                        engine_id=self.engine_id, revision=p.revision, adapter_digest=aref.digest,
                        error=f"{type(e).__name__}: {e}"[:4096], retryable=e.retryable)))  # fmt: skip
                    out += self._fail_waiting(aref.digest, f"{type(e).__name__}: {e}", e.retryable)
                    continue
                ms = (time.perf_counter() - t0) * 1000
                loaded += 1
                log.info("adapter loaded", revision=p.revision, digest=aref.digest,
                         load_ms=round(ms, 1), waiting=self.waiting.demand(aref.digest))  # fmt: skip
                out.append(self._event(env, AdapterLoaded(engine_id=self.engine_id,
                                                          revision=p.revision,
                                                          adapter_digest=aref.digest,
                                                          tier="cpu", load_ms=ms)))  # fmt: skip
                self._release(aref.digest)
                # Serve the released requests now, before a later load of this wave could evict
                # them.
                out = self._hand_over(out + self.serve())
        if loaded:
            metrics.LOAD_WAVE.observe(loaded)
        return out

    def drop(self, event_ids: set[Any]) -> int:
        """Forget waiting and queued requests (their partitions moved to another engine, which
        gets them again from the committed offset). Returns how many were dropped."""

        def gone(it: Pending) -> bool:
            return it.env.event_id in event_ids

        dropped = self.ready.remove(gone) + self.waiting.remove(gone)
        for digest in [d for d in self._wait_since if self.waiting.demand(d) == 0]:
            del self._wait_since[digest]
        return len(dropped)

    # Generation.

    def serve(self) -> list[Envelope[Any]]:
        """Run every ready request in waves of at most max_loras adapters."""
        out: list[Envelope[Any]] = []
        while len(self.ready):
            wave = self.ready.next_wave(self.ws.max_loras, self.max_num_seqs)
            out = self._hand_over(out + self._run_wave(wave))
        return out

    def _hand_over(self, out: list[Envelope[Any]]) -> list[Envelope[Any]]:
        """What is left to return: ``out`` itself, or nothing once ``emit`` took it."""
        if self.emit is None or not out:
            return out
        self.emit(out)
        return []

    def _run_wave(self, wave: list[tuple[str, Pending]]) -> list[Envelope[Any]]:
        out: list[Envelope[Any]] = []
        batch: list[tuple[Pending, GenRequest]] = []
        for _, it in wave:
            if _past_deadline(it.env):  # waited past its deadline: answer so, spend no slot on it
                out.append(self._expired(it.env, ref_text(it.env), it=it))
                continue
            try:
                handle = self.ws.ensure(it.ref)  # a hit unless evicted since it was queued
            except LoadError as e:
                out.append(self._failed(it.env, ref_text(it.env), "load", f"{type(e).__name__}: "
                                        f"{e}", it=it))  # fmt: skip
                continue
            p = it.env.payload
            turns = tuple(m.model_dump() for m in p.messages) if p.messages else None
            batch.append((it, GenRequest(p.prompt, p.max_tokens, p.temperature, p.seed,
                                         logprobs=p.logprobs, lora=handle, chat=p.chat,
                                         messages=turns, top_p=p.top_p,
                                         stop=tuple(p.stop))))  # fmt: skip
        if not batch:
            return out
        adapters = list(dict.fromkeys(it.ref.digest for it, _ in batch))
        self.ws.used_in_batch(adapters)
        metrics.WAVE_REQUESTS.observe(len(batch))
        metrics.WAVE_ADAPTERS.observe(len(adapters))
        t0 = time.perf_counter()
        try:
            results = self.engine.generate([g for _, g in batch])
        except EngineError as e:
            return out + [self._failed(it.env, ref_text(it.env), "generate", str(e), it=it)
                          for it, _ in batch]  # fmt: skip
        gen_ms = (time.perf_counter() - t0) * 1000
        metrics.GENERATE_SECONDS.observe(gen_ms / 1000)
        self.stats["waves"] += 1
        for (it, _), res in zip(batch, results, strict=True):
            s = res.samples[0]
            queued = max(0.0, (t0 - it.received) * 1000 - it.load_wait_ms)
            latency_ms = (time.perf_counter() - it.received) * 1000
            out.append(self._event(it.env, InferCompleted(
                request_id=it.env.payload.request_id, revision=it.ref.revision,
                adapter_digest=it.ref.digest, engine_id=self.engine_id, text=s.text,
                finish_reason="stop" if s.finish_reason == "stop" else "length",
                prompt_tokens=len(res.prompt_token_ids), completion_tokens=len(s.token_ids),
                latency_ms=latency_ms, cold_load=it.cold,
                alias=it.alias, token_ids=s.token_ids, queued_ms=queued,
                loading_ms=it.load_wait_ms, generating_ms=gen_ms,
                logprobs=s.logprobs if it.env.payload.logprobs else None)))  # fmt: skip
            self.stats["completed"] += 1
            (metrics.INFER_COLD if it.cold else metrics.INFER_WARM).observe(latency_ms / 1000)
            with _bound(it.env):  # answered later than handled: the request's ids again
                log.info("request answered", request_id=it.env.payload.request_id,
                         revision=it.ref.revision, cold_load=it.cold,
                         latency_ms=round(latency_ms, 1), wave=len(batch))  # fmt: skip
        return out

    # Helpers.

    def _release(self, digest: str) -> None:
        since = self._wait_since.pop(digest, time.perf_counter())
        for it in self.waiting.take(digest):
            it.load_wait_ms = (time.perf_counter() - max(since, it.received)) * 1000
            self.ready.add(digest, it)

    def _fail_waiting(self, digest: str, error: str, retryable: bool) -> list[Envelope[Any]]:
        self._wait_since.pop(digest, None)
        return [
            self._failed(it.env, ref_text(it.env), "load", error, it=it, retryable=retryable)
            for it in self.waiting.take(digest)
        ]

    def _expired(self, env, ref: str, *, it: Pending | None = None,
                 t0: float | None = None) -> Envelope[Any]:  # fmt: skip
        return self._failed(env, ref, "expired", f"not run: the caller stopped waiting at "
                            f"{env.payload.expires_at.isoformat()} (expires_at); send it again "
                            "with a later deadline", it=it, t0=t0, retryable=True)  # fmt: skip

    def _failed(self, env, ref: str, stage: str, error: str, *, it: Pending | None = None,
                t0: float | None = None, retryable: bool = False) -> Envelope[Any]:  # fmt: skip
        started = it.received if it else (t0 or time.perf_counter())
        self.stats["failed"] += 1
        metrics.INFER_FAILURES.labels(stage).inc()
        with _bound(env):
            log.warning("request failed", request_id=env.payload.request_id, ref=ref, stage=stage,
                        error=error[:300])  # fmt: skip
        return self._event(env, InferFailed(
            request_id=env.payload.request_id, ref=ref, stage=stage, error=error[:4096],
            revision=it.ref.revision if it else None,
            adapter_digest=it.ref.digest if it else None, engine_id=self.engine_id,
            retryable=retryable, latency_ms=(time.perf_counter() - started) * 1000))  # fmt: skip

    def _load_request(self, cause, aref: AdapterRef, *, reason: str, priority: int = 0):
        demand = self.waiting.demand(aref.digest)
        return make_event(
            LoadRequested(revision=aref.revision, adapter_digest=aref.digest,
                          store_uri=aref.store_uri, base_model=self.base_model,
                          engine_id=self.engine_id,
                          priority=max(priority, min(9, demand)), reason=reason),
            tenant=aref.tenant, policy=aref.policy, producer=self.producer_name, caused_by=cause,
        )  # fmt: skip

    def _event(self, cause: Envelope[Any], payload) -> Envelope[Any]:
        return make_event(payload, tenant=cause.tenant, policy=cause.policy,
                          producer=self.producer_name, caused_by=cause)  # fmt: skip
