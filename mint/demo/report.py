"""What the demo shows: the lifecycle and alias tables, and its figures as one JSON object
(``mint demo --json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mint.demo.lifecycle import Answer, DemoResult
from mint.demo.tasks import TENANT


def print_report(res: DemoResult, console: Console) -> None:
    task = res.task
    table = Table(title=f"lifecycle of {TENANT}/{task.policy} ({task.model})")
    for col in ("revision", "made by", "training reward", f"{task.suite} score", "gate", "prod"):
        table.add_column(col)
    rows = [(1, "init (fresh LoRA)", None)] + [
        (r.revision, f"GRPO round {r.round}", r.mean_reward) for r in res.rounds
    ]
    for rev, made, reward in rows:
        ev = res.evals.get(rev, {})
        gate_ok = "passed" if rev == res.promoted else ("baseline" if rev == 1 else "failed")
        mark = ", ".join(sorted({m.kind for m in res.history if m.to_revision == rev}))
        table.add_row(
            str(rev),
            made,
            f"{reward:.3f}" if reward is not None else "-",
            f"{ev['reward']:.3f}" if ev else "-",
            gate_ok,
            mark,
        )
    console.print(table)
    hist = Table(title="prod alias history (catalog rows, newest first)")
    for col in ("seq", "from", "to", "kind", "by", "reason"):
        hist.add_column(col)
    for m in res.history:
        hist.add_row(
            str(m.seq),
            str(m.from_revision or "-"),
            str(m.to_revision),
            m.kind,
            m.moved_by,
            m.reason[:70],
        )
    console.print(hist)
    if res.served_before:
        answers = Table(title=f"answers served by {TENANT}/{task.policy}@prod")
        answers.add_column("request")
        answers.add_column(f"before rollback (revision {res.promoted})")
        answers.add_column(f"after rollback (revision {res.rolled_back_to})")
        for b, a in zip(res.served_before, res.served_after, strict=False):
            answers.add_row(b.prompt, repr(b.text), repr(a.text))
        console.print(answers)
    console.print(
        f"({res.switch_requests} request(s) answered by the previous revision while an "
        "alias.moved event propagated)"
    )
    if res.png:
        console.print(f"reward curve: {res.png}")


def summary(res: DemoResult, model: Path) -> dict[str, Any]:
    """The demo's figures as one JSON object (``mint demo --json``)."""

    def answers(xs: list[Answer]) -> list[dict[str, Any]]:
        return [{"prompt": a.prompt, "answer": a.text, "revision": a.revision} for a in xs]

    base, promoted = res.baseline_eval, res.promoted_eval
    return {
        "ok": res.ok,
        "model": res.task.model,
        "model_path": str(model),
        "policy": f"{TENANT}/{res.task.policy}",
        "suite": res.task.suite,
        "gate": res.task.gate,
        "rounds": len(res.rounds),
        "baseline_eval": base,
        "promoted_revision": res.promoted,
        "promoted_eval": promoted,
        "improvement": None if base is None or promoted is None else promoted - base,
        "evals": {str(r): m.get("reward") for r, m in sorted(res.evals.items())},
        "training_reward": [r.mean_reward for r in res.rounds],
        "served_before_rollback": answers(res.served_before),
        "served_after_rollback": answers(res.served_after),
        "rolled_back_to": res.rolled_back_to,
        "peak_rss_mb_workers": round(res.peak_rss_mb),
        "peak_rss_mb_by_worker": {k: round(v) for k, v in res.peak_rss_by_worker.items()},
        "png": str(res.png) if res.png else None,
        "seconds": round(res.seconds, 1),
    }
