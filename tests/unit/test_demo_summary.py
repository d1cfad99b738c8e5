"""`mint demo --json`: the figures line holds what the README and the issue ask for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mint.demo import REAL, TINY, Answer, DemoResult, summary
from mint.sdk.training import Round

pytestmark = pytest.mark.unit


def test_summary_has_the_figures_and_is_one_json_line() -> None:
    res = DemoResult(
        ok=True,
        task=REAL,
        promoted=2,
        rolled_back_to=1,
        seconds=180.04,
        peak_rss_mb=4321.6,
        peak_rss_by_worker={"engine": 2500.2},
    )
    res.evals = {1: {"reward": 19 / 30}, 2: {"reward": 26 / 30}}
    res.rounds = [Round(1, 1, 2, 0.07, -0.01)]
    q = REAL.show[0]
    res.served_before = [Answer(q, "5 + 9 = 14.", 2)]
    res.served_after = [Answer(q, "15", 1)]
    line = json.dumps(summary(res, Path("/m")))
    got = json.loads(line)
    assert "\n" not in line
    assert got["model"] == "smollm2-135m-instruct" and got["promoted_revision"] == 2
    assert got["baseline_eval"] == pytest.approx(0.6333, abs=1e-4)
    assert got["promoted_eval"] == pytest.approx(0.8667, abs=1e-4)
    assert got["improvement"] == pytest.approx(0.2333, abs=1e-4)
    assert got["served_before_rollback"] == [{"prompt": q, "answer": "5 + 9 = 14.", "revision": 2}]
    assert got["served_after_rollback"][0]["revision"] == 1
    assert got["seconds"] == 180.0 and got["peak_rss_mb_workers"] == 4322


def test_a_run_that_promoted_nothing_reports_no_improvement() -> None:
    res = DemoResult(ok=False, task=TINY)
    res.evals = {1: {"reward": 0.5}}
    got = summary(res, Path("/m"))
    assert got["baseline_eval"] == 0.5 and got["promoted_eval"] is None
    assert got["improvement"] is None and got["ok"] is False


def test_the_real_task_gate_is_above_what_the_base_scores() -> None:
    # Measured base score on arith-heldout: 19/30; the gate asks for +0.2 at least.
    assert REAL.gate - 19 / 30 >= 0.19 and REAL.suite == "arith-heldout" and REAL.chat
