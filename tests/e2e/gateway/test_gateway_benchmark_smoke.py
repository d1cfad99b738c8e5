"""benchmarks/gateway_latency.py --smoke: one JSON line with its side-by-side figures.

Named to run before the other gateway tests, so its engine (in the benchmark's own process)
never runs beside the session's engine (conftest.py starts that one lazily)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_gateway_latency_smoke(kafka_ready, cassandra_cluster) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gateway_latency.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout[-2000:]
    r = json.loads(lines[0])
    assert r["benchmark"] == "gateway_latency" and r["smoke"] is True
    assert r["errors"] == 0 and r["same_answer"] is True  # the gateway serves what vLLM makes
    assert r["pairs"] == 20 and r["concurrent_requests"] == 64 and r["clients"] == 16
    assert r["direct_p50_ms"] > 0 and r["gateway_p50_ms"] > 0 and r["gateway_rps"] > 0
    assert r["inprocess_batch_rps"] > 0 and r["outside_engine_p50_ms"] > 0
    assert r["targets"] == {"added_p50_ms": 15.0} and set(r["met"]) == {"added_p50_ms"}
