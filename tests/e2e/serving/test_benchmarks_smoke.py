"""The serving benchmarks' smoke modes: each prints one JSON line with its side-by-side figures.

Named to run before the other serving tests, so its engines (one at a time, in child processes)
never run beside the session's engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_benchmark(name: str) -> dict:
    """The benchmark's JSON line, with its stderr (what it said of a run gone wrong) under
    ``_stderr`` for assertion messages."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout[-2000:]
    return {**json.loads(lines[0]), "_stderr": proc.stderr[-16000:]}


def test_handoff_latency_smoke() -> None:
    r = run_benchmark("handoff_latency.py")
    assert r["benchmark"] == "handoff_latency" and r["smoke"] is True
    assert r["checkpoint_bytes"] > r["adapter_bytes"] > 0
    assert r["adapter_handoff_s"] > 0 and r["merged_handoff_s"] > 0
    assert r["rl_step_ratio"] > 0
    assert r["merged_matches_adapter_share"] >= 0.75  # the merged reload really serves
    assert r["targets"] == {"handoff_ratio": 20} and set(r["met"]) == {"handoff_ratio"}


def test_adapter_sweep_smoke() -> None:
    r = run_benchmark("adapter_sweep.py")
    assert r["benchmark"] == "adapter_sweep" and r["adapters"] == 400
    assert r["sweep_served"] == 400 and r["sweep_loads"] == 400
    assert r["zipf_adapters"] > r["max_cpu_loras"]
    assert r["outputs_equal_share"] == 1.0  # grouping changes the order, never the answers
    assert r["demand"]["waves"] < r["fifo"]["waves"]
    assert r["targets"] == {"demand_over_fifo": 3.0} and set(r["met"]) == {"demand_over_fifo"}
    # The production path: every policy's request answered once, every adapter loaded once
    # through load.requests by the engine that served it.
    k = r["kafka_sweep"]
    assert k["adapters"] == k["answered"] == k["answers"] == 100 and k["failed"] == 0
    assert k["loads"] == 100 and k["load_requests"] >= 100


def test_multi_engine_smoke() -> None:
    r = run_benchmark("multi_engine.py")
    assert r["benchmark"] == "multi_engine" and r["smoke"] is True
    assert r["engines"] == 2 and r["adapters"] == 100
    assert r["answered"] == r["requests"] > 0
    assert r["lost"] == 0 and r["duplicates"] == 0 and r["double_loads"] == 0
    assert r["failed"] == 0
    assert r["cold_load_waves"] >= 1
    # Both engines serve, unless one fell out of the group: kafka-python 3.0 can lose its group
    # coordinator for good (streams/stall.py replaces that client after 60 s; this traffic
    # lasts 20). The other engine then answers everything, nothing lost or doubled (above).
    out = set(r["engines_out_of_group"])
    assert set(r["answered_by_engine"]) | out == {"e1", "e2"} and len(out) < 2, r["_stderr"]
    assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert r["targets"] == {"lost": 0, "duplicates": 0, "double_loads": 0, "failed": 0}
    assert set(r["met"]) == set(r["targets"]) and all(r["met"].values())
