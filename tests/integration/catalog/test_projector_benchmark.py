"""The projector benchmark's smoke run: a backlog of exports and promotions drained by a real
projector process (``mint worker projector --parallel``) into Cassandra, one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_projector_throughput_smoke(kafka_ready, cassandra_cluster) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "projector_throughput.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    # Every export became exactly one revision and every promotion moved its alias, with
    # different policies applied on threads (per-policy order kept: revisions 1..4 in order).
    assert r["revisions_registered"] == r["policies"] * r["revisions_per_policy"] == 200
    assert r["aliases"] == r["policies"] and r["parallel"] == 16
    assert r["revisions_per_s"] > 0
    assert r["targets"] == {"revisions_per_s": 1000} and set(r["met"]) == {"revisions_per_s"}
