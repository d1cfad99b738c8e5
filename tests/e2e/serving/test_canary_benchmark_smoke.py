"""benchmarks/canary.py --smoke: a better canary promoted, a worse one rolled back, on live traffic
through the gateway (one engine process, the controller, the projector), one JSON line.

Named to run before the other serving tests but the benchmarks' (test_benchmarks_smoke), so its
engine (a child process) never runs beside the session's engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def share_band_points(answers: int, share: float, sigmas: float = 4.0) -> float:
    """How far (in points) the canary's share of ``answers`` routed answers may fall from the share
    asked by chance alone: ``sigmas`` binomial standard deviations (4: one run in ~16,000 fails
    by chance). The smoke's ~60 answers cannot show the full run's ±2 points (at S 0.3 one
    standard deviation is 6 points); an engine that ignored the route (share 0, or all of prod)
    is 30 or 70 points off."""
    return 100 * sigmas * math.sqrt(share * (1 - share) / answers)


def test_canary_smoke(kafka_ready, cassandra_cluster) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "canary.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(lines[0])
    assert proc.returncode == 0 and "error" not in r, r.get("error") or proc.stderr[-3000:]
    assert r["benchmark"] == "canary" and r["smoke"] is True
    assert (r["min_answers"], r["min_scores"], r["share"]) == (24, 12, 0.3)
    better, worse = r["runs"]["better"], r["runs"]["worse"]
    assert (better["outcome"], better["prod_after"]) == ("promoted", 2), better
    assert (worse["outcome"], worse["prod_after"]) == ("rolled_back", 1), worse
    assert r["decisions_correct"] is True
    for run in (better, worse):
        # the controller judged on what the client sent: the canary's answers and scores
        assert (
            run["controller_canary"]["answers"] >= 24 and run["controller_canary"]["scores"] >= 12
        )
        assert run["errors"] == 0 and run["feedback_failed"] == 0
        assert run["answers_after_decision"] >= 40 and run["wrong_revision_answers"] == 0
        band = share_band_points(run["answers_while_running"], r["share"])
        assert run["share_error_points"] <= band, (band, run)
        assert run["callers_on_both_sides"] == 0  # sticky per caller while the canary ran
        assert run["decision_to_move_ms"] is not None and run["decision_to_move_ms"] >= 0
    assert better["decision_to_moved_ms"] is not None  # the promotion's alias.moved was seen
    assert r["wrong_revision_answers"] == 0 and r["decision_to_move_ms_p50"] >= 0
    assert r["targets"] == {
        "decisions_correct": True,
        "wrong_revision_answers": 0,
        "share_error_points": 2.0,
    }
    assert r["met"]["decisions_correct"] and r["met"]["wrong_revision_answers"]
