"""Serving logic without vLLM or Kafka: LoRA ids, demand scheduling, the resolution cache, and the
working set (LRU, pins, counters, refusals) over a fake engine and a real adapter store."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from catalog.models import Resolved
from catalog.refs import Ref
from catalog.store import AdapterStore
from schemas.envelope import Envelope, make_event
from schemas.events import AliasMoved
from workers.serving.exceptions import (
    AdapterDigestMismatch,
    AdapterMissing,
    RankTooLarge,
    UnknownReward,
    WorkingSetFull,
    WrongBaseModel,
)
from workers.serving.ids import lora_int_id
from workers.serving.resolution import ResolutionCache
from workers.serving.rewards import get_reward
from workers.serving.scheduler import DemandScheduler
from workers.serving.working_set import WorkingSet

FP = "sha256:" + "ab" * 32
OTHER_FP = "sha256:" + "cd" * 32


def write_adapter(folder: Path, seed: int, rank: int = 4) -> Path:
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(2):
        for mod in ("q_proj", "v_proj"):
            key = f"base_model.model.model.layers.{layer}.self_attn.{mod}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, 32, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(32, rank, generator=g)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": ["q_proj", "v_proj"],
                "base_model_name_or_path": "tiny",
            }
        )
    )
    return folder


class FakeEngine:
    def __init__(self) -> None:
        self.loaded: dict[int, Path] = {}
        self.pinned: set[int] = set()
        self.calls: list[str] = []

    def load(self, handle) -> None:
        self.calls.append(f"load:{handle.lora_id}")
        self.loaded[handle.lora_id] = handle.path

    def pin(self, lora_id: int) -> None:
        self.pinned.add(lora_id)

    def evict(self, lora_id: int) -> None:
        self.calls.append(f"evict:{lora_id}")
        del self.loaded[lora_id]

    def list(self) -> set[int]:
        return set(self.loaded)


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "store")


def put(
    store: AdapterStore, tmp_path: Path, seed: int, rank: int = 4, fp: str = FP, policy: str = "p"
) -> Resolved:
    src = write_adapter(tmp_path / f"src{seed}-{uuid.uuid4().hex[:6]}", seed, rank)
    s = store.put(src, tenant="acme", policy=policy, base_model="tiny", base_model_fingerprint=fp)
    return Resolved("acme", policy, seed + 1, s.digest, s.uri)


def make_ws(store, tmp_path, engine, **kw) -> WorkingSet:
    opts = dict(max_loras=2, max_cpu_loras=3, max_disk_loras=10, max_lora_rank=8)
    opts.update(kw)
    return WorkingSet(engine, store, tmp_path / "cache", base_model_fingerprint=FP, **opts)


def test_lora_ids_are_stable_positive_and_content_derived() -> None:
    a, b = "sha256:" + "0" * 64, "sha256:" + "f" * 64
    assert lora_int_id(a) == lora_int_id(a)
    assert lora_int_id(a) != lora_int_id(b)
    assert all(1 <= lora_int_id(d) < 2**31 for d in (a, b))
    with pytest.raises(ValueError, match="64 lowercase hex"):
        lora_int_id("sha256:xyz")


def test_demand_waves_take_most_waiting_first_and_fifo_keeps_arrival_order() -> None:
    s: DemandScheduler[int] = DemandScheduler()
    arrivals = ["a", "b", "b", "c", "b", "c", "a", "d"]
    firsts = [s.add(k, i) for i, k in enumerate(arrivals)]
    assert firsts == [True, True, False, True, False, False, False, True]
    assert s.keys() == ["b", "a", "c", "d"]  # b:3, then a and c (2, a older), then d
    wave = s.next_wave(2)
    assert [k for k, _ in wave] == ["b", "b", "b", "a", "a"]
    assert s.keys() == ["c", "d"] and len(s) == 3

    f: DemandScheduler[int] = DemandScheduler(fifo=True)
    for i, k in enumerate(arrivals):
        f.add(k, i)
    assert [k for k, _ in f.next_wave(2)] == ["a", "b", "b"]  # stops before a third adapter
    assert f.take("c") == [3, 5]


def test_resolution_cache_ttl_and_alias_moved_invalidation() -> None:
    now = [0.0]
    calls: list[str] = []
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64

    def resolve(ref: Ref) -> Resolved:
        calls.append(str(ref))
        return Resolved("acme", "p", 1, d1, "file:///s/acme/p/1", "prod")

    cache = ResolutionCache(resolve, ttl_s=2.0, clock=lambda: now[0])
    assert cache.resolve("acme/p@prod").revision == 1
    assert cache.resolve("acme/p@prod").revision == 1 and len(calls) == 1
    now[0] = 3.0
    cache.resolve("acme/p@prod")
    assert len(calls) == 2  # expired
    moved = make_event(
        AliasMoved(
            alias="prod",
            from_revision=1,
            to_revision=2,
            adapter_digest=d2,
            store_uri="file:///s/acme/p/2",
            cause="promote",
        ),
        tenant="acme",
        policy="p",
        producer="test",
    )
    cache.apply(moved)
    got = cache.resolve("acme/p@prod")
    assert (got.revision, got.digest) == (2, d2) and len(calls) == 2
    cache.resolve("acme/p@1")
    now[0] = 1000.0
    cache.resolve("acme/p@1")
    assert calls.count("acme/p@1") == 1  # numbered refs never expire


def test_a_replayed_older_alias_move_never_takes_the_engines_alias_back() -> None:
    """Issue 25 (6): an operator replays serving.events; the engines kept serving the replayed
    older revision until the cache expired."""
    digests = {n: f"sha256:{n}" + "0" * 63 for n in range(1, 4)}

    def resolve(ref: str) -> Resolved:
        raise AssertionError("served from the moves alone")

    def move(to: int, seq: int | None, at_s: int) -> Envelope:
        env = make_event(
            AliasMoved(
                alias="prod",
                from_revision=to - 1 if to > 1 else None,
                to_revision=to,
                adapter_digest=digests[to],
                store_uri=f"file:///s/acme/p/{to}",
                cause="promote",
                seq=seq,
            ),
            tenant="acme",
            policy="p",
            producer="test",
        )
        return env.model_copy(update={"occurred_at": datetime(2026, 1, 1, 0, 0, at_s, tzinfo=UTC)})

    cache = ResolutionCache(resolve, ttl_s=1e9)
    old, new = move(2, seq=2, at_s=1), move(3, seq=3, at_s=2)
    assert cache.apply(old) is not None and cache.apply(new) is not None
    assert cache.apply(old) is None  # the replay: refused, no prefetch either
    assert cache.resolve("acme/p@prod").revision == 3
    assert cache.apply(move(2, seq=None, at_s=0)) is None  # no seq: ordered by time
    assert cache.apply(move(1, seq=4, at_s=0)) is not None  # a later rollback wins by seq
    assert cache.resolve("acme/p@prod").revision == 1 and cache.stale_moves == 2


def test_working_set_lru_pins_and_counters(store, tmp_path) -> None:
    engine = FakeEngine()
    ws = make_ws(store, tmp_path, engine)
    refs = [put(store, tmp_path, i) for i in range(4)]
    h0 = ws.ensure(refs[0])
    assert ws.ensure(refs[0]) == h0
    ws.pin(refs[1])
    ws.ensure(refs[2])
    ws.ensure(refs[0])  # refresh 0: now 2 is the least recently used unpinned one
    ws.ensure(refs[3])
    assert not ws.resident(refs[2].digest)
    assert {r.digest for r in refs if ws.resident(r.digest)} == {
        refs[0].digest,
        refs[1].digest,
        refs[3].digest,
    }
    assert engine.list() == {ws.handle(r.digest).lora_id for r in (refs[0], refs[1], refs[3])}
    c = ws.counters.as_dict()
    assert (c["hits"], c["misses"], c["loads"], c["evictions"]) == (2, 4, 4, 1)
    ws.ensure(refs[2])  # back from the local disk cache, not the store
    assert ws.counters.disk_hits >= 1 and ws.counters.disk_fetches == 4
    ws.used_in_batch([refs[3].digest, refs[2].digest])  # ensure(2) evicted 0, the LRU one
    tiers = {row["digest"]: row["tier"] for row in ws.list()}
    assert tiers[refs[3].digest] == "gpu" and tiers[refs[1].digest] == "cpu"
    assert tiers[refs[0].digest] == "disk"
    # All slots pinned: a clear refusal, not a silent eviction of a pinned adapter.
    full = make_ws(store, tmp_path / "b", FakeEngine(), max_cpu_loras=2)
    full.pin(refs[0])
    full.pin(refs[1])
    with pytest.raises(WorkingSetFull, match="max_cpu_loras"):
        full.ensure(refs[2])


def test_working_set_refusals(store, tmp_path) -> None:
    ws = make_ws(store, tmp_path, FakeEngine())
    good = put(store, tmp_path, 7)
    with pytest.raises(RankTooLarge, match="max_lora_rank=8"):
        ws.ensure(put(store, tmp_path, 8, rank=16))
    with pytest.raises(WrongBaseModel, match="fingerprint"):
        ws.ensure(put(store, tmp_path, 9, fp=OTHER_FP))
    missing = Resolved(
        "acme", "p", 5, "sha256:" + "9" * 64, store.uri_for("acme", "p", "sha256:" + "9" * 64)
    )
    with pytest.raises(AdapterMissing, match="not in the store"):
        ws.ensure(missing)
    bad = put(store, tmp_path, 10)
    weights = Path(bad.store_uri.removeprefix("file://")) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(AdapterDigestMismatch, match="digest"):
        ws.ensure(bad)
    lying = Resolved("acme", "p", 11, "sha256:" + "7" * 64, good.store_uri)
    with pytest.raises(AdapterDigestMismatch, match="catalog says"):
        ws.ensure(lying)
    assert ws.ensure(good) and ws.counters.failures == 5


def test_reward_registry() -> None:
    assert get_reward("distinct")("p", "x", [1, 1, 2, 2]) == 0.5
    assert get_reward("digits")("p", "a1b2", [1]) == 0.5
    with pytest.raises(UnknownReward, match="not registered"):
        get_reward("nope")


def test_scheduler_removes_items_in_both_modes() -> None:
    from workers.serving.scheduler import DemandScheduler

    for fifo in (False, True):
        s: DemandScheduler[int] = DemandScheduler(fifo=fifo)
        for i, key in enumerate("aabbc"):
            s.add(key, i)
        assert sorted(s.remove(lambda i: i % 2 == 0)) == [0, 2, 4]
        assert len(s) == 2 and s.demand("c") == 0 and s.keys() == ["a", "b"]
