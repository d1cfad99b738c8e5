"""benchmarks/fault_injection.py --smoke: one fault of each kind (the broker, the database, a
worker) killed -9 under steady traffic, on its own Kafka and Cassandra. Nothing may be lost,
duplicated or dead-lettered, and the catalog must equal a replay of the log.

It runs with credentials on (``--secure``): every worker as its own Kafka principal and
Cassandra role, the SDK as ``operator``, so the whole lifecycle is shown to need no more rights
than streams/acls.py and catalog/roles.py grant. The rest of the suite runs the plain pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_fault_injection_smoke_holds_its_zeros() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fault_injection.py"), "--smoke", "--secure"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if len(lines) != 1:  # whole, under "Captured stdout" (an assertion message gets cut)
        print(proc.stdout[-3000:], proc.stderr[-16000:], sep="\n")
    assert len(lines) == 1, "no result line: see the captured output for the run's end"
    r = json.loads(lines[0])
    assert r["faults"] == ["kafka", "cassandra", "trainer"] and r["secure"] is True
    assert set(r["recovery_seconds"]) == set(r["faults"])  # every round recovered
    assert r["requests_sent"] > 20 and r["updates"] == 4  # traffic flowed through the faults
    assert r["lost"] == 0 and r["requests_unanswered"] == 0, r
    assert r["duplicate_revisions"] == 0 and r["transient_dead_letters"] == 0, r
    assert r["catalog_equals_replay"] is True, r["replay_problems"]
    assert set(r["met"]) == set(r["targets"]) and all(r["met"].values()), r["met"]
    assert proc.returncode == 0, proc.stderr[-3000:]
