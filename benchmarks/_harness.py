"""What every benchmark shares, so that each script keeps only what it measures: its options
(``--smoke`` and the smoke-or-full defaults), the figures' helpers (nearest-rank percentiles, the
machine's CPUs and load, ``targets``/``met``) and the ONE JSON line on stdout, `mint gateway`
processes, and a run's own topics and keyspace (made on the way in, dropped on the way out)."""

from __future__ import annotations

import argparse
import contextlib
import json
import operator
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ options


class Options(argparse.ArgumentParser):
    """A script's options: ``--smoke`` (what the tests run) and its sizes (:meth:`size`)."""

    def __init__(self, doc: str | None, smoke: str) -> None:
        super().__init__(description=(doc or "").splitlines()[0])
        self.add_argument("--smoke", action="store_true", help=smoke)
        self.sizes: dict[str, tuple[Any, Any]] = {}

    def size(self, flag: str, small: Any, full: Any, what: str) -> None:
        """An option that, left unset, is ``small`` under --smoke and ``full`` otherwise: both
        are written once, beside the flag, and the help shows them."""
        action = self.add_argument(
            flag, type=type(full), help=f"{what} (default {full}; smoke {small})"
        )
        self.sizes[action.dest] = (small, full)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        for dest, (small, full) in self.sizes.items():
            if getattr(ns, dest) is None:
                setattr(ns, dest, small if ns.smoke else full)
        return ns


def parser(doc: str | None, smoke: str) -> Options:
    """A script's parser: its docstring's first line, and ``--smoke`` with its help."""
    return Options(doc, smoke)


def overrides(plan: Any, args: argparse.Namespace, *names: str, **renamed: str) -> None:
    """Each option given (not None) onto ``plan``: ``names`` are the same on both, ``renamed`` is
    ``plan_field="option"``; a plan's presets (--smoke, a mode) come first, the options last."""
    for field_, option in {**{n: n for n in names}, **renamed}.items():
        if (value := getattr(args, option)) is not None:
            setattr(plan, field_, value)


# ------------------------------------------------------------------ figures


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def load_1m() -> float:
    """The 1-minute load average: a figure is read against how busy the machine was."""
    return round(os.getloadavg()[0], 2)


def machine() -> dict[str, Any]:
    return {"load_1m": load_1m(), "cpus": os.cpu_count()}


def targets_and_met(**checks: tuple[float, str, float]) -> dict[str, dict]:
    """A line's ``targets`` and ``met`` in the shape benchmarks/report.py reads: ``figure=(measured,
    op, target)`` with op ``>=`` or ``<=``, judged on the measurement before it is rounded."""
    holds = {">=": operator.ge, "<=": operator.le}
    return {
        "targets": {figure: target for figure, (_, _, target) in checks.items()},
        "met": {figure: holds[op](m, target) for figure, (m, op, target) in checks.items()},
    }


def emit(line: dict[str, Any], **dumps: Any) -> int:
    """Print the run's one JSON line (stdout carries nothing else); the exit status: 0 when
    every target of its ``met`` was met (or it has none), else 1."""
    print(json.dumps(line, **dumps), flush=True)
    met = line.get("met")
    return 0 if not isinstance(met, dict) or all(met.values()) else 1


def finish(line: dict[str, Any], script: str, argv: list[str] | None, say=None) -> list[str]:
    """The line's ``command`` (``python benchmarks/<script>.py`` and its options), the missed
    targets said on stderr, the line printed; the missed targets' names."""
    line["command"] = " ".join([f"python benchmarks/{script}.py", *(argv or sys.argv[1:])])
    missed = [k for k, v in line.get("met", {}).items() if not v]
    if missed:
        (say or (lambda m: print(m, file=sys.stderr)))(f"[red]missed: {', '.join(missed)}")
    emit(line, default=str)
    return missed


# ------------------------------------------------------------------ processes


