"""The events throughput benchmark's smoke run: one JSON line with consistent figures."""

from __future__ import annotations

import json
import subprocess
import sys

from schemas.settings import MintSettings
from tests.integration.streams._streams_helpers import ROOT, worker_env


def test_events_throughput_smoke(kafka_ready: MintSettings) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.events_throughput", "--smoke"],
        cwd=ROOT,
        env=worker_env(kafka_ready),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    figures = json.loads(lines[0])
    assert figures["benchmark"] == "events_throughput" and figures["events"] == 300
    for key in ("validate_eps", "produce_eps", "pipeline_eps"):
        assert figures[key] > 0
    ratio = figures["pipeline_eps"] / figures["validate_eps"]
    assert abs(figures["pipeline_vs_validate"] - ratio) < 0.01
    assert figures["smoke"] is True and figures["targets"] == {"pipeline_eps": 15_000}
    assert figures["met"] == {"pipeline_eps": figures["pipeline_eps"] >= 15_000}
