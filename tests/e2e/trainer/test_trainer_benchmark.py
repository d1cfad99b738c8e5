"""The multi-policy training benchmark's smoke run prints one JSON line with its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_multi_policy_benchmark_smoke() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "multi_policy_training.py"), "--smoke"],
        capture_output=True, text=True, timeout=600, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout
    result = json.loads(lines[0])
    assert result["benchmark"] == "multi_policy_training" and result["policies"] == 4
    assert result["base_weight_copies"] == 1
    assert "sleep" in result["rollout_wait"]  # the stand-in is stated, not hidden
    # Smoke sizes are too short for the targets to be stable on a shared 2-core machine;
    # they must still point the right way: concurrency saves time, and costs no real memory.
    assert result["wall_time_ratio"] > 1.2, result
    assert result["peak_rss_ratio"] < 1.10, result
