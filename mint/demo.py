"""`mint demo`: one policy's whole lifecycle on real services, in a few minutes on a laptop CPU.

1. Start Kafka and Cassandra (``mint.dev.up``, idempotent) and build the tiny Llama.
2. Start the workers as real processes (``mint worker …``): projector, controller, trainer, and
   ONE vLLM engine that serves, samples rollouts and evaluates (``evaluator --with-serving
   --with-rollout``). They are stopped at the end, on error and on Ctrl-C too.
3. Configure the policy's gate (``reward ≥ min`` on the ``toy-even-sampled`` suite) and make
   revision 1 (a fresh LoRA: the base model's behaviour) the ``prod`` baseline.
4. Train with GRPO on a toy reward (even token ids) until a revision passes the gate; the
   controller evaluates each exported revision and promotes the first one that passes.
5. Serve requests through ``prod``, roll back, serve again: the answering revision changes.
6. Print the lifecycle table and the alias history (catalog rows), write a reward-curve PNG.

Each run uses its own topic prefix and keyspace (printed at the end), so runs never mix.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas.settings import MintSettings

POLICY = "toy-even"
TENANT = "demo"
PROMPTS = ["hello world", "the model", "red green blue", "once upon a time"]
SUITE = "toy-even-sampled"
# lm_head in the LoRA lets GRPO move the token distribution of a tiny random model in a few
# rounds (attention/MLP LoRA alone barely moves it: measured flat for 8 rounds).
LORA_TARGETS = ["q_proj", "v_proj", "lm_head"]


@dataclass
class DemoResult:
    ok: bool
    rounds: list[Any] = field(default_factory=list)
    evals: dict[int, dict[str, float]] = field(default_factory=dict)
    promoted: int | None = None
    served_before: list[int] = field(default_factory=list)
    served_after: list[int] = field(default_factory=list)
    rolled_back_to: int | None = None
    switch_requests: int = 0  # answered by the old revision while a move propagated
    history: list[Any] = field(default_factory=list)
    png: Path | None = None
    seconds: float = 0.0
    settings: MintSettings | None = None


class Workers:
    """The demo's worker processes; each in its own process group so that stopping it also
    stops what it spawned (vLLM's engine core)."""

    def __init__(self, settings: MintSettings, model: Path, log_dir: Path) -> None:
        self.settings, self.model, self.log_dir = settings, model, log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update({
            "MINT_TOPIC_PREFIX": s.topic_prefix, "MINT_KEYSPACE": s.keyspace,
            "MINT_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "MINT_CASSANDRA_HOSTS": s.cassandra_hosts,
            "MINT_CASSANDRA_PORT": str(s.cassandra_port),
            "MINT_TOPIC_PARTITIONS": str(s.topic_partitions),
            "MINT_STATE_DIR": str(s.state_dir), "MINT_STORE_URI": str(s.adapter_store_root),
            "MINT_BASE_MODEL": str(self.model), "MINT_LOG_FORMAT": "json",
            "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
        })  # fmt: skip
        env.update(extra)
        return env

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "mint.cli", "--log-format", "json",
                                 "worker", *args], env=self.env(**env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_all(self) -> None:
        m = str(self.model)
        self.start("projector", "projector", "--migrate")
        self.start("controller", "controller")
        self.start("trainer", "trainer", "--base-model", m, OMP_NUM_THREADS="1")
        self.start_engine("engine")

    def start_engine(self, name: str) -> subprocess.Popen:
        # nobind: on a small shared machine vLLM's default pins its threads to one core, which
        # another engine may already hold; let the OS schedule them.
        return self.start(name, "evaluator", "--with-serving", "--with-rollout", "--model",
                          str(self.model), "--max-model-len", "128", "--dtype", "float32",
                          "--max-loras", "2", "--max-cpu-loras", "8", "--max-lora-rank", "16",
                          VLLM_CPU_OMP_THREADS_BIND="nobind")  # fmt: skip

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {name} exited with {p.returncode}; its log ends:\n"
                                   f"{tail}")  # fmt: skip

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


def demo_settings(base: MintSettings, run: str) -> MintSettings:
    return base.model_copy(update={"topic_prefix": f"demo-{run}", "keyspace": f"demo_{run}"})


def tiny_model(settings: MintSettings) -> Path:
    from workers.models import TinySpec, build_tiny

    out = settings.models_dir / "llama-test"
    if not (out / "config.json").exists():
        build_tiny(TinySpec("llama", "test"), out, overwrite=True)
    return out


