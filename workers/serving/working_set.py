"""The working set of one engine: GPU slots, CPU cache and local disk cache, LRU with pins.

- disk: revisions fetched from the adapter store into a local folder (verified on fetch and again
  on every load into the engine, since local files can rot too);
- cpu: adapters the engine holds (vLLM's LoRA cache, ``max_cpu_loras``); this class evicts
  explicitly before vLLM would, so its view and vLLM's agree;
- gpu: the adapters of the latest batches (``max_loras``); vLLM activates them per step, the
  scheduler never puts more than ``max_loras`` distinct adapters in one batch.

Keyed by digest (the content), but used by owner: two policies may hold the same bytes, and a
reference names its own copy. Every use checks that the reference's tenant/policy has its own
verified copy of the digest in the store (once per owner and digest, then remembered), a cache
hit or a resident adapter included; a foreign digest is answered exactly as a missing one, so
the answer says nothing about whether the digest exists under another owner.

Store and file errors become load errors of the reference (workers.serving.store_errors): an
unavailable store is waited out, anything else fails that load loudly. vLLM refusing verified
files is EngineRefusedAdapter.

Counters: hits, misses, loads, evictions (cpu and disk), failures; the same as Prometheus
metrics per tier (workers.serving.metrics).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from catalog.artifacts import MANIFEST_FILE
from catalog.models import Resolved
from catalog.store import AdapterStore, StoredAdapter
from workers.serving import metrics
from workers.serving.engine import LoraHandle
from workers.serving.exceptions import (
    AdapterDigestMismatch,
    EngineError,
    EngineRefusedAdapter,
    LoadError,
    LoraIdCollision,
    RankTooLarge,
    WorkingSetFull,
)
from workers.serving.ids import lora_int_id, lora_name
from workers.serving.store_errors import load_error

log = structlog.get_logger()


class Lifecycle(Protocol):
    """The verbs an engine implements (VllmEngine; unit tests use a fake)."""

    def load(self, handle: LoraHandle) -> None: ...
    def pin(self, lora_id: int) -> None: ...
    def evict(self, lora_id: int) -> None: ...
    def list(self) -> set[int]: ...


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
    ref: Resolved
    handle: LoraHandle
    rank: int
    load_ms: float
    pinned: bool = False


EvictHook = Callable[[Resolved, str, str], None]  # (ref, tier, reason)


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
        # digest → (tenant, policy) whose own store copy was verified to hold it
        self._owners: dict[str, set[tuple[str, str]]] = {}
        self._lock = threading.RLock()
        metrics.set_capacity(max_loras, max_cpu_loras, max_disk_loras)
        self._occupancy()

    # Queries.

    def resident(self, digest: str) -> bool:
        """Are these bytes in the engine (for some owner)? ``ready_for`` asks for one owner."""
        with self._lock:
            return digest in self._cpu

    def ready_for(self, ref: Resolved) -> bool:
        """Would ``ensure(ref)`` be a hit without a store read (resident, owner verified)?"""
        with self._lock:
            return ref.digest in self._cpu and _owner(ref) in self._owners.get(ref.digest, ())

    def handle(self, digest: str) -> LoraHandle:
        with self._lock:
            return self._cpu[digest].handle

    def list(self) -> list[dict]:
        """Every held adapter with its tier (gpu ⊂ cpu) and pin state."""
        with self._lock:
            rows = [
                {
                    "digest": d,
                    "revision": e.ref.revision,
                    "policy": f"{e.ref.tenant}/{e.ref.policy}",
                    "lora_id": e.handle.lora_id,
                    "tier": "gpu" if d in self._gpu else "cpu",
                    "pinned": e.pinned,
                }
                for d, e in self._cpu.items()
            ]
            rows += [{"digest": d, "tier": "disk"} for d in self._disk if d not in self._cpu]
            return rows

    # Verbs.

    def ensure(self, ref: Resolved) -> LoraHandle:
        """Make ``ref`` resident in the engine (a hit, or a verified cold load), for ``ref``'s
        own tenant/policy only (checked on every use, a hit included)."""
        with self._lock:
            try:
                entry = self._cpu.get(ref.digest)
                if entry is not None:
                    self._vouch(ref)
                    self.counters.hits += 1
                    metrics.HIT["cpu"].inc()
                    self._cpu.move_to_end(ref.digest)
                    return entry.handle
                self.counters.misses += 1
                metrics.MISS["cpu"].inc()
                return self._load(ref)
            except LoadError as e:
                self.counters.failures += 1
                metrics.LOAD_FAILURES.labels(type(e).__name__).inc()
                raise
            finally:
                self._occupancy()

    def pin(self, ref: Resolved) -> LoraHandle:
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
            self._forget_owners(digest)
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

    def _load(self, ref: Resolved) -> LoraHandle:
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
        try:
            self.engine.load(handle)
        except EngineError as e:
            raise EngineRefusedAdapter(
                f"the engine refused revision {ref.tenant}/{ref.policy}@{ref.revision} "
                f"({ref.digest}) after it passed verification: {e}"
            ) from e
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

    def _vouch(self, ref: Resolved) -> StoredAdapter | None:
        """Check that ``ref``'s own tenant/policy holds ``ref.digest`` in the store (once per
        owner and digest): the store copy is opened with that owner and verified. Returns it,
        or None when this owner was verified before."""
        if _owner(ref) in self._owners.get(ref.digest, ()):
            return None
        with self._errors(ref, drop=False):
            src = self.store.open(
                ref.store_uri, owner=_owner(ref), base_model_fingerprint=self.fingerprint
            )
            self._check_digest(ref, src.digest)
        self._owners.setdefault(ref.digest, set()).add(_owner(ref))
        return src

    def _fetch(self, ref: Resolved) -> StoredAdapter:
        """The verified local copy of ``ref`` (fetched from the store on a disk miss)."""
        local = self.cache_dir / ref.digest.removeprefix("sha256:")
        src = self._vouch(ref)
        if (local / MANIFEST_FILE).is_file():
            self.counters.disk_hits += 1
            metrics.HIT["disk"].inc()
        else:
            metrics.MISS["disk"].inc()
            self._copy(ref, src or self._reopen(ref), local)
            self.counters.disk_fetches += 1
        self._disk[ref.digest] = local
        self._disk.move_to_end(ref.digest)
        with self._errors(ref, drop=True):  # verified on every load, not only on fetch
            got = self.store.open_path(local, base_model_fingerprint=self.fingerprint)
            self._check_digest(ref, got.digest)
        self._trim_disk()
        return got

    def _reopen(self, ref: Resolved) -> StoredAdapter:
        with self._errors(ref, drop=False):
            return self.store.open(
                ref.store_uri, owner=_owner(ref), base_model_fingerprint=self.fingerprint
            )

    def _copy(self, ref: Resolved, src: StoredAdapter, local: Path) -> None:
        tmp = self.cache_dir / f".{local.name}.{time.monotonic_ns()}"
        try:
            with self._errors(ref, drop=False), self.store.io("copy a revision to the engine"):
                tmp.mkdir()
                for name in (*src.manifest.files, MANIFEST_FILE):  # the packed file too
                    shutil.copyfile(src.path / name, tmp / name)
                try:
                    tmp.rename(local)
                except OSError:
                    if not (local / MANIFEST_FILE).is_file():
                        raise  # not a copy that landed first (a cache shared by two engines)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _errors(self, ref: Resolved, *, drop: bool) -> Iterator[None]:
        """Store and file errors as load errors of ``ref`` (module docstring). ``drop``: they
        concern the local copy, which is removed; errors of an owner's store copy never drop
        the local copy, which may be another owner's."""
        try:
            yield
        except Exception as e:
            mapped = load_error(ref, e)
            if drop and isinstance(mapped, LoadError):  # not for an outage: the copy is fine
                self._drop_disk(ref.digest)
            if mapped is e:
                raise
            raise mapped from e

    def _check_digest(self, ref: Resolved, digest: str) -> None:
        if digest != ref.digest:
            raise AdapterDigestMismatch(
                f"the catalog says revision {ref.tenant}/{ref.policy}@{ref.revision} has digest "
                f"{ref.digest}, but the files at {ref.store_uri} hash to {digest}; re-export the "
                "revision or fix the catalog entry"
            )

    def _drop_disk(self, digest: str) -> None:
        path = self._disk.pop(digest, None) or self.cache_dir / digest.removeprefix("sha256:")
        shutil.rmtree(path, ignore_errors=True)
        self._forget_owners(digest)

    def _forget_owners(self, digest: str) -> None:
        """Owners are remembered while the bytes are held here (engine or disk), no longer."""
        if digest not in self._cpu and digest not in self._disk:
            self._owners.pop(digest, None)

    def _trim_disk(self) -> None:
        while len(self._disk) > self.max_disk:
            victim = next((d for d in self._disk if d not in self._cpu), None)
            if victim is None:
                return
            self._drop_disk(victim)
            self.counters.disk_evictions += 1
            metrics.EVICTIONS.labels("disk", "lru").inc()


def _owner(ref: Resolved) -> tuple[str, str]:
    return ref.tenant, ref.policy
