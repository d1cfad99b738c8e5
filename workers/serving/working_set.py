"""The working set of one engine: GPU slots, CPU cache and local disk cache, LRU with pins.

- disk: revisions fetched from the adapter store into a local folder (verified on fetch and again
  on every load into the engine, since local files can rot too);
- cpu: adapters the engine holds (vLLM's LoRA cache, ``max_cpu_loras``); this class evicts
  explicitly before vLLM would, so its view and vLLM's agree;
- gpu: the adapters of the latest batches (``max_loras``); vLLM activates them per step, the
  scheduler never puts more than ``max_loras`` distinct adapters in one batch.

Counters: hits, misses, loads, evictions (cpu and disk), failures; the same as Prometheus
metrics per tier (workers.serving.metrics).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from catalog.artifacts import MANIFEST_FILE
from catalog.exceptions import AdapterCorrupted, AdapterNotFound, BaseModelMismatch, CatalogError
from catalog.store import AdapterStore, StoredAdapter
from workers.serving import metrics
from workers.serving.engine import LoraHandle
from workers.serving.exceptions import (
    AdapterDigestMismatch,
    AdapterMissing,
    LoadError,
    LoraIdCollision,
    RankTooLarge,
    WorkingSetFull,
    WrongBaseModel,
)
from workers.serving.ids import lora_int_id, lora_name

log = structlog.get_logger()


class Lifecycle(Protocol):
    """The verbs an engine implements (VllmEngine; unit tests use a fake)."""

    def load(self, handle: LoraHandle) -> None: ...
    def pin(self, lora_id: int) -> None: ...
    def evict(self, lora_id: int) -> None: ...
    def list(self) -> set[int]: ...


@dataclass(frozen=True)
class AdapterRef:
    """A resolved revision: what to load and where it lies."""

    tenant: str
    policy: str
    revision: int
    digest: str
    store_uri: str


@dataclass
class Counters:
    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    disk_hits: int = 0
    disk_fetches: int = 0
    disk_evictions: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Entry:
    ref: AdapterRef
    handle: LoraHandle
    rank: int
    load_ms: float
    pinned: bool = False


EvictHook = Callable[[AdapterRef, str, str], None]  # (ref, tier, reason)


class WorkingSet:
    """Thread-safe; one per engine."""

    def __init__(
        self,
        engine: Lifecycle,
        store: AdapterStore,
        cache_dir: Path | str,
        *,
        base_model_fingerprint: str,
        max_loras: int,
        max_cpu_loras: int,
        max_disk_loras: int,
        max_lora_rank: int,
        on_evict: EvictHook | None = None,
    ) -> None:
        self.engine, self.store = engine, store
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint = base_model_fingerprint
        self.max_loras, self.max_cpu, self.max_disk = max_loras, max_cpu_loras, max_disk_loras
        self.max_rank = max_lora_rank
        self.on_evict = on_evict
        self.counters = Counters()
        self._cpu: OrderedDict[str, Entry] = OrderedDict()  # digest → entry, LRU first
        self._gpu: OrderedDict[str, None] = OrderedDict()
        self._disk: OrderedDict[str, Path] = OrderedDict()
        self._ids: dict[int, str] = {}
        self._lock = threading.RLock()
        metrics.set_capacity(max_loras, max_cpu_loras, max_disk_loras)
        self._occupancy()

    # Queries.

    def resident(self, digest: str) -> bool:
        with self._lock:
            return digest in self._cpu

    def handle(self, digest: str) -> LoraHandle:
        with self._lock:
            return self._cpu[digest].handle

    def list(self) -> list[dict]:
        """Every held adapter with its tier (gpu ⊂ cpu) and pin state."""
        with self._lock:
            rows = [
                {"digest": d, "revision": e.ref.revision, "policy": f"{e.ref.tenant}/{e.ref.policy}",
                 "lora_id": e.handle.lora_id, "tier": "gpu" if d in self._gpu else "cpu",
                 "pinned": e.pinned}
                for d, e in self._cpu.items()
            ]  # fmt: skip
            rows += [{"digest": d, "tier": "disk"} for d in self._disk if d not in self._cpu]
            return rows

    # Verbs.

    def ensure(self, ref: AdapterRef) -> LoraHandle:
        """Make ``ref`` resident in the engine (a hit, or a verified cold load)."""
        with self._lock:
            entry = self._cpu.get(ref.digest)
            if entry is not None:
                self.counters.hits += 1
                metrics.HIT["cpu"].inc()
                self._cpu.move_to_end(ref.digest)
                return entry.handle
            self.counters.misses += 1
            metrics.MISS["cpu"].inc()
            try:
                return self._load(ref)
            except LoadError as e:
                self.counters.failures += 1
                metrics.LOAD_FAILURES.labels(type(e).__name__).inc()
                raise
            finally:
                self._occupancy()

    def pin(self, ref: AdapterRef) -> LoraHandle:
        with self._lock:
            handle = self.ensure(ref)
            self._cpu[ref.digest].pinned = True
            self.engine.pin(handle.lora_id)
            return handle

    def unpin(self, digest: str) -> None:
        with self._lock:
            if digest in self._cpu:
                self._cpu[digest].pinned = False

    def evict(self, digest: str, reason: str = "requested") -> bool:
        with self._lock:
            entry = self._cpu.pop(digest, None)
            if entry is None:
                return False
            self._gpu.pop(digest, None)
            self._ids.pop(entry.handle.lora_id, None)
            self.engine.evict(entry.handle.lora_id)
            self.counters.evictions += 1
            metrics.EVICTIONS.labels("cpu", reason).inc()
            self._occupancy()
        log.info("adapter evicted", digest=digest, revision=entry.ref.revision, reason=reason)
        if self.on_evict:
            self.on_evict(entry.ref, "cpu", reason)
        return True

    def clear(self, reason: str = "shutdown") -> None:
        """Evict every adapter (pinned too) from the engine, e.g. before handing it on."""
        with self._lock:
            for digest in list(self._cpu):
                self.evict(digest, reason=reason)

    def used_in_batch(self, digests: list[str]) -> None:
        """Record that a batch ran with these adapters: they hold the GPU slots now."""
        with self._lock:
            for d in digests:
                (metrics.HIT if d in self._gpu else metrics.MISS)["gpu"].inc()
                self._gpu[d] = None
                self._gpu.move_to_end(d)
                if d in self._cpu:
                    self._cpu.move_to_end(d)
            while len(self._gpu) > self.max_loras:
                self._gpu.popitem(last=False)
            self._occupancy()

    # Internals.

    def _occupancy(self) -> None:
        metrics.set_occupancy(len(self._gpu), len(self._cpu), len(self._disk))

    def _load(self, ref: AdapterRef) -> LoraHandle:
        t0 = time.perf_counter()
        fetched = self.counters.disk_fetches
        local = self._fetch(ref)
        manifest = local.manifest
        if manifest.rank > self.max_rank:
            raise RankTooLarge(
                f"revision {ref.tenant}/{ref.policy}@{ref.revision} has rank {manifest.rank}, "
                f"above this engine's max_lora_rank={self.max_rank}; serve it on an engine with "
                "a larger max_lora_rank or export a lower rank"
            )
        lora_id = lora_int_id(ref.digest)
        other = self._ids.get(lora_id)
        if other is not None and other != ref.digest:
            raise LoraIdCollision(
                f"digests {ref.digest} and {other} map to the same LoRA id {lora_id}; evict "
                f"{other} first"
            )
        self._make_room()
        handle = LoraHandle(lora_id, lora_name(ref.digest), local.path)
        self.engine.load(handle)
        load_ms = (time.perf_counter() - t0) * 1000
        self._cpu[ref.digest] = Entry(ref, handle, manifest.rank, load_ms)
        self._ids[lora_id] = ref.digest
        self.counters.loads += 1
        source = "store" if self.counters.disk_fetches > fetched else "disk"
        metrics.LOADED_FROM[source].observe(load_ms / 1000)
        log.debug("adapter loaded", digest=ref.digest, revision=ref.revision, ms=round(load_ms, 2))
        return handle

    def _make_room(self) -> None:
        while len(self._cpu) >= self.max_cpu:
            victim = next((d for d, e in self._cpu.items() if not e.pinned), None)
            if victim is None:
                raise WorkingSetFull(
                    f"all {self.max_cpu} CPU slots (max_cpu_loras) hold pinned adapters; unpin "
                    "one or raise max_cpu_loras"
                )
            self.evict(victim, reason="lru")

    def _fetch(self, ref: AdapterRef) -> StoredAdapter:
        """The verified local copy of ``ref`` (fetched from the store on a disk miss)."""
        local = self.cache_dir / ref.digest.removeprefix("sha256:")
        try:
            if local in self._disk.values() or (local / MANIFEST_FILE).is_file():
                self.counters.disk_hits += 1
                metrics.HIT["disk"].inc()
            else:
                metrics.MISS["disk"].inc()
                src = self.store.open(ref.store_uri, owner=(ref.tenant, ref.policy),
                                      base_model_fingerprint=self.fingerprint)  # fmt: skip
                self._check_digest(ref, src.digest)
                tmp = self.cache_dir / f".{local.name}.{time.monotonic_ns()}"
                tmp.mkdir()
                for name in (*src.manifest.files, MANIFEST_FILE):  # the packed file too
                    shutil.copyfile(src.path / name, tmp / name)
                tmp.rename(local)
                self.counters.disk_fetches += 1
            self._disk[ref.digest] = local
            self._disk.move_to_end(ref.digest)
            # Verified on every load, not only on fetch.
            got = self.store.open_path(local, base_model_fingerprint=self.fingerprint)
            self._check_digest(ref, got.digest)
        except BaseModelMismatch as e:
            self._drop_disk(ref.digest)
            raise WrongBaseModel(str(e)) from e
        except AdapterCorrupted as e:
            self._drop_disk(ref.digest)
            raise AdapterDigestMismatch(str(e)) from e
        except (AdapterNotFound, FileNotFoundError) as e:
            self._drop_disk(ref.digest)
            raise AdapterMissing(
                f"revision {ref.tenant}/{ref.policy}@{ref.revision} ({ref.digest}) is not in the "
                f"store at {ref.store_uri}: {e}"
            ) from e
        except CatalogError as e:  # shape disagreements, NaN/Inf, unsafe format
            self._drop_disk(ref.digest)
            raise AdapterDigestMismatch(f"revision {ref.digest} failed verification: {e}") from e
        self._trim_disk()
        return got

    def _check_digest(self, ref: AdapterRef, digest: str) -> None:
        if digest != ref.digest:
            raise AdapterDigestMismatch(
                f"the catalog says revision {ref.tenant}/{ref.policy}@{ref.revision} has digest "
                f"{ref.digest}, but the files at {ref.store_uri} hash to {digest}; re-export the "
                "revision or fix the catalog entry"
            )

    def _drop_disk(self, digest: str) -> None:
        path = self._disk.pop(digest, None) or self.cache_dir / digest.removeprefix("sha256:")
        shutil.rmtree(path, ignore_errors=True)

    def _trim_disk(self) -> None:
        while len(self._disk) > self.max_disk:
            victim = next((d for d in self._disk if d not in self._cpu), None)
            if victim is None:
                return
            self._drop_disk(victim)
            self.counters.disk_evictions += 1
            metrics.EVICTIONS.labels("disk", "lru").inc()