def run_lifecycle(settings: MintSettings, model: Path, console: Console, *, max_rounds: int = 8,
                  gate: float = 0.8, png: Path | None = None,
                  log_dir: Path | None = None) -> DemoResult:  # fmt: skip
    """Steps 2–6 against running services (the e2e test calls this with its own settings)."""
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from mint.sdk import MintClient
    from schemas.events import LoraSpec
    from streams.topics import ensure_topics

    t0 = time.monotonic()
    res = DemoResult(ok=False, settings=settings)
    ensure_topics(settings)
    cluster, session = connect(settings)
    migrate(session, settings.keyspace, settings.keyspace_replication)
    cluster.shutdown()
    workers = Workers(
        settings, model, log_dir or settings.state_dir / "demo" / settings.topic_prefix
    )
    client = None
    try:
        with console.status("starting workers: projector, controller, trainer, vLLM engine"):
            workers.start_all()
            client = MintClient(settings, TENANT, producer="demo", timeout_s=600)
        client.create_policy(POLICY, base_model=str(model), suite=SUITE,
                             thresholds={"reward": {"min": gate}}, rollback_metric="reward",
                             rollback_tolerance=0.05)  # fmt: skip
        lora = LoraSpec(rank=8, alpha=16, target_modules=LORA_TARGETS)
        with console.status("revision 1: a fresh LoRA (the base model's behaviour) — waiting for "
                            "the trainer and the vLLM engine to start"):  # fmt: skip
            init = client.init_policy(POLICY, lora=lora)
            res.evals[1] = dict(_eval_of(client, init.revision).payload.metrics)
            client.promote(POLICY, init.revision, reason="baseline: the base model's behaviour")
        workers.check()
        console.print(f"revision 1 evaluated: reward={res.evals[1]['reward']:.3f} "
                      f"(gate: reward ≥ {gate}); prod → 1 (baseline)")  # fmt: skip

        latest = init.revision
        progress = Progress(TextColumn("GRPO round {task.completed}/{task.total}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                            console=console)  # fmt: skip
        with progress:
            task = progress.add_task("train", total=max_rounds, info="sampling…")
            for i in range(1, max_rounds + 1):
                (rnd,) = client.train(POLICY, PROMPTS, rounds=1, reward="even_tokens",
                                      samples_per_prompt=8, max_tokens=8, learning_rate=5e-2,
                                      steps_per_round=4, start_revision=latest, seed=i)  # fmt: skip
                rnd.round = i
                res.rounds.append(rnd)
                latest = rnd.revision
                ev = _eval_of(client, latest)
                res.evals[latest] = dict(ev.payload.metrics)
                verdict = "passed" if ev.payload.passed else "failed"
                progress.update(task, advance=1, info=f"rev {latest}: rollout reward "
                                f"{rnd.mean_reward:.3f}, eval {ev.payload.metrics['reward']:.3f} "
                                f"gate {verdict}")  # fmt: skip
                workers.check()
                if ev.payload.passed:
                    break
        if not any(_eval_of(client, r.revision).payload.passed for r in res.rounds):
            console.print(f"[red]no revision passed the gate (reward ≥ {gate}) in {max_rounds} "
                          "rounds[/red]: raise --rounds or lower --gate")  # fmt: skip
            return res
        moved = client.wait_for_alias(POLICY, "prod", latest)
        res.promoted = moved.payload.to_revision
        console.print(f"[green]controller promoted revision {res.promoted} to prod[/green]: "
                      f"{moved.payload.reason}")  # fmt: skip

        res.switch_requests += _until_served(client, res.promoted)
        for k in range(3):
            res.served_before.append(client.infer(POLICY, PROMPTS[k], max_tokens=8).revision)
        back = client.rollback(POLICY, reason="demo: operator rollback")
        res.rolled_back_to = back.payload.to_revision
        res.switch_requests += _until_served(client, res.rolled_back_to)
        for k in range(3):
            res.served_after.append(client.infer(POLICY, PROMPTS[k], max_tokens=8).revision)
        res.history = client.history(POLICY, "prod")
        wait_projected(settings, client.catalog)
        res.ok = (set(res.served_before) == {res.promoted}
                  and set(res.served_after) == {res.rolled_back_to} != {res.promoted})  # fmt: skip
        res.png = _plot(res, gate, png or settings.state_dir / "demo" / f"{settings.topic_prefix}"
                        "-reward-curve.png")  # fmt: skip
        return res
    finally:
        if client is not None:
            client.close()
        with console.status("stopping workers"):
            workers.stop_all()
        res.seconds = time.monotonic() - t0


def wait_projected(settings: MintSettings, repo: Any, timeout_s: float = 60.0) -> int:
    """Wait until the projector applied every event of the catalog's log (so the catalog is
    complete before the workers stop); returns how many events the log holds."""
    from workers.projector import read_log

    ids = [e.event_id for e in read_log(settings)]
    deadline = time.monotonic() + timeout_s
    while not all(repo.is_applied(i) for i in ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the projector did not apply the log's {len(ids)} events within "
                               f"{timeout_s:.0f} s: is `mint worker projector` running?")  # fmt: skip
        time.sleep(0.5)
    return len(ids)


def _until_served(client, revision: int, timeout_s: float = 30.0) -> int:
    """Requests answered by another revision until ``revision`` answers. The engine learns of an
    alias move from the alias.moved event (no restart, no polling of the catalog), so requests
    sent right after a move may still meet the old revision."""
    n, deadline = 0, time.monotonic() + timeout_s
    while client.infer(POLICY, PROMPTS[0], max_tokens=2).revision != revision:
        n += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"prod still serves another revision than {revision} after "
                               f"{timeout_s:.0f} s: did the engine get the alias.moved event?")  # fmt: skip
    return n


def _eval_of(client, revision: int):
    """The controller-requested evaluation of ``revision`` (every export is auto-evaluated)."""
    pid = f"{client.tenant}/{POLICY}"
    return client.wait_for(lambda e: e.type == "eval.completed" and e.policy_id == pid
                           and e.payload.revision == revision,
                           what=f"eval.completed of {pid}@{revision}")  # fmt: skip


def _plot(res: DemoResult, gate: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [r.round for r in res.rounds]
    ax.plot(xs, [r.mean_reward for r in res.rounds], "o-",
            label="rollout mean reward (samples of the previous revision)")  # fmt: skip
    ax.plot([0] + xs, [res.evals[1]["reward"]] + [res.evals[r.revision]["reward"]
                                                  for r in res.rounds], "s-",
            label="eval reward of the round's revision (0: revision 1)")  # fmt: skip
    ax.set_xticks([0] + xs)
    ax.axhline(gate, color="gray", ls="--", label=f"gate: reward ≥ {gate}")
    ax.set_xlabel("GRPO round")
    ax.set_ylabel("share of even token ids")
    ax.set_title(f"{TENANT}/{POLICY}: reward by round")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def print_report(res: DemoResult, console: Console) -> None:
    table = Table(title=f"lifecycle of {TENANT}/{POLICY}")
    for col in ("revision", "made by", "rollout reward", "eval reward", "gate", "prod"):
        table.add_column(col)
    prod_moves = {m.to_revision: m for m in res.history}
    rows = [(1, "init (fresh LoRA)", None)] + [(r.revision, f"GRPO round {r.round}",
                                                r.mean_reward) for r in res.rounds]  # fmt: skip
    for rev, made, reward in rows:
        ev = res.evals.get(rev, {})
        gate_ok = "passed" if rev == res.promoted else ("baseline" if rev == 1 else "failed")
        mark = ""
        if rev in prod_moves:
            mark = ", ".join(sorted({m.kind for m in res.history if m.to_revision == rev}))
        table.add_row(str(rev), made, f"{reward:.3f}" if reward is not None else "-",
                      f"{ev['reward']:.3f}" if ev else "-", gate_ok, mark)  # fmt: skip
    console.print(table)
    hist = Table(title="prod alias history (catalog rows, newest first)")
    for col in ("seq", "from", "to", "kind", "by", "reason"):
        hist.add_column(col)
    for m in res.history:
        hist.add_row(str(m.seq), str(m.from_revision or "-"), str(m.to_revision), m.kind,
                     m.moved_by, m.reason[:70])  # fmt: skip
    console.print(hist)
    console.print(f"served through prod before rollback: revisions {res.served_before}; "
                  f"after rollback: {res.served_after} ({res.switch_requests} request(s) answered by "
                  "the previous revision while an alias.moved event propagated)")  # fmt: skip
    if res.png:
        console.print(f"reward curve: {res.png}")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_demo(settings: MintSettings, console: Console, keep_services: bool = True,
             rounds: int = 8, gate: float = 0.8) -> int:  # fmt: skip
    from mint.dev import LauncherError, down, up

    t0 = time.monotonic()
    try:
        with console.status("starting Kafka and Cassandra"):
            ready = up(settings)
    except LauncherError as e:
        console.print(f"[red]error:[/red] {e}")
        return 1
    for name, seconds in ready.items():
        console.print(f"{name} ready after {seconds:.1f} s")
    # kafka-python warns about slow polls on a busy CPU; the demo's output is for people.
    logging.getLogger("kafka").setLevel(logging.ERROR)
    # SIGTERM (a supervisor, a CI timeout) unwinds like Ctrl-C, so the workers are stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    run = uuid.uuid4().hex[:8]
    s = demo_settings(settings, run)
    try:
        with console.status("building the tiny Llama (random weights, local BPE tokenizer)"):
            model = tiny_model(settings)
        res = run_lifecycle(s, model, console, max_rounds=rounds, gate=gate)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: workers stopped[/yellow]")
        return 130
    finally:
        if not keep_services:
            down(settings)
    print_report(res, console)
    console.print(f"demo {'finished' if res.ok else '[red]FAILED[/red]'} in "
                  f"{time.monotonic() - t0:.0f} s. Look around with:\n  MINT_TOPIC_PREFIX="
                  f"{s.topic_prefix} MINT_KEYSPACE={s.keyspace} mint history "
                  f"{TENANT}/{POLICY}")  # fmt: skip
    return 0 if res.ok else 1
