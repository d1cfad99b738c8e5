"""benchmarks/tinker_rl.py --smoke: an RL loop through the official SDK only — the gateway
process, Kafka, the trainer worker and a vLLM engine — on the tiny Llama with a toy reward (the
share of even token ids) computed in the client.

Mechanics only, not learning: rewards were computed for every sample, each round took an
importance-sampling step on datums with real advantages, and every revision (r0 the fresh LoRA,
then one per round) was saved and sampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_tinker_rl_smoke(kafka_ready, cassandra_cluster) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tinker_rl.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stderr[-4000:]
    r = json.loads(lines[0])
    assert r["benchmark"] == "tinker_rl" and r["smoke"] is True
    assert r["settings"]["rounds"] == 2 and r["settings"]["loss_fn"] == "importance_sampling"
    assert 0.0 <= r["base_score"] <= 1.0 and len(r["scores"]) == 2

    samples = r["settings"]["prompts_per_round"] * r["settings"]["samples"]
    paths = []
    for i, rnd in enumerate(r["rounds"], start=1):
        assert rnd["round"] == i
        assert rnd["samples"] == samples  # every sample came back and was rewarded
        assert 0.0 <= rnd["rollout_reward"] <= 1.0
        assert rnd["datums"] > 0 and rnd["is_loss_sum"] is not None  # the IS step ran
        assert rnd["path"].endswith(f"/sampler_weights/r{i}@{i + 1}")  # a new revision each
        assert 0.0 <= rnd["held_out"] <= 1.0  # and the engine sampled it
        paths.append(rnd["path"])
    assert len(set(paths)) == 2

    assert r["lift"] == pytest.approx(r["scores"][-1] - r["base_score"], abs=1e-3)
    assert r["targets"] == {"lift": 0.2} and set(r["met"]) == {"lift"}
    for phase in ("create_training_client", "sample", "reward", "train", "save_weights", "score"):
        assert r["phase_s"][phase] >= 0
    # The toy task's lift is no target of a smoke run: the exit status only follows it.
    assert proc.returncode == (0 if r["met"]["lift"] else 1), proc.stderr[-3000:]
