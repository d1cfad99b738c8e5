"""The figures of benchmarks/canary.py, from what the client saw (pure functions, unit-tested in
tests/unit/test_canary_benchmark_figures.py): the share of answers the canary got while it ran,
the answers served by the wrong revision after the decision, the time from the deciding answer
or score to the move, and the line's targets."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SHARE_TOLERANCE_POINTS = 2.0  # |canary share − share asked| in percentage points, at most
TARGETS: dict[str, Any] = {
    "decisions_correct": True,
    "wrong_revision_answers": 0,
    "share_error_points": SHARE_TOLERANCE_POINTS,
}


@dataclass
class Answer:
    """One request as the client saw it (times: ``time.monotonic()`` of this process)."""

    index: int
    caller: str
    sent: float  # just before the request went out
    answered: float | None = None  # when its answer (or error) came back
    revision: int | None = None  # x-mint-revision
    response_id: str | None = None
    score: float | None = None  # the feedback score submitted for it
    feedback_status: int | None = None  # HTTP status of POST /v1/feedback
    feedback_error: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.revision is not None and self.answered is not None

    @property
    def scored(self) -> bool:
        """Its feedback score was taken (a 2xx answer to POST /v1/feedback)."""
        return self.score is not None and self.feedback_status in range(200, 300)


def draw_score(seed: int, label: str, index: int, mean: float, sd: float) -> float:
    """The feedback score of request ``index`` of run ``label``: normal(mean, sd) clipped to
    [0, 1], from its own seeded generator (threads answer in any order; the draw is the same)."""
    rng = random.Random(f"{seed}:{label}:{index}")
    return round(min(1.0, max(0.0, rng.gauss(mean, sd))), 4)


def decided_revision(outcome: str | None, canary: int, incumbent: int) -> int | None:
    """The revision prod must serve after the decision (None: no decision)."""
    if outcome == "promoted":
        return canary
    if outcome == "rolled_back":
        return incumbent
    return None


def ms_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds() * 1000, 1)


def while_running(answers: list[Answer], started_seen: float, ended_seen: float | None):
    """Answers to prod while the canary ran: sent after the client saw ``canary.started`` and
    answered before it saw ``canary.ended`` (all answered ones when it never ended)."""
    return [
        a
        for a in answers
        if a.ok
        and a.sent >= started_seen
        and (ended_seen is None or (a.answered is not None and a.answered < ended_seen))
    ]


def share_figures(
    answers: list[Answer], canary: int, share_asked: float, started_seen: float, ended_seen
) -> dict[str, Any]:
    during = while_running(answers, started_seen, ended_seen)
    got = sum(a.revision == canary for a in during)
    share = got / len(during) if during else None
    return {
        "answers_while_running": len(during),
        "canary_answers_while_running": got,
        "canary_share": None if share is None else round(share, 4),
        "share_error_points": None if share is None else round(abs(share - share_asked) * 100, 2),
        "callers_on_both_sides": split_callers(during),
    }


def split_callers(answers: list[Answer]) -> int:
    """Callers answered by more than one revision (sticky routing: 0 while the canary runs)."""
    seen: dict[str, set[int]] = {}
    for a in answers:
        if a.revision is not None:
            seen.setdefault(a.caller, set()).add(a.revision)
    return sum(len(revs) > 1 for revs in seen.values())


def wrong_after(answers: list[Answer], decision_seen: float | None, decided: int | None):
    """(answers of requests sent after the client saw the decision, those served by another
    revision than the decided one)."""
    if decision_seen is None or decided is None:
        return 0, 0
    after = [a for a in answers if a.ok and a.sent > decision_seen]
    return len(after), sum(a.revision != decided for a in after)


def client_means(answers: list[Answer]) -> dict[str, float]:
    """Mean feedback score the client submitted per revision (what the controller should see)."""
    by: dict[int, list[float]] = {}
    for a in answers:
        if a.ok and a.scored:
            by.setdefault(a.revision, []).append(a.score)  # type: ignore[arg-type]
    return {str(r): round(statistics.fmean(s), 4) for r, s in sorted(by.items())}


def side(p: Any) -> dict[str, Any] | None:
    """A CanarySide (the controller's figures of one side) as the line shows it."""
    if p is None:
        return None
    mean = p.mean_score
    return {
        "revision": p.revision,
        "answers": p.answers,
        "failures": p.failures,
        "scores": p.scores,
        "mean_score": None if mean is None else round(mean, 4),
    }


@dataclass
class Seen:
    """What the client saw of one canary on ``serving.events`` (``*_seen``: its monotonic time
    when the follower got the event) and where the catalog's prod pointed afterwards."""

    canary: int
    incumbent: int
    share_asked: float
    expected: str  # the outcome the scores were drawn for: promoted | rolled_back
    started_seen: float
    ended: Any = None  # Envelope[CanaryEnded]
    ended_seen: float | None = None
    moved: Any = None  # Envelope[AliasMoved] that carried out a promotion
    moved_seen: float | None = None
    prod_after: int | None = None


def run_figures(answers: list[Answer], seen: Seen) -> dict[str, Any]:
    """One run's figures. The decision counts as seen when the client saw ``canary.ended``;
    a request sent after that must be answered by the decided revision."""
    p = seen.ended.payload if seen.ended is not None else None
    outcome = p.outcome if p is not None else None
    decided = decided_revision(outcome, seen.canary, seen.incumbent)
    deciding_at = p.deciding_event_at if p is not None else None
    ended_ms = ms_between(deciding_at, seen.ended.occurred_at if p is not None else None)
    moved_ms = ms_between(deciding_at, seen.moved.occurred_at if seen.moved is not None else None)
    after, wrong = wrong_after(answers, seen.ended_seen, decided)
    ok = [a for a in answers if a.ok]
    failed_feedback = [a for a in ok if not a.scored]
    correct = (
        outcome == seen.expected
        and seen.prod_after == decided
        and (outcome != "promoted" or seen.moved is not None)
    )
    return {
        "expected": seen.expected,
        "outcome": outcome,
        "reason": p.reason if p is not None else "no canary.ended seen",
        "decision_correct": correct,
        "prod_after": seen.prod_after,
        "requests": len(answers),
        "answered": len(ok),
        "errors": len(answers) - len(ok),
        "error_samples": sorted({a.error for a in answers if a.error})[:3],
        "feedback_failed": len(failed_feedback),
        "feedback_error_samples": sorted({a.feedback_error or "" for a in failed_feedback})[:3],
        **share_figures(answers, seen.canary, seen.share_asked, seen.started_seen, seen.ended_seen),
        "answers_after_decision": after,
        "wrong_revision_answers": wrong,
        "deciding_event_at": deciding_at.isoformat() if deciding_at else None,
        "decision_to_ended_ms": ended_ms,
        "decision_to_moved_ms": moved_ms,
        # the move: the alias moving to the canary, or the canary's route ending
        "decision_to_move_ms": moved_ms if outcome == "promoted" else ended_ms,
        "controller_canary": side(p.canary) if p is not None else None,
        "controller_incumbent": side(p.incumbent) if p is not None else None,
        "client_mean_scores": client_means(answers),
    }


def summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The line's figures over every run, with ``targets`` and ``met``: every decision correct,
    no wrong-revision answer after a decision, the worst share error within the tolerance; the
    time from the deciding event to the move as p50 over the runs (no target: reported)."""
    moves = [
        r["decision_to_move_ms"] for r in runs.values() if r["decision_to_move_ms"] is not None
    ]
    errors = [r["share_error_points"] for r in runs.values()]
    worst = None if None in errors or not errors else max(errors)
    out: dict[str, Any] = {
        "decisions_correct": bool(runs) and all(r["decision_correct"] for r in runs.values()),
        "wrong_revision_answers": sum(r["wrong_revision_answers"] for r in runs.values()),
        "answers_after_decision": sum(r["answers_after_decision"] for r in runs.values()),
        "decision_to_move_ms_p50": round(statistics.median(moves), 1) if moves else None,
        "decision_to_move_ms": {k: r["decision_to_move_ms"] for k, r in runs.items()},
        "share_error_points": worst,
        "canary_share": {k: r["canary_share"] for k, r in runs.items()},
    }
    out["targets"] = dict(TARGETS)
    out["met"] = {
        "decisions_correct": out["decisions_correct"],
        "wrong_revision_answers": out["wrong_revision_answers"] == 0
        and out["answers_after_decision"] > 0,
        "share_error_points": worst is not None and worst <= SHARE_TOLERANCE_POINTS,
    }
    return out
