"""Engines as one consumer group, on real Kafka, Cassandra and vLLM engine processes.

One deployment for the module (benchmarks/_engine_group.py and _traffic.py are the harness:
catalog, engine processes, upstream producer, collector): a catalog of policies, engines ``e1`` and ``e2``
(``mint worker serving --engine-id``), requests published upstream and every result read back
from ``infer.results``. The tests run in order on it, never more than two engine processes at
once (the serving tests' session engine may be up beside them):

1. two engines share the traffic: each answers the policies of its partitions, loads only what
   it serves, every request is answered once;
2. ``e2`` is killed -9 while cold requests wait for their adapters: after the session timeout
   ``e1`` takes its partitions and every request is answered exactly once (what ``e2`` had
   answered already is skipped, not answered again);
3. ``e3`` joins while traffic flows (a rebalance mid-wave): every request answered exactly once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks import _engine_group as eg
from benchmarks import _traffic as tr

pytestmark = pytest.mark.slow

SKIPPED = "redelivered request was already answered"


@dataclass
class Deployment:
    settings: object
    adapters: list[eg.Adapter]
    engines: eg.EngineGroup
    collector: tr.Collector
    upstream: tr.Upstream
    used: set[int]  # adapter indices requested so far (the rest are cold everywhere)

    def cold(self, n: int, partitions: set[int] | None = None) -> list[int]:
        """``n`` adapters never requested (on ``partitions``, if given)."""
        out = []
        for i, a in enumerate(self.adapters):
            if i in self.used:
                continue
            if (
                partitions is None
                or eg.partition_of(a.tenant, a.policy, self.settings.topic_partitions) in partitions
            ):
                out.append(i)
            if len(out) == n:
                break
        assert len(out) == n, "the catalog ran out of cold adapters"
        return out

    def publish(self, indices: list[int], wave: int) -> list[tr.Sent]:
        self.used.update(indices)
        return self.upstream.publish(wave, indices)

    def answer_all(self, sent: list[tr.Sent], timeout_s: float = 240.0) -> dict:
        ids = [s.request_id for s in sent]
        ok = self.collector.wait_answered(ids, timeout_s, check=self.engines.check)
        time.sleep(2.0)  # a late second answer would land here
        results, loads = self.collector.snapshot()
        fig = tr.figures(sent, results, loads)
        assert ok, f"{fig['lost']} of {len(sent)} requests unanswered after {timeout_s} s"
        return fig


@pytest.fixture(scope="module")
def deployment(kafka_ready, cassandra_cluster, tiny_llama: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("multi-engine")
    settings = eg.run_settings(work, partitions=6)
    eg.prepare(settings)
    engines = eg.EngineGroup(settings, tiny_llama, work / "logs", max_loras=4, max_cpu_loras=64)
    collector = up = None
    try:
        engines.start("e1", "e2")  # they start while the catalog is built
        adapters = eg.build_catalog(settings, tiny_llama, 360, work)
        collector = tr.Collector(settings).__enter__()
        up = tr.Upstream(settings, adapters, max_tokens=4)
        # steady past the session: an engine that fell out right after joining shows here
        engines.wait_members(["e1", "e2"], timeout_s=400, steady_s=15)
        yield Deployment(settings, adapters, engines, collector, up, set())
    finally:
        engines.close()
        if up is not None:
            up.close()
        if collector is not None:
            collector.__exit__()
        eg.delete_topics(settings)
        eg.drop_keyspace(settings)


def test_two_engines_share_traffic_without_double_loads(deployment: Deployment) -> None:
    d = deployment
    members = d.engines.members()
    assert set(members) == {"e1", "e2"} and members["e1"].isdisjoint(members["e2"])
    owner = {p: e for e, parts in members.items() for p in parts}
    waves = tr.zipf_waves(60, 60, 2, seed=1)  # Zipf over 60 cold adapters, two waves
    sent = []
    for w, indices in enumerate(waves):
        sent += d.publish(indices, w)
        time.sleep(1.0)
    fig = d.answer_all(sent)
    assert fig["answered"] == fig["requests"] == len(sent)
    assert fig["lost"] == fig["failed"] == fig["duplicates"] == 0
    assert fig["double_loads"] == 0, "an engine loaded an adapter it did not serve"
    assert fig["adapters_loaded_on_several_engines"] == 0
    results, _ = d.collector.snapshot()
    for s in sent:  # each policy is answered by the engine that holds its partition
        assert results[s.request_id][0].engine_id == owner[s.partition], s
    assert set(fig["answered_by_engine"]) == {"e1", "e2"}
    assert fig["loads"] == fig["adapters_requested"]  # one load per adapter, where it is served


def test_kill_9_while_cold_requests_wait_survivor_answers_each_once(deployment) -> None:
    d = deployment
    members = d.engines.members()
    e2_parts = members["e2"]
    results, _ = d.collector.snapshot()
    # Adapters e2 holds already (answered in the first test) and cold ones on its partitions.
    warm = sorted(
        {
            s.adapter
            for s in d.upstream.sent
            if s.partition in e2_parts and results[s.request_id][0].engine_id == "e2"
        }
    )[:8]
    sent: list[tr.Sent] = []
    cold: list[int] = []
    # Per partition the cold requests come first and the warm ones after them: e2 answers the
    # warm ones at once while the cold ones hold the partition's offset back. Where e2 read the
    # cold ones a poll ahead of the warm ones, it loads and answers them first (the loads are
    # fast on the tiny model) and nothing waits at the first warm answer: then the wave is sent
    # again with other cold adapters (at most 3 waves; CI met one such wave in about 4 runs).
    for wave in range(10, 13):
        cold += (fresh := d.cold(40, e2_parts))
        batch = d.publish(fresh + d.cold(6, members["e1"]) + warm, wave=wave)
        sent += batch
        deadline = time.monotonic() + 120
        warm_ids = {s.request_id for s in batch if s.adapter in warm}
        while not d.collector.answered(warm_ids):  # e2 is serving this wave
            assert time.monotonic() < deadline, "e2 did not answer the warm requests"
            time.sleep(0.05)
        fresh_ids = [s.request_id for s in batch if s.adapter in fresh]
        if d.collector.answered(fresh_ids) < len(fresh_ids):
            break
    cold_ids = [s.request_id for s in sent if s.adapter in cold]
    waiting_at_kill = len(cold_ids) - d.collector.answered(cold_ids)
    d.engines.kill("e2")
    killed_at_ms = int(time.time() * 1000)
    fig = d.answer_all(sent)
    assert fig["answered"] == fig["requests"] == len(sent)
    assert fig["lost"] == fig["failed"] == fig["duplicates"] == 0
    assert waiting_at_kill > 0, "e2 had answered everything before the kill: nothing waited"
    results, _ = d.collector.snapshot()
    by_e1 = [s for s in sent if s.adapter in cold and results[s.request_id][0].engine_id == "e1"]
    assert by_e1, "no waiting request of e2's was answered by the survivor"
    assert min(results[s.request_id][0].ts_ms for s in by_e1) > killed_at_ms
    # The warm requests behind the held cold ones were redelivered to e1 and skipped.
    assert d.engines.log_count("e1", SKIPPED) >= 1
    assert set(d.engines.wait_members(["e1"], timeout_s=60)["e1"]) == set(range(6))


def test_rebalance_mid_wave_when_an_engine_joins_every_request_answered_once(deployment) -> None:
    d = deployment
    d.engines.start("e3")
    sent: list[tr.Sent] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    hot = sorted({s.adapter for s in d.upstream.sent})[:10]
    pool = d.cold(120)

    def traffic() -> None:  # a small wave every second while e3 starts and joins: warm + cold
        w = 100
        try:
            while not stop.is_set():
                sent.extend(d.publish(hot[w % 8 : w % 8 + 2] + pool[w - 100 : w - 99], w))
                w += 1
                stop.wait(1.0)
        except BaseException as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        d.engines.wait_members(["e1", "e3"], timeout_s=300)
        before = len(sent)
        stop.wait(5.0)  # traffic goes on after the rebalance too
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert 0 < before < len(sent)
    fig = d.answer_all(sent)
    assert fig["answered"] == fig["requests"] == len(sent)
    assert fig["lost"] == fig["failed"] == fig["duplicates"] == 0
    # A cold load under way when its partition moves to e3 may finish on e1 unused: a wasted
    # load, never a wrong or lost answer (1-2 per run at stops 38-39; steady traffic must have
    # none: the first test). More than the cold adapters asked before the rebalance would be a
    # leak of loads.
    cold = set(pool)
    asked_before = {s.adapter for s in sent[:before] if s.adapter in cold}
    assert fig["double_loads"] <= len(asked_before), (fig["double_loads"], len(asked_before))
    assert {"e1", "e3"} <= set(fig["answered_by_engine"])
    members = d.engines.members()
    assert members["e1"] | members["e3"] == set(range(6))
