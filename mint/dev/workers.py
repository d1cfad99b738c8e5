"""MinT's workers as real processes, for the demo, the benchmarks and the e2e tests.

``Workers`` starts ``mint worker …`` processes with one run's settings in their environment,
each in its own process group (stopping it also stops what it spawned: vLLM's engine core), logs
each to its own file, samples their memory and stops them on the way out. ``wait_projected``
waits until the projector caught up with the log; ``tiny_model`` builds the random-weight Llama
the quick runs use.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.settings import MintSettings

# The tiny model's engine: a short context and small LoRAs keep it light on a small CPU machine.
TINY_ENGINE_ARGS = ("--max-model-len", "128", "--max-lora-rank", "16")


class Sizing(Protocol):
    """What the supervisor needs to know of a run (``mint.demo.DemoTask`` has both)."""

    @property
    def trainer_threads(self) -> int: ...

    @property
    def engine_args(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Sizes:
    """The tiny model's sizing: the trainer in 1 thread while the engine has the other."""

    trainer_threads: int = 1
    engine_args: tuple[str, ...] = TINY_ENGINE_ARGS


TINY = Sizes()


class Workers:
    """One run's worker processes; each in its own process group so that stopping it also
    stops what it spawned (vLLM's engine core)."""

    def __init__(
        self, settings: MintSettings, model: Path, log_dir: Path, task: Sizing = TINY
    ) -> None:
        self.settings, self.model, self.log_dir, self.task = settings, model, log_dir, task
        self.procs: dict[str, subprocess.Popen] = {}
        self.peak_rss_mb = 0.0
        self.peak_rss_by_worker: dict[str, float] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update(
            {
                "MINT_TOPIC_PREFIX": s.topic_prefix,
                "MINT_KEYSPACE": s.keyspace,
                "MINT_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
                "MINT_CASSANDRA_HOSTS": s.cassandra_hosts,
                "MINT_CASSANDRA_PORT": str(s.cassandra_port),
                "MINT_TOPIC_PARTITIONS": str(s.topic_partitions),
                # a cluster's layout too: topics a worker creates (a tenant's) replicate alike
                "MINT_TOPIC_REPLICATION": str(s.topic_replication),
                "MINT_TOPIC_MIN_INSYNC": str(s.topic_min_insync),
                "MINT_KEYSPACE_REPLICATION": s.keyspace_replication,
                "MINT_DEV_NODES": str(s.dev_nodes),
                "MINT_STATE_DIR": str(s.state_dir),
                "MINT_STORE_URI": str(s.adapter_store_root),
                "MINT_BASE_MODEL": str(self.model),
                "MINT_LOG_FORMAT": "json",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        env.update(extra)
        return env

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        if self.settings.kafka_secure:  # each worker kind runs as its own principal and role
            from mint.dev.secure import env_for
            from mint.security import PRINCIPAL_OF

            env = {**env_for(self.settings, PRINCIPAL_OF.get(args[0], args[0])), **env}
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "mint.cli", "--log-format", "json", "worker", *args],
            env=self.env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    KINDS = ("projector", "controller", "trainer", "engine")

    def start_all(self) -> None:
        for kind in self.KINDS:
            self.start_worker(kind)

    def start_worker(self, kind: str, name: str | None = None) -> subprocess.Popen:
        """Start (or restart, after a crash) one worker of ``kind`` (one of KINDS)."""
        name = name or kind
        if kind == "projector":
            return self.start(name, "projector", "--migrate")
        if kind == "controller":
            return self.start(name, "controller")
        if kind == "trainer":
            return self.start(
                name,
                "trainer",
                "--base-model",
                str(self.model),
                OMP_NUM_THREADS=str(self.task.trainer_threads),
            )
        if kind == "engine":
            return self.start_engine(name)
        raise ValueError(f"unknown worker kind {kind!r}; expected one of {', '.join(self.KINDS)}")

    def start_engine(self, name: str) -> subprocess.Popen:
        # nobind: on a small shared machine vLLM's default pins its threads to one core, which
        # another engine may already hold; let the OS schedule them.
        return self.start(
            name,
            "evaluator",
            "--with-serving",
            "--with-rollout",
            "--model",
            str(self.model),
            "--dtype",
            "float32",
            "--max-loras",
            "2",
            "--max-cpu-loras",
            "8",
            *self.task.engine_args,
            VLLM_CPU_OMP_THREADS_BIND="nobind",
        )

    def rss_mb(self) -> float:
        """Memory of every worker process and its children, together, now (MB). Proportional
        set size where the OS reports it: vLLM's processes map the same torch libraries and
        weights, and a plain RSS sum would count those pages once per process."""
        import psutil

        total = 0.0
        for name, p in list(self.procs.items()):
            mb = 0.0
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(p.pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        mem = proc.memory_full_info()  # pss: shared pages counted once overall
                        mb += getattr(mem, "pss", mem.rss) / 2**20
            self.peak_rss_by_worker[name] = max(self.peak_rss_by_worker.get(name, 0.0), mb)
            total += mb
        self.peak_rss_mb = max(self.peak_rss_mb, total)
        return total

    @contextlib.contextmanager
    def sampling_rss(self, every_s: float = 0.5):
        """Track the workers' peak RSS (``peak_rss_mb``) while the block runs."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                self.rss_mb()

        t = threading.Thread(target=loop, name="rss-sampler", daemon=True)
        t.start()
        try:
            yield self
        finally:
            stop.set()
            t.join(timeout=5)

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"worker {name} exited with {p.returncode}; its log ends:\n{tail}"
                )

    def stop(self, name: str, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # the group we created for it (start_new_session)
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
            except ProcessLookupError:
                pass
        # Leftovers of its group (e.g. an engine core whose parent was killed).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def report(self, tail_chars: int = 3000) -> str:
        """Each worker's state (running, or its exit code) and the end of its log: what a failed
        run prints, so that a wait that timed out says which worker did not answer and why. A
        running worker first writes its threads' stacks to its log (SIGUSR1: where it waits)."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGUSR1)
        if running:
            time.sleep(1.0)
        parts = [broker_lines(self.settings, tail_chars)]
        # Others' logs first, the workers' own last: the end of a cut report shows a worker's stacks.
        for log in sorted(self.log_dir.glob("*.log"), key=lambda f: (f.stem in self.procs, f.stem)):
            p = self.procs.get(log.stem)
            state = "stopped" if p is None else p.poll()
            state = "running" if state is None else state
            before, stacks = split_stacks(log.read_text(errors="replace"))
            parts.append(f"===== {log.stem} ({state}) =====\n{before[-tail_chars:]}{stacks}")
        return "\n".join(parts)


def tiny_model(settings: MintSettings) -> Path:
    """The tiny random-weight Llama (built once under ``models_dir``)."""
    from workers.models import TinySpec, build_tiny

    out = settings.models_dir / "llama-test"
    if not (out / "config.json").exists():
        build_tiny(TinySpec("llama", "test"), out, overwrite=True)
    return out


def wait_projected(settings: MintSettings, repo: Any, timeout_s: float = 60.0) -> int:
    """Wait until the projector applied every event of the catalog's log (so the catalog is
    complete before the workers stop); returns how many events the log holds."""
    from workers.projector import read_log

    ids = [e.event_id for e in read_log(settings)]
    deadline = time.monotonic() + timeout_s
    while not all(repo.is_applied(i) for i in ids):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the projector did not apply the log's {len(ids)} events within "
                f"{timeout_s:.0f} s: is `mint worker projector` running?"
            )
        time.sleep(0.5)
    return len(ids)


def broker_lines(settings: MintSettings, tail_chars: int = 3000) -> str:
    """The local broker's log lines that name this run's topics or groups (its topic prefix):
    joins, rebalances and members dropped, as the group coordinator saw them."""
    from mint.dev.launcher import services

    try:  # part of a failure's report: it must not raise in its place
        kafka = next(s for s in services(settings).values() if s.kind == "kafka")
        text = kafka.log_file.read_text(errors="replace")
    except (OSError, ValueError, StopIteration) as e:
        return f"===== kafka =====\n(no local broker log: {type(e).__name__}: {e})"
    mine = [ln for ln in text.splitlines() if settings.topic_prefix in ln]
    tail = "\n".join(mine)[-tail_chars:]
    return f"===== {kafka.name} (lines naming {settings.topic_prefix}) =====\n{tail}"


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+", re.M)


def split_stacks(text: str, frames: int = 4) -> tuple[str, str]:
    """A log's text before its last thread dump (faulthandler's, after SIGUSR1), and that dump
    condensed: per thread the innermost ``frames`` frames (where it waits) and every frame of
    MinT's own code (how it got there), so that a dozen of vLLM's threads fit in a CI log."""
    starts = [m.start() for m in _THREAD.finditer(text)]
    if not starts:
        return text, ""
    first = len(starts) - 1  # back to the first thread with only stack lines after it
    while first > 0 and all(
        not ln.strip() or ln.startswith("  File ")
        for ln in text[starts[first - 1] : starts[first]].splitlines()[1:]
    ):
        first -= 1
    blocks = [text[a:b] for a, b in zip(starts[first:], [*starts[first + 1 :], None], strict=True)]
    out = []
    for block in blocks:
        header, *rest = block.splitlines()
        calls = [ln for ln in rest if ln.startswith("  File ")]
        ours = [ln for ln in calls[frames:] if "-packages/" not in ln and "/lib/python" not in ln]
        more = ["  …"] if len(calls) > frames else []
        out.append("\n".join([header, *calls[:frames], *more, *ours]))
    return text[: starts[first]], "\n".join(out) + "\n"