def stop_group(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group of ``proc`` (started with ``start_new_session``), SIGKILL to
    what is left after ``timeout_s``: an engine core that outlived its parent goes too."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)


def start_gateway(
    settings, log: Path, model: Path = Path("."), *, port: int | None = None, name: str = "bench-gw"
):
    """`mint gateway` as its own process; ``model`` is the base it offers (MINT_BASE_MODEL);
    ``port``: a free one unless given (a restarted instance takes its old one); ``name``: its
    instance id."""
    from gateway.main import _free_port
    from mint.dev.workers import Workers

    port = port or _free_port("127.0.0.1")
    env = Workers(settings, model, log.parent).env()
    cli = ["mint.cli", "--log-format", "json", "gateway", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", *cli, "--instance-id", name],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc, log: Path, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mint gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mint gateway did not get ready: {log.read_text()[-2000:]}")


# ------------------------------------------------------------------ a run's topics and keyspace


def run_settings(name: str, work: Path, base=None, **update: Any):
    """``base`` (default: MintSettings()) on its own topic prefix and keyspace (``bench-<name>-``
    and a random tag, so runs beside tests and each other never meet), its store and state
    under ``work``."""
    from schemas.settings import MintSettings

    tag = uuid.uuid4().hex[:8]
    own = {"topic_prefix": f"bench-{name}-{tag}", "keyspace": f"bench_{name}_{tag}"}
    own |= {"store_uri": str(work / "store"), "state_dir": work / "state"}
    return (base or MintSettings()).model_copy(update=own | update)


@contextlib.contextmanager
def run_space(settings) -> Iterator[Any]:
    """The run's topics and migrated keyspace; yields a Cassandra session. Both are dropped on
    the way out (a failure to drop them is only reported)."""
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from streams.topics import delete_topics, ensure_topics

    ensure_topics(settings)
    cluster, session = connect(settings)
    try:
        migrate(session, settings.keyspace, settings.keyspace_replication)
        yield session
    finally:
        try:  # cleanup only: a run's figures stand when it fails
            session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
            delete_topics(settings)
        except Exception as e:
            print(f"could not drop the run's keyspace or topics: {e}", file=sys.stderr)
        finally:
            cluster.shutdown()


def bench_model(smoke: bool, work: Path, models_dir: Path) -> tuple[Path, str]:
    """The base model and its name in the line: the tiny Llama under --smoke, else SmolLM2-135M."""
    if smoke:
        from workers.models import TinySpec, build_tiny

        return build_tiny(TinySpec("llama", "test"), work / "llama"), "tiny-llama"
    from workers.models.pretrained import fetch

    return fetch("smollm2-135m-instruct", models_dir), "smollm2-135m"


@dataclass
class TrainerRun:
    """A run with the trainer worker started and an API key of tenant ``bench``."""

    work: Path
    base: Any  # MintSettings the run started from (mint dev's state: kill_kafka reads it)
    settings: Any
    model: Path
    model_name: str
    session: Any
    api_key: str  # the SDK's form: tml-…
    workers: Any  # mint.dev.workers.Workers
    procs: list = field(default_factory=list)  # gateways, stopped on the way out

    def gateway(self) -> str:
        """Start one `mint gateway` and wait for it; its URL."""
        log = self.work / "logs" / "gateway.log"
        proc, url = start_gateway(self.settings, log, self.model)
        self.procs.append(proc)
        wait_ready(url, proc, log)
        return url


@contextlib.contextmanager
def trainer_run(name: str, smoke: bool, threads: int) -> Iterator[TrainerRun]:
    """A Tinker benchmark's stack: own topics and keyspace, the trainer worker (``threads`` torch
    threads), a key; everything stopped and dropped on the way out."""
    from catalog.access import AccessRepository
    from mint.dev.workers import Sizes, Workers
    from schemas.settings import MintSettings

    work = Path(tempfile.mkdtemp(prefix=f"mint-bench-{name}-"))
    base = MintSettings()
    try:
        model, model_name = bench_model(smoke, work, base.models_dir)
        settings = run_settings(name, work, base, base_model=str(model))
        with run_space(settings) as session:
            access = AccessRepository(session, settings.keyspace)
            access.create_tenant("bench", rate_per_s=1e6, burst=1_000_000)
            key, _ = access.create_key("bench", name="bench")
            workers = Workers(settings, model, work / "logs", Sizes(trainer_threads=threads))
            run = TrainerRun(
                work, base, settings, model, model_name, session, f"tml-{key.text}", workers
            )
            try:
                workers.start_worker("trainer")
                yield run
            finally:
                for proc in run.procs:
                    stop_group(proc)
                workers.stop_all()
    finally:
        shutil.rmtree(work, ignore_errors=True)
