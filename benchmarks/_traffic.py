"""The traffic of benchmarks/multi_engine.py (and tests/e2e/serving/test_multi_engine.py): Zipf
waves of ``infer.requested`` from an upstream producer, a collector of every result and load
event, the figures computed from what was sent and what came back, and ``--kill-one``'s kill -9
of one engine mid-traffic with what the survivors took over."""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from benchmarks._engine_group import Adapter, EngineGroup, partition_of, say
from schemas.settings import MintSettings

PROMPTS = ["hello world", "the cat sat", "2 + 2 =", "once upon a time", "red green blue"]


# ------------------------------------------------------------------ traffic and collection


@dataclass(frozen=True)
class Sent:
    request_id: str
    wave: int
    adapter: int  # index into the catalog
    tenant: str
    policy: str
    partition: int
    created_ms: int  # the envelope's occurred_at


def zipf_waves(
    n_adapters: int, per_wave: int, waves: int, s: float = 1.1, seed: int = 0
) -> list[list[int]]:
    """``waves`` lists of ``per_wave`` adapter indices, Zipf(s) over ``n_adapters`` (index 0 the
    most requested)."""
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) ** s for r in range(n_adapters)]
    return [rng.choices(range(n_adapters), weights=weights, k=per_wave) for _ in range(waves)]


class Upstream:
    """The upstream producer: ``infer.requested`` for ``tenant/policy@prod`` (confirmed sends)."""

    def __init__(
        self,
        settings: MintSettings,
        adapters: list[Adapter],
        *,
        tag: str | None = None,
        max_tokens: int = 8,
        seed: int = 0,
    ) -> None:
        from streams.producer import EventProducer

        self.settings, self.adapters, self.max_tokens = settings, adapters, max_tokens
        self.tag = tag or uuid.uuid4().hex[:6]
        self.rng = random.Random(seed)
        self.producer = EventProducer(settings, client_id="upstream")
        self.sent: list[Sent] = []

    def publish(self, wave: int, indices: list[int]) -> list[Sent]:
        from schemas import make_event
        from schemas.events import InferRequested

        envs, sent = [], []
        for i, a in enumerate(indices):
            ad = self.adapters[a]
            rid = f"{self.tag}-w{wave}-{i}"
            env = make_event(
                InferRequested(
                    request_id=rid,
                    prompt=self.rng.choice(PROMPTS),
                    alias="prod",
                    max_tokens=self.max_tokens,
                ),
                tenant=ad.tenant,
                policy=ad.policy,
                producer="bench/upstream",
            )
            envs.append(env)
            sent.append(
                Sent(
                    rid,
                    wave,
                    a,
                    ad.tenant,
                    ad.policy,
                    partition_of(ad.tenant, ad.policy, self.settings.topic_partitions),
                    int(env.occurred_at.timestamp() * 1000),
                )
            )
        self.producer.publish_many(envs)
        self.sent += sent
        return sent

    def close(self) -> None:
        self.producer.close()


@dataclass(frozen=True)
class Result:
    request_id: str
    ok: bool  # infer.completed (False: infer.failed)
    engine_id: str
    digest: str | None
    ts_ms: int  # the result record's timestamp
    cold: bool = False
    latency_ms: float = 0.0  # inside the engine: received → answered
    queued_ms: float = 0.0
    loading_ms: float = 0.0
    error: str = ""

    @classmethod
    def of(cls, p: Any, ts_ms: int) -> Result:
        """The row of an ``infer.completed`` or ``infer.failed`` payload."""
        from schemas.events import InferCompleted

        ok = isinstance(p, InferCompleted)
        head = (p.request_id, ok, p.engine_id, p.adapter_digest, ts_ms)
        if ok:
            return cls(*head, p.cold_load, p.latency_ms, p.queued_ms, p.loading_ms)
        return cls(*head, latency_ms=p.latency_ms, error=f"{p.stage}: {p.error}"[:300])


@dataclass(frozen=True)
class LoadEvent:
    kind: str  # load.requested / load.loaded / load.evicted / load.failed
    engine_id: str | None
    digest: str
    ts_ms: int


