"""The packed MoE loading benchmark's smoke run prints one JSON line with its figures, and both
layouts load into the same tensors (no speed bound is asserted: the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_moe_packed_load_benchmark_smoke(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "moe_packed_load.py"),
            "--smoke",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout
    r = json.loads(lines[0])
    assert r["benchmark"] == "moe_packed_load" and r["smoke"] is True
    fields = (
        "speedup_cold",
        "speedup_warm",
        "bytes_packed",
        "bytes_per_expert",
        "tensors_packed",
        "tensors_per_expert",
        "target",
        "met",
        "anchor",
        "config",
    )
    assert set(fields) <= set(r), set(fields) - set(r)
    c = r["config"]
    assert r["tensors_per_expert"] == c["layers"] * c["experts"] * 3 * 2
    assert r["tensors_packed"] == c["layers"] * 3 * 2
    assert r["target"] == 9.0 and r["anchor"] == "8.5-8.7x reference"
    assert r["met"] == (min(r["speedup_cold"], r["speedup_warm"]) >= r["target"])
    assert r["speedup_cold"] > 0 and r["speedup_warm"] > 0
    # Every loader gave the same stacks, the trainer's PEFT layout included.
    assert r["equal"] is True and r["trainer_layout"]["equal"] is True
    assert r["cold_resident_fraction"] in (None, 0.0) or r["cold_resident_fraction"] < 0.5
    assert list(tmp_path.iterdir()) == []  # the benchmark removed its files
