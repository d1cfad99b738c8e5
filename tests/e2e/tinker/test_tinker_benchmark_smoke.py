"""benchmarks/tinker_api.py --smoke --gateways 2 --kill: supervised steps through the official
SDK, a round-robin balancer over two gateway processes (one SIGKILLed and restarted every 3 s),
Kafka and the trainer worker, side by side with the same trainer in-process.

The two paths start from the same seed and step the same batch, so their losses must agree step
for step: what crosses HTTP and Kafka (token ids, weights, AdamParams) arrives unchanged, and no
call is lost or applied twice while gateways die under it (issue 40)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_tinker_api_smoke(kafka_ready, cassandra_cluster) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "tinker_api.py"),
            "--smoke",
            "--gateways",
            "2",
            "--kill",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stderr[-4000:]
    r = json.loads(lines[0])
    assert r["benchmark"] == "tinker_api" and r["smoke"] is True and r["steps"] >= 24
    assert r["gateways"] == 2 and r["kills"] >= 2, proc.stderr[-3000:]
    assert min(r["requests_per_gateway"]) > 0  # both served calls
    assert (r["lost"], r["applied_twice"], r["futures_404"]) == (0, 0, 0), proc.stderr[-4000:]
    loss = r["loss"]
    assert loss["sdk_first"] == pytest.approx(loss["inprocess_first"], rel=1e-4)
    assert loss["sdk_last"] == pytest.approx(loss["inprocess_last"], rel=1e-4)
    assert loss["sdk_last"] < loss["sdk_first"]  # the steps trained
    assert r["overhead_ratio"] > 0 and r["calls_per_s"] > 0
    assert r["call_ms"]["forward_backward"]["p50"] > 0
    assert r["targets"] == {"lost": 0, "applied_twice": 0, "futures_404": 0}
    assert proc.returncode == 0, proc.stderr[-3000:]