class Collector(threading.Thread):
    """Reads every record of the run's ``infer.results`` (read_committed), ``load.events`` and
    ``load.requests`` from the beginning, in the background."""

    TOPICS = ("infer.results", "load.events", "load.requests")

    def __init__(self, settings: MintSettings) -> None:
        super().__init__(name="collector", daemon=True)
        self.settings = settings
        self.results: dict[str, list[Result]] = defaultdict(list)
        self.loads: list[LoadEvent] = []
        self.records = 0
        self.halt = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def run(self) -> None:
        from schemas.events import InferCompleted, InferFailed
        from schemas.registry import decode_event
        from streams.follower import Follower

        try:
            with Follower(self.settings, client_id="bench-collector") as follower:
                tps = follower.partitions(*(self.settings.topic(t) for t in self.TOPICS))
                follower.assign(tps, "beginning")
                self.ready.set()
                for records in follower.follow(self.halt, timeout_ms=200):
                    for r in records:
                        env = decode_event(r.value)
                        p = env.payload
                        with self._lock:
                            self.records += 1
                            if isinstance(p, InferCompleted | InferFailed):
                                self.results[p.request_id].append(Result.of(p, r.timestamp))
                            elif hasattr(p, "adapter_digest"):
                                self.loads.append(
                                    LoadEvent(env.type, p.engine_id, p.adapter_digest, r.timestamp)
                                )
        except BaseException as e:  # surfaced by wait_answered
            self.error = e
            self.ready.set()

    def answered(self, ids: Iterable[str]) -> int:
        with self._lock:
            return sum(1 for i in ids if self.results.get(i))

    def load_events(self, kind: str | None = None, engine_id: str | None = None) -> list[LoadEvent]:
        with self._lock:
            return [
                ev
                for ev in self.loads
                if (kind is None or ev.kind == kind)
                and (engine_id is None or ev.engine_id == engine_id)
            ]

    def snapshot(self) -> tuple[dict[str, list[Result]], list[LoadEvent]]:
        with self._lock:
            return {k: list(v) for k, v in self.results.items()}, list(self.loads)

    def wait_answered(
        self,
        ids: Iterable[str],
        timeout_s: float,
        *,
        tick: Callable[[int], None] | None = None,
        check: Callable[[], None] | None = None,
    ) -> bool:
        """Wait until every request in ``ids`` has a result (False: timed out)."""
        ids = list(ids)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.error is not None:
                raise RuntimeError("the collector failed") from self.error
            n = self.answered(ids)
            if tick:
                tick(n)
            if n == len(ids):
                return True
            if time.monotonic() > deadline:
                return False
            if check:
                check()
            time.sleep(0.25)

    def __enter__(self) -> Collector:
        self.start()
        self.ready.wait(60)
        if self.error is not None:
            raise RuntimeError("the collector failed to start") from self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)


# ------------------------------------------------------------------ figures


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 1) if values else 0.0


def hot_decile(sent: list[Sent]) -> set[int]:
    """The hottest tenth of the requested adapters, by request count (ties: lower index)."""
    counts = Counter(s.adapter for s in sent)
    ranked = sorted(counts, key=lambda a: (-counts[a], a))
    return set(ranked[: max(1, math.ceil(len(ranked) / 10))])


