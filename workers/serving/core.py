"""The serving logic of one engine, without Kafka: resolve, wait for cold loads together, submit
ready requests in demand order to vLLM's asynchronous engine (workers.serving.flights: each
joins the running batch), answer every request (a result or an error result).

Cold loads are addressed to the engine that asked (``engine_id`` on ``load.requested``) and,
keyed by policy like the requests, land on the partition this engine consumes (README: routing).

The worker (workers.serving.worker) feeds it events from the topics and publishes what it
returns; the sweep benchmark drives it directly.

A request's failure is that request's answer, never a process exit: every per-request and
per-load step catches what it can raise and answers ``infer.failed`` (stage resolve, validate,
load, generate or expired, with the reason) or ``load.failed``. Only what is not the request's
fault propagates, to be waited out by the consumer loop: the catalog or the store being away
(``streams.records.is_transient``). Work leaves a queue only once it was answered: requests or
a load interrupted by an outage are put back and run again after it. Each request is admitted
alone before it is submitted (workers.serving.admission) and runs as its own vLLM request, so
a request vLLM still fails fails alone. A sweep (``sweep``, run by the
worker every poll) answers waiting requests whose deadline passed and asks again for loads that
did not come (``load_retry_s``); the waits for loads are workers.serving.loads. Duplicate
deliveries of one event id (an upstream that re-sent it) are answered once: the core remembers the ids it took (``dedupe_ids`` of them).

Work done after a request's record was handled (its cold load, its answer: the worker's
``before_commit`` and the engine's thread) logs with that request's correlation id bound, so one request can be
followed by its correlation id from the gateway through the engine to its result. Metrics:
workers.serving.metrics.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import structlog

from catalog.models import Resolved
from schemas.envelope import Envelope, make_event
from schemas.events import (
    AdapterEvicted,
    AdapterLoaded,
    AliasMoved,
    CanaryStarted,
    InferCancel,
    InferRequested,
    LoadRequested,
)
from streams.records import is_transient
from workers.serving import metrics
from workers.serving.answers import (
    Answers,
    Pending,
    bound,
    past_deadline,
    reason,
    request_ref,
)
from workers.serving.engine import GenRequest, LoraHandle
from workers.serving.exceptions import RequestRefused
from workers.serving.flights import Flights
from workers.serving.loads import PREFETCH, ColdLoads, adapter_key, load_ref
from workers.serving.resolution import ResolutionCache, route
from workers.serving.scheduler import DemandScheduler
from workers.serving.working_set import WorkingSet

log = structlog.get_logger()


class ServingCore:
    def __init__(
        self,
        engine: Any,  # VllmEngine (admit, generate)
        working_set: WorkingSet,
        resolver: ResolutionCache,
        *,
        engine_id: str,
        base_model: str,
        max_num_seqs: int = 32,
        max_in_flight: int | None = None,
        fifo: bool = False,
        load_retry_s: float = 30.0,
        dedupe_ids: int = 65_536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``load_retry_s``: ask again for a load that has not come after this long (its
        requests wait on); ``dedupe_ids``: how many recent request ids are remembered to answer
        a re-sent request once; ``max_in_flight``: requests submitted to vLLM at once
        (default twice ``max_num_seqs``: vLLM's own queue stays fed, and the rest wait here in
        demand order, where they can still expire or be cancelled)."""
        self.engine, self.ws, self.resolver = engine, working_set, resolver
        self.engine_id, self.base_model, self.max_num_seqs = engine_id, base_model, max_num_seqs
        self.dedupe_ids = dedupe_ids
        self.max_in_flight = max_in_flight or 2 * max_num_seqs
        self.producer_name = f"serving/{engine_id}"
        self.ready: DemandScheduler[Pending] = DemandScheduler(fifo=fifo)
        self._seen: OrderedDict[UUID, None] = OrderedDict()  # request ids taken, oldest first
        self.stats = {
            "completed": 0,
            "failed": 0,
            "waves": 0,
            "load_requests": 0,
            "loads_skipped": 0,
            "loads_reissued": 0,
            "duplicates": 0,
        }
        self.answers = Answers(engine_id, base_model, self.stats)
        self.loads = ColdLoads(
            working_set,
            self.answers,
            self.stats,
            engine_id=engine_id,
            base_model=base_model,
            load_retry_s=load_retry_s,
            clock=clock,
        )
        self.waiting = self.loads.waiting  # requests parked behind a load, by adapter key
        # serves(tenant, policy): does this engine own the policy's partition? (the worker sets
        # it from its assignment; alone, an engine serves everything)
        self.serves: Callable[[str, str], bool] = lambda tenant, policy: True
        # emit(events): hand results over as soon as each request finished (and each load ran)
        # instead of returning them (the worker publishes them at once). None: return them.
        # (emit may be called from the engine's thread, as requests finish.)
        self.emit: Callable[[list[Envelope[Any]]], None] | None = None
        # stream(delta, key): publish an infer.delta keyed by the reader (engine thread)
        self.stream: Callable[[Envelope[Any], str], None] | None = None
        self.flights = Flights(
            engine, self.answers, on_answer=self._answered, on_delta=self._streamed
        )
        # Events made but not handed over: evictions, and what was made before an outage
        # interrupted a load or a submission (drain_events; the worker publishes them at its
        # flush).
        self._later: list[Envelope[Any]] = []
        self.started_at = datetime.now(UTC)
        if working_set.on_evict is None:
            working_set.on_evict = self._on_evict

    def _on_evict(self, ref: Resolved, tier: str, reason: str) -> None:
        """Evictions become load.evicted events, published with the next batch of output."""
        self._later.append(
            make_event(
                AdapterEvicted(
                    engine_id=self.engine_id,
                    revision=ref.revision,
                    adapter_digest=ref.digest,
                    tier=tier,
                    reason=reason,
                ),
                tenant=ref.tenant,
                policy=ref.policy,
                producer=self.producer_name,
            )
        )

    def drain_events(self) -> list[Envelope[Any]]:
        out, self._later = self._later, []
        return out

    # Inputs.

    def seen(self, event_id: UUID) -> bool:
        """Was this request taken already (queued or answered)? A re-sent one is not taken
        again."""
        return event_id in self._seen

    def _take(self, event_id: UUID) -> None:
        self._seen[event_id] = None
        self._seen.move_to_end(event_id)
        while len(self._seen) > self.dedupe_ids:
            self._seen.popitem(last=False)

    def on_infer(self, env: Envelope[InferRequested]) -> list[Envelope[Any]]:
        """A request arrives: resolve it; queue it (resident) or park it behind a load request.
        A request whose event id was taken already gets nothing (it is answered once)."""
        if self.seen(env.event_id):
            self.stats["duplicates"] += 1
            metrics.DUPLICATES.inc()
            log.info("request delivered again; answered once", request_id=env.payload.request_id)
            return []
        t0 = time.perf_counter()
        ref = request_ref(env)
        if past_deadline(env):  # the caller gave up already: no resolve, nothing to load or run
            self._take(env.event_id)
            return [self.answers.expired(env, ref, t0=t0)]
        try:
            res = self.resolver.resolve(ref)
        except Exception as e:
            if is_transient(e):
                raise  # not the request's fault: the consumer loop waits the outage out
            self._take(env.event_id)
            return [self.answers.failed(env, ref, "resolve", reason(e, plain=True), t0=t0)]
        self._take(env.event_id)
        res = route(res, env.payload.caller or env.payload.request_id)
        pending = Pending(env, res, res.alias, received=t0)
        key = adapter_key(res)
        if self.ws.ready_for(res):
            self.ready.add(key, pending)
            return []
        return self.loads.wait(key, pending, ref)

    def on_alias_moved(self, env: Envelope[AliasMoved]) -> list[Envelope[Any]]:
        """Promotion/rollback: the next request sees the new target; prefetch its adapter."""
        res = self.resolver.apply(env)
        if res is None:
            return []
        # Moves from before this engine started (a replay of the topic) only refresh the cache;
        # only the engine that serves the policy prefetches its adapter.
        if env.occurred_at < self.started_at or self.ws.ready_for(res):
            return []
        if not self.serves(env.tenant, env.policy):
            return []
        return [self.loads.ask(env, res, reason=PREFETCH, priority=9)]

    def on_canary(self, env: Envelope[Any]) -> list[Envelope[Any]]:
        """A canary started or ended: the alias is resolved afresh on its next request; the
        engine that serves the policy prefetches a new canary's adapter."""
        self.resolver.apply(env)
        p = env.payload
        if not isinstance(p, CanaryStarted) or env.occurred_at < self.started_at:
            return []
        res = Resolved(env.tenant, env.policy, p.revision, p.adapter_digest, p.store_uri, p.alias)
        if self.ws.ready_for(res) or not self.serves(env.tenant, env.policy):
            return []
        return [self.loads.ask(env, res, reason=PREFETCH, priority=9)]

    def on_load_requests(self, envs: list[Envelope[LoadRequested]]) -> list[Envelope[Any]]:
        """This engine's share of the load topic (the partitions of the policies it serves):
        load in order of waiting demand. A load asked by another engine that nothing here waits
        for is skipped: that engine lost the partition, and its requests, now redelivered here,
        ask again. Each load's failure is its ``load.failed`` (and its waiters' answers); only
        an outage propagates, and the loads are safe to run again after it (a load done is a
        hit, or skipped when nothing waits)."""
        if not self.ready.fifo:  # the FIFO baseline loads in arrival order
            envs = sorted(envs, key=lambda e: (-self.loads.demand(e), -e.payload.priority))
        out: list[Envelope[Any]] = []
        loaded = 0
        try:
            for env in envs:
                with bound(env):
                    done = self.loads.load(env)
                if done is None:
                    continue
                out += done
                if isinstance(done[0].payload, AdapterLoaded):
                    loaded += 1
                    key = adapter_key(load_ref(env))
                    for it in self.loads.release(key):
                        self.ready.add(key, it)
                    # Serve the released requests now, before a later load of this poll could
                    # evict them.
                    out = self._hand_over(out + self.serve())
                else:
                    out = self._hand_over(out)
        except BaseException:
            self._later += out  # answers made before the outage still go out
            raise
        finally:
            if loaded:
                metrics.LOAD_WAVE.observe(loaded)
        return out

    def sweep(self) -> list[Envelope[Any]]:
        """Run by the worker every poll: expire waiting requests, ask again for loads that did
        not come (ColdLoads.sweep)."""
        return self.loads.sweep()

    def drop(self, event_ids: set[Any]) -> int:
        """Forget waiting and queued requests (their partitions moved to another engine, which
        gets them again from the committed offset). Returns how many were dropped."""

        def gone(it: Pending) -> bool:
            return it.env.event_id in event_ids

        dropped = self.ready.remove(gone) + self.loads.drop(gone)
        dropped += self.flights.drop(event_ids)  # running ones: aborted, unanswered here
        for it in dropped:  # if the partition comes back, they are taken again
            self._seen.pop(it.env.event_id, None)
        return len(dropped)

    # Generation: every ready request is submitted as soon as it is ready and joins vLLM's
    # running batch (continuous batching); its answer is made when vLLM finishes it.

    def serve(self) -> list[Envelope[Any]]:
        """Start ready requests, most waited-for adapters first, while fewer than
        ``max_in_flight`` run; returns the answers made meanwhile (refusals at admission, and
        the requests that finished, when no ``emit`` takes them as they come)."""
        out: list[Envelope[Any]] = []
        try:
            while len(self.ready) and self.in_flight < self.max_in_flight:
                room = self.max_in_flight - self.in_flight
                out += self._start(self.ready.next_wave(self.ws.max_loras, room))
                self.stats["waves"] += 1
        except BaseException:
            self._later += out
            raise
        return self._hand_over(out + self.flights.take_kept())

    @property
    def in_flight(self) -> int:
        """Requests submitted to the engine and not finished."""
        return len(self.flights)

    def _hand_over(self, out: list[Envelope[Any]]) -> list[Envelope[Any]]:
        """What is left to return: ``out`` itself, or nothing once ``emit`` took it."""
        if self.emit is None or not out:
            return out
        self.emit(out)
        return []

    def _start(self, wave: list[tuple[str, Pending]]) -> list[Envelope[Any]]:
        """Submit every request of ``wave``. An outage (the store away while a request's adapter
        is loaded again) puts the wave's requests not yet submitted back in the queue and
        propagates."""
        out: list[Envelope[Any]] = []
        for i, (_, it) in enumerate(wave):
            if past_deadline(it.env):  # waited past its deadline: answer so, spend no slot on it
                out.append(self.answers.expired(it.env, request_ref(it.env), it=it))
                continue
            try:
                handle = self.ws.ensure(it.ref)  # a hit unless evicted since it was queued
            except Exception as e:
                if is_transient(e):
                    self.ready.restore(wave[i:])
                    self._later += out
                    raise
                out.append(
                    self.answers.failed(it.env, request_ref(it.env), "load", reason(e), it=it)
                )
                continue
            try:
                gen = self.engine.admit(_gen_request(it, handle))
            except Exception as e:  # RequestRefused: what this engine cannot run
                code = e.code if isinstance(e, RequestRefused) else None
                out.append(
                    self.answers.failed(
                        it.env,
                        request_ref(it.env),
                        "validate",
                        reason(e, plain=code is not None),
                        it=it,
                        code=code,
                    )
                )
                continue
            self.ws.used_in_batch([it.ref.digest])
            self.flights.start(it, gen)
        return out

    def cancel(self, env: Envelope[InferCancel]) -> list[Envelope[Any]]:
        """The caller stopped waiting: abort its request if it runs (answered when vLLM ends
        it), or answer it now if it waits. Only the request's own tenant and policy may cancel
        it; a cancel for a request answered already, or not this engine's, changes nothing."""
        target = env.payload.request_event_id

        def own(it: Pending) -> bool:
            return (
                it.env.event_id == target
                and (it.env.tenant, it.env.policy) == (env.tenant, env.policy)
                and it.env.payload.request_id == env.payload.request_id
            )

        if self.flights.cancel(target, own):
            return []
        waiting = self.ready.remove(own) + self.loads.drop(own)
        return [self.answers.cancelled(it.env, request_ref(it.env), it=it) for it in waiting]

    def _answered(self, answer: Envelope[Any]) -> None:
        """(engine thread) A running request's answer: out now, or with the next ``serve``."""
        if self.emit is not None:
            self.emit([answer])
        else:
            self.flights.keep(answer)

    def _streamed(self, delta: Envelope[Any], key: str) -> None:
        if self.stream is not None:
            self.stream(delta, key)


def _gen_request(it: Pending, handle: LoraHandle) -> GenRequest:
    p = it.env.payload
    turns = tuple(m.model_dump() for m in p.messages) if p.messages else None
    # Token ids (the Tinker API's sample) run as they are; ``prompt`` is then only their label.
    prompt = list(p.prompt_token_ids) if p.prompt_token_ids is not None else p.prompt
    return GenRequest(
        prompt,
        p.max_tokens,
        p.temperature,
        p.seed,
        logprobs=p.logprobs,
        lora=handle,
        chat=p.chat,
        messages=turns,
        top_p=p.top_p,
        stop=tuple(p.stop),
        n=p.n,
        options=p.sampling,
    )
