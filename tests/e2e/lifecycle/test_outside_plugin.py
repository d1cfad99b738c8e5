"""A reward and an evaluation suite from OUTSIDE MinT's tree, end to end.

tests/fixtures/plugin_package is a package as a user would write it (pyproject.toml with
``mint.rewards`` / ``mint.suites`` entry points). It is pip-installed into a folder of its own,
never into MinT's environment, and that folder is put on the PYTHONPATH of the worker processes
only (controller, trainer, vLLM engine host with evaluation and rollout): the test process
itself cannot import it. Real Kafka, Cassandra, trainer and engine; the tiny test model.

- The policy is configured with the plugin's suite and a gate on the plugin reward's metric:
  the controller's evaluation of revision 1 runs the plugin suite, ``eval.completed`` carries
  its metric, and the gate promotes the revision.
- A rollout names the plugin's reward: every row's reward is the plugin's rule (1.0 for a
  completion of even length in characters, else 0.0), and greedy rollouts of the suite's
  prompts score what the evaluation scored.
- A reward or a suite that is neither built in nor installed is refused at once (dead letter,
  reason ``refused``, one attempt), and the error names it and lists the installed entry points.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from catalog.state import StateTable
from mint.demo import LORA_TARGETS, TENANT
from mint.dev.workers import Workers
from mint.sdk import MintClient
from mint.sdk.exceptions import RequestFailed
from schemas.events import EvalRequested, LoraSpec
from workers.controller.logic import CONFIGS_STATE

pytestmark = pytest.mark.slow

PACKAGE = Path(__file__).resolve().parents[2] / "fixtures" / "plugin_package"
# What the package declares (its mint_parity_plugin module is not importable here, on purpose).
REWARD, SUITE = "parity_even_length", "parity-check"
PROMPTS = ["hello world", "the cat sat", "once upon a time", "a b c"]
MAX_TOKENS = 6
POLICY, GHOST = "parity", "ghost"


def _install(dest: Path) -> Path:
    """pip-install the package (no dependencies, no network) into ``dest/site``; built from a
    copy so that the build leaves nothing in the source tree."""
    src, site = dest / "src", dest / "site"
    shutil.copytree(PACKAGE, src)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*cmd, "--no-index", "--target", str(site), str(src)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"pip could not install {PACKAGE}:\n{proc.stderr[-3000:]}"
    return site


def _parity(completion: str) -> float:
    return 1.0 if len(completion) % 2 == 0 else 0.0


def _wait_configured(configs: StateTable, policy: str, timeout_s: float = 60.0) -> None:
    """Until the controller stored the policy's configuration (what it gates an export with,
    and what the evaluator checks an evaluation's suite against)."""
    deadline = time.monotonic() + timeout_s
    while not configs.get(f"{TENANT}/{policy}"):
        assert time.monotonic() < deadline, f"the controller never stored {policy}'s config"
        time.sleep(0.2)


def test_a_reward_and_a_suite_installed_from_outside_the_tree(
    lifecycle_settings, lifecycle_model, cassandra_cluster, tmp_path, monkeypatch
) -> None:
    site = _install(tmp_path / "plugin")
    # Outside: this process has neither the module nor its entry points, the workers have both.
    assert importlib.util.find_spec("mint_parity_plugin") is None
    assert REWARD not in {ep.name for ep in entry_points(group="mint.rewards")}
    # Workers.env copies os.environ: every worker started below gets the plugin's folder.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    )
    configs = StateTable(cassandra_cluster[1], lifecycle_settings.keyspace, CONFIGS_STATE)
    workers = Workers(lifecycle_settings, lifecycle_model, tmp_path / "logs")
    client = None
    try:
        for kind in ("controller", "trainer", "engine"):  # no projector: nothing here reads it
            workers.start_worker(kind)
        client = MintClient(lifecycle_settings, TENANT, producer="test", timeout_s=300)
        model = str(lifecycle_model)
        client.create_policy(
            POLICY, base_model=model, suite=SUITE, thresholds={REWARD: {"min": 0.0}}
        )
        client.create_policy(GHOST, base_model=model, suite="no-such-suite")
        _wait_configured(configs, POLICY)  # before the export, or it is not evaluated

        # --- the gate: the controller evaluates revision 1 on the plugin's suite and promotes it.
        lora = LoraSpec(rank=8, alpha=16, target_modules=LORA_TARGETS)
        init = client.init_policy(POLICY, lora=lora)
        pid = f"{TENANT}/{POLICY}"
        ev = client.wait_for(
            lambda e: e.type == "eval.completed" and e.policy_id == pid,
            what=f"eval.completed of {pid}",
        ).payload
        assert (ev.revision, ev.suite, ev.refused) == (init.revision, SUITE, None)
        assert 0.0 <= ev.metrics[REWARD] == ev.metrics["reward"] <= 1.0, ev.metrics
        assert ev.metrics["samples"] == len(PROMPTS) and ev.passed, ev
        moved = client.wait_for_alias(POLICY, "prod", init.revision).payload
        assert moved.reason.startswith(f"evaluation gate passed on {SUITE}: {REWARD}=")

        # --- rollouts scored by the plugin's reward.
        greedy = client.rollout(
            POLICY,
            PROMPTS,
            revision=init.revision,
            reward=REWARD,
            samples_per_prompt=1,
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
        sampled = client.rollout(
            POLICY, PROMPTS, revision=init.revision, reward=REWARD, samples_per_prompt=4, seed=7
        )
        for ro in (greedy, sampled):
            assert [r["reward"] for r in ro.rows] == [_parity(r["completion"]) for r in ro.rows]
        assert {r["reward"] for r in sampled.rows} == {0.0, 1.0}, sampled.rows
        # The evaluation generated the same greedy completions of the same prompts.
        assert greedy.mean_reward == ev.metrics[REWARD]

        # --- names neither built in nor installed: refused at once, named in the error.
        with pytest.raises(RequestFailed) as no_reward:
            client.rollout(POLICY, PROMPTS[:1], revision=init.revision, reward="no_such_reward")
        _wait_configured(configs, GHOST)  # the evaluator asks the suite only if it is the policy's
        ask = client.send(
            GHOST,
            EvalRequested(revision=1, adapter_digest=ev.adapter_digest, suite="no-such-suite"),
        )
        with pytest.raises(RequestFailed) as no_suite:
            client.wait_caused_by(ask, "eval.completed")
        for failed, error, listed in [
            (no_reward, "UnknownReward: reward 'no_such_reward' is not registered", REWARD),
            (no_suite, "UnknownSuite: evaluation suite 'no-such-suite' is not registered", SUITE),
        ]:
            message = str(failed.value)
            assert "after 1 attempt(s) (refused): " + error in message, message
            assert f"entry points (mint.{'rewards' if listed == REWARD else 'suites'}): " in message
            assert repr(listed) in message, message  # the installed plugin is listed
        workers.check()
    except BaseException:
        print(workers.report())
        raise
    finally:
        if client is not None:
            client.close()
        workers.stop_all()
