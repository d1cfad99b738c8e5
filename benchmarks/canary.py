"""Canary releases: the controller promotes a better canary and ends a worse one, on live traffic.

Two runs on the tiny Llama (one vLLM engine process, ``mint gateway``, the controller and the
projector, as deployed), each on its own policy with two stored revisions:

- the policy is configured (``policy.configured`` with ``canary=CanaryRule(min_answers,
  min_scores)``; no automatic evaluation or promotion), revision 1 is promoted to ``prod``
  (``serving.promote``) and a canary of revision 2 is started (``serving.canary``, share S,
  expected revision 1);
- steady chat traffic through the gateway with the ``openai`` client (``model`` ``<policy>@prod``,
  ``user`` one of many callers, so the sticky routing spreads), the revision that answered read
  from ``x-mint-revision``; after each answer a feedback score (``POST /v1/feedback``) drawn
  around a mean that depends on the revision: prod 0.70, the canary 0.85 in the ``better`` run
  and 0.50 in the ``worse`` one;
- ``serving.events`` is followed for ``canary.ended`` (and the ``alias.moved`` of a promotion);
  the traffic goes on for a few seconds after the client saw the decision.

Figures (ONE JSON line, ``targets`` / ``met``): ``decisions_correct`` (better: promoted and prod
on 2; worse: rolled back and prod still on 1), ``wrong_revision_answers`` (answers to requests
sent after the client saw the decision, served by another revision than the decided one: 0),
``share_error_points`` (the canary's share of prod's answers while it ran against S, worst run:
at most 2 points; a smoke run has too few requests for that and reports it all the same), and
``decision_to_move_ms_p50``: from the deciding answer or score (``deciding_event_at``) to the
move (the promotion's ``alias.moved``, or the ``canary.ended`` that ends the route), p50 over
the runs, each run's beside it.

    python benchmarks/canary.py            # min_answers 200, min_scores 100, S 0.1
    python benchmarks/canary.py --smoke    # min_answers 24, min_scores 12, S 0.3 (the test)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import _engine_group as eg  # noqa: E402
from benchmarks._canary_deploy import TENANT, Deployment  # noqa: E402
from benchmarks._canary_figures import TARGETS, Seen, run_figures, summary  # noqa: E402
from benchmarks._canary_traffic import Traffic  # noqa: E402
from benchmarks._engine_group import console, say  # noqa: E402
from benchmarks._harness import finish, load_1m, overrides, parser  # noqa: E402

RUNS = (("better", "promoted"), ("worse", "rolled_back"))
INCUMBENT, CANARY = 1, 2


@dataclass
class Plan:
    min_answers: int = 200
    min_scores: int = 100
    share: float = 0.1
    concurrency: int = 6
    callers: int = 20_000
    max_tokens: int = 4
    incumbent_mean: float = 0.70
    better_mean: float = 0.85
    worse_mean: float = 0.50
    after_s: float = 3.0  # traffic after the client saw the decision, at least this long …
    after_requests: int = 40  # … and this many answered requests sent after it
    decision_timeout_s: float = 1800.0
    seed: int = 0

    def means(self, label: str) -> dict[int, float]:
        canary = self.better_mean if label == "better" else self.worse_mean
        return {INCUMBENT: self.incumbent_mean, CANARY: canary}


def run_one(dep: Deployment, plan: Plan, label: str, expected: str) -> dict[str, Any]:
    """Configure ``canary-<label>``, promote revision 1, start the canary of revision 2, drive
    the traffic until the decision and ``plan.after_s`` past it; the run's figures."""
    from schemas.events import CanaryCommand, CanaryRule, PromoteCommand

    t0 = time.monotonic()
    policy = f"canary-{label}"
    dep.configure(policy, CanaryRule(min_answers=plan.min_answers, min_scores=plan.min_scores))
    dep.command(policy, PromoteCommand(revision=INCUMBENT, reason="bench"), "alias.moved")
    traffic = Traffic(
        dep.url,
        dep.key,
        f"{policy}@prod",
        label=label,
        means=plan.means(label),
        callers=plan.callers,
        max_tokens=plan.max_tokens,
        seed=plan.seed,
    )
    try:
        for k in range(2):  # prod answers, on revision 1, before the canary starts
            a = traffic.ask(-1 - k, feedback=False)
            if not a.ok or a.revision != INCUMBENT:
                raise RuntimeError(
                    f"{policy}@prod did not answer with revision {INCUMBENT} before the canary: "
                    f"revision {a.revision}, error {a.error}"
                )
        started, started_seen = dep.command(
            policy,
            CanaryCommand(
                revision=CANARY,
                share=plan.share,
                expected_revision=INCUMBENT,
                reason=f"bench: canary {label} than prod",
                requested_by="bench",
            ),
            "canary.started",
        )
        seen = Seen(CANARY, INCUMBENT, plan.share, expected, started_seen)
        traffic.start(plan.concurrency)
        try:
            follow(dep, traffic, seen, started, plan, label)
        finally:
            traffic.stop()
    finally:
        traffic.close()
    seen.prod_after = dep.prod(policy)
    fig = run_figures(traffic.snapshot(), seen)
    fig.update(policy=f"{TENANT}/{policy}", means=plan.means(label))
    fig["seconds"] = round(time.monotonic() - t0, 1)
    verdict = "[green]correct" if fig["decision_correct"] else "[red]WRONG"
    say(
        f"{label}: {fig['outcome']} ({verdict}[/]), prod on {fig['prod_after']}, canary share "
        f"{fig['canary_share']}, wrong-revision answers {fig['wrong_revision_answers']} of "
        f"{fig['answers_after_decision']}, move {fig['decision_to_move_ms']} ms"
    )
    return fig