def figures(
    sent: list[Sent],
    results: dict[str, list[Result]],
    loads: list[LoadEvent],
) -> dict[str, Any]:
    """The run's figures from what was sent and what the collector read."""
    first = {s.request_id: results[s.request_id][0] for s in sent if results.get(s.request_id)}
    ok = {rid: r for rid, r in first.items() if r.ok}
    failed = {rid: r for rid, r in first.items() if not r.ok}
    duplicates = sum(1 for s in sent if len(results.get(s.request_id, ())) > 1)
    served = {(r.engine_id, r.digest) for rs in results.values() for r in rs if r.ok}
    loaded = [ev for ev in loads if ev.kind == "load.loaded"]
    double = [ev for ev in loaded if (ev.engine_id, ev.digest) not in served]
    engines_of = defaultdict(set)
    for ev in loaded:
        engines_of[ev.digest].add(ev.engine_id)
    wait = {
        s.request_id: first[s.request_id].ts_ms - s.created_ms for s in sent if s.request_id in ok
    }
    lat = list(wait.values())
    waves = sorted({s.wave for s in sent})
    cold_by_wave = {w: set() for w in waves}
    for s in sent:
        r = ok.get(s.request_id)
        if r is not None and r.cold:
            cold_by_wave[s.wave].add(r.digest)
    hot = hot_decile(sent)
    hot_wait = [wait[s.request_id] for s in sent if s.adapter in hot and s.request_id in wait]
    by_engine = Counter(r.engine_id for r in ok.values())
    return {
        "requests": len(sent),
        "answered": len(ok),
        "failed": len(failed),
        "lost": len(sent) - len(first),
        "duplicates": duplicates,
        "double_loads": len(double),
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "mean_ms": mean(lat),
        "max_ms": round(max(lat), 1) if lat else 0.0,
        "hot_decile_adapters": len(hot),
        "hot_decile_requests": len(hot_wait),
        "hot_decile_mean_ms": mean(hot_wait),
        "engine_mean_queued_ms": mean([r.queued_ms for r in ok.values()]),
        "engine_mean_loading_ms": mean([r.loading_ms for r in ok.values()]),
        "waves": len(waves),
        "cold_load_waves": sum(1 for w in waves if cold_by_wave[w]),
        "cold_loads_by_wave": [len(cold_by_wave[w]) for w in waves],
        "adapters_requested": len({s.adapter for s in sent}),
        "loads": len(loaded),
        "adapters_loaded": len(engines_of),
        "adapters_loaded_on_several_engines": sum(1 for e in engines_of.values() if len(e) > 1),
        "answered_by_engine": dict(sorted(by_engine.items())),
        "errors": sorted({r.error for r in failed.values()})[:5],
    }


# ------------------------------------------------------------------ one engine killed mid-traffic


def kill_one(engines: EngineGroup, collector: Collector, sent: list[Sent], t0: float) -> dict:
    """kill -9 the last running engine; what it held and when."""
    members = engines.members()
    victim = engines.running[-1]
    parts = members.get(victim, set())
    answered_before = {s.request_id for s in sent if collector.answered([s.request_id])}
    engines.kill(victim)
    at = time.monotonic() - t0
    waiting = sum(1 for s in sent if s.partition in parts and s.request_id not in answered_before)
    say(
        f"killed -9 {victim} at {at:.1f} s: it held partitions {sorted(parts)} and "
        f"{waiting} unanswered requests"
    )
    return {
        "killed": victim,
        "killed_at_s": round(at, 1),
        "killed_at_ms": int(time.time() * 1000),
        "killed_partitions": sorted(parts),
        "waiting_at_kill": waiting,
        "answered_before_kill": answered_before,
    }


def taken_over(
    extra: dict, sent: list[Sent], results: dict[str, list[Result]], engines: EngineGroup
) -> dict[str, Any]:
    """Requests on the killed engine's partitions that the survivors answered after the kill."""
    parts = set(extra["killed_partitions"])
    mine = [s for s in sent if s.partition in parts]
    after = [
        s
        for s in mine
        if s.request_id not in extra["answered_before_kill"] and results.get(s.request_id)
    ]
    by_survivor = [s for s in after if results[s.request_id][0].engine_id != extra["killed"]]
    first_ts = min((results[s.request_id][0].ts_ms for s in by_survivor), default=None)
    skipped = sum(
        engines.log_count(e, "redelivered request was already answered")
        for e in engines.started
        if e != extra["killed"]
    )
    return {
        "killed": extra["killed"],
        "killed_at_s": extra["killed_at_s"],
        "killed_partitions": extra["killed_partitions"],
        "waiting_at_kill": extra["waiting_at_kill"],
        "taken_over": len(by_survivor),
        "takeover_s": round((first_ts - extra["killed_at_ms"]) / 1000, 1) if first_ts else None,
        "skipped_redelivered": skipped,
    }
