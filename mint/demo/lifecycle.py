"""Steps 2–6 of the demo against running services: workers, the gate, GRPO rounds until a
revision passes, serving through ``prod``, the rollback, the reward curve."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from mint.demo.tasks import TENANT, TINY, DemoTask
from mint.dev.workers import Workers, wait_projected
from schemas.settings import MintSettings


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


def run_lifecycle(
    settings: MintSettings,
    model: Path,
    console: Console,
    *,
    max_rounds: int = 8,
    gate: float | None = None,
    png: Path | None = None,
    log_dir: Path | None = None,
    task: DemoTask = TINY,
) -> DemoResult:
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
    workers = Workers(
        settings, model, log_dir or settings.state_dir / "demo" / settings.topic_prefix, task
    )
    client = None
    policy = task.policy
    try:
        with workers.sampling_rss():
            with console.status("starting workers: projector, controller, trainer, vLLM engine"):
                workers.start_all()
                client = MintClient(settings, TENANT, producer="demo", timeout_s=600)
            client.create_policy(
                policy,
                base_model=str(model),
                suite=task.suite,
                thresholds={"reward": {"min": gate}},
                rollback_metric="reward",
                rollback_tolerance=0.05,
            )
            lora = LoraSpec(
                rank=task.lora_rank,
                alpha=2 * task.lora_rank,
                target_modules=list(task.lora_targets),
            )
            with console.status(
                "revision 1: a fresh LoRA (the base model's behaviour) — "
                "waiting for the trainer and the vLLM engine to start"
            ):
                init = client.init_policy(policy, lora=lora)
                res.evals[1] = dict(_eval_of(client, policy, init.revision).payload.metrics)
                client.promote(policy, init.revision, reason="baseline: the base model's behaviour")
            workers.check()
            console.print(
                f"revision 1 (the base model) on {task.suite}: "
                f"reward={res.evals[1]['reward']:.3f} (gate: reward ≥ {gate}); "
                "prod → 1 (baseline)"
            )
            if (
                _train_until_gate(
                    client, task, res, init.revision, gate, max_rounds, workers, console
                )
                is None
            ):
                console.print(
                    f"[red]no revision passed the gate (reward ≥ {gate}) in "
                    f"{max_rounds} rounds[/red]: raise --rounds or lower --gate"
                )
                return res
            moved = client.wait_for_alias(policy, "prod", res.rounds[-1].revision)
            res.promoted = moved.payload.to_revision
            console.print(
                f"[green]controller promoted revision {res.promoted} to prod[/green]: "
                f"{moved.payload.reason}"
            )

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
        res.png = _plot(
            res,
            gate,
            png or settings.state_dir / "demo" / f"{settings.topic_prefix}-reward-curve.png",
        )
        return res
    finally:
        if client is not None:
            client.close()
        with console.status("stopping workers"):
            workers.stop_all()
        res.seconds = time.monotonic() - t0


def _train_until_gate(
    client,
    task: DemoTask,
    res: DemoResult,
    start: int,
    gate: float,
    max_rounds: int,
    workers: Workers,
    console: Console,
) -> int | None:
    """GRPO rounds until the controller's evaluation of a round's revision passes the gate;
    returns that revision (None: none passed in ``max_rounds``)."""
    latest = start
    progress = Progress(
        TextColumn("GRPO round {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        bar = progress.add_task("train", total=max_rounds, info="sampling…")
        for i in range(1, max_rounds + 1):
            (rnd,) = client.train(
                task.policy,
                task.round_prompts(i),
                rounds=1,
                reward=task.reward,
                samples_per_prompt=task.samples_per_prompt,
                max_tokens=task.max_tokens,
                temperature=task.temperature,
                learning_rate=task.learning_rate,
                chat=task.chat,
                steps_per_round=task.steps_per_round,
                start_revision=latest,
                seed=i,
            )
            rnd.round = i
            res.rounds.append(rnd)
            latest = rnd.revision
            ev = _eval_of(client, task.policy, latest)
            res.evals[latest] = dict(ev.payload.metrics)
            verdict = "passed" if ev.payload.passed else "failed"
            info = (
                f"rev {latest}: rollout reward {rnd.mean_reward:.3f}, eval "
                f"{ev.payload.metrics['reward']:.3f} gate {verdict}"
            )
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
            raise TimeoutError(
                f"prod still serves another revision than {revision} after "
                f"{timeout_s:.0f} s: did the engine get the alias.moved event?"
            )
    return n


def _eval_of(client, policy: str, revision: int):
    """The controller-requested evaluation of ``revision`` (every export is auto-evaluated)."""
    pid = f"{client.tenant}/{policy}"
    return client.wait_for(
        lambda e: (
            e.type == "eval.completed" and e.policy_id == pid and e.payload.revision == revision
        ),
        what=f"eval.completed of {pid}@{revision}",
    )


def _plot(res: DemoResult, gate: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = res.task
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    xs = [r.round for r in res.rounds]
    ax.plot(
        xs,
        [r.mean_reward for r in res.rounds],
        "o-",
        label=f"training reward ({task.reward}, samples of the previous revision)",
    )
    ax.plot(
        [0] + xs,
        [res.evals[1]["reward"]] + [res.evals[r.revision]["reward"] for r in res.rounds],
        "s-",
        label=f"{task.suite} score of the round's revision (0: base)",
    )
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