def follow(dep: Deployment, traffic: Traffic, seen: Seen, started, plan: Plan, label: str) -> None:
    """Until the client saw ``canary.ended`` (and a promotion's ``alias.moved``) and the
    traffic ran ``plan.after_s`` / ``plan.after_requests`` past it, or no decision came."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    pid, canary_id = started.policy_id, started.payload.canary_id

    def is_ended(e) -> bool:
        return e.type == "canary.ended" and e.policy_id == pid and e.payload.canary_id == canary_id

    def is_moved(e) -> bool:
        return (
            e.type == "alias.moved"
            and e.policy_id == pid
            and e.payload.alias == "prod"
            and e.payload.to_revision == CANARY
            and e.occurred_at >= started.occurred_at
        )

    deadline = time.monotonic() + plan.decision_timeout_s
    shown = time.monotonic()
    progress = Progress(
        TextColumn(f"{label}: {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        bar = progress.add_task("canary answers", total=plan.min_answers)
        while True:
            dep.check()
            now = time.monotonic()
            if seen.ended is None and (got := dep.events.find(is_ended)) is not None:
                seen.ended, seen.ended_seen = got
                say(f"{label}: canary.ended {got[0].payload.outcome}: {got[0].payload.reason}")
            promoted = seen.ended is not None and seen.ended.payload.outcome == "promoted"
            if promoted and seen.moved is None and (got := dep.events.find(is_moved)) is not None:
                seen.moved, seen.moved_seen = got
            answers = traffic.snapshot()
            ok = [a for a in answers if a.ok]
            stuck(label, answers, ok)
            running = [a for a in ok if seen.ended_seen is None or a.sent < seen.ended_seen]
            progress.update(bar, completed=sum(a.revision == CANARY for a in running))
            if not console.is_terminal and now - shown > 5:
                say(f"{label}: {len(answers)} requests, {len(ok)} answered")
                shown = now
            if seen.ended_seen is not None:
                after = traffic.sent_since(seen.ended_seen)
                if (now - seen.ended_seen >= plan.after_s and after >= plan.after_requests) or (
                    now - seen.ended_seen > 120  # the traffic stalled: report what it has
                ):
                    break
            elif now > deadline:
                say(f"[red]{label}: no canary.ended within {plan.decision_timeout_s:.0f} s")
                break
            time.sleep(0.2)
    if seen.ended is not None and seen.ended.payload.outcome == "promoted" and seen.moved is None:
        got = dep.events.wait(is_moved, 30.0, dep.check)
        if got is not None:
            seen.moved, seen.moved_seen = got


def stuck(label: str, answers, ok) -> None:
    """Raise when every request fails, or every feedback: no decision can come of it (the
    error says which and why, rather than a timeout much later)."""
    failed = [a for a in answers if not a.ok]
    if len(failed) >= 20 and not ok:
        raise RuntimeError(f"{label}: every request fails, e.g. {failed[-1].error}")
    bad = [a for a in ok if not a.scored]
    if len(bad) >= 20 and len(bad) == len(ok):
        raise RuntimeError(f"{label}: every POST /v1/feedback fails, e.g. {bad[-1].feedback_error}")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, "min_answers 24, min_scores 12, S 0.3")
    ap.add_argument("--min-answers", type=int, default=None, help="the rule's canary answers")
    ap.add_argument("--min-scores", type=int, default=None, help="the rule's canary scores")
    ap.add_argument("--share", type=float, default=None, help="the canary's share S, in (0, 1)")
    ap.add_argument("--concurrency", type=int, default=None, help="concurrent clients")
    ap.add_argument("--callers", type=int, default=None, help="distinct caller ids (user)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs) and topics")
    args = ap.parse_args(argv)
    plan = Plan(seed=args.seed)
    if args.smoke:
        plan.min_answers, plan.min_scores, plan.share = 24, 12, 0.3
        plan.concurrency, plan.callers, plan.decision_timeout_s = 4, 2_000, 240.0
    overrides(plan, args, "min_answers", "min_scores", "share", "concurrency", "callers")
    if not 0 < plan.share < 1:
        ap.error(f"--share must be in (0, 1), got {plan.share}")
    if plan.min_answers < 1 or plan.min_scores < 0 or plan.concurrency < 1 or plan.callers < 1:
        ap.error("--min-answers, --concurrency and --callers must be >= 1, --min-scores >= 0")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from schemas.logs import configure_logging

    configure_logging("WARNING", "json")  # stdout carries the one JSON line
    import logging

    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mint-canary-"))
    out: dict[str, Any] = {"benchmark": "canary", "smoke": args.smoke, "model": "tiny-llama (test)"}
    out.update({k: v for k, v in asdict(plan).items() if k != "decision_timeout_s"})
    runs: dict[str, dict[str, Any]] = {}
    dep = Deployment(eg.run_settings(work, partitions=3), work)
    failed = False
    try:
        dep.start()
        out["start_s"] = round(time.monotonic() - t_start, 1)
        say(f"deployment up after {out['start_s']} s")
        for label, expected in RUNS:
            runs[label] = run_one(dep, plan, label, expected)
    except Exception as e:  # the line says where it stopped, with the logs kept
        failed = True
        out["error"] = f"{type(e).__name__}: {e}"[:2000]
        say(f"[red]{out['error']}")
    finally:
        dep.close(keep=args.keep, keep_logs=failed)
    out["runs"] = runs
    out.update(summary(runs))
    if failed or len(runs) < len(RUNS):
        out["met"] = {k: False for k in TARGETS}
    out["seconds"] = round(time.monotonic() - t_start, 1)
    out["cpus"], out["load_1m"] = os.cpu_count(), load_1m()
    finish(out, "canary", argv, say)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
