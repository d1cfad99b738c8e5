"""Crash safety: kill -9 the trainer in the middle of an update and the serving engine in the
middle of requests. After a restart no event is lost (the update and every request get their
results), no revision is duplicated, and the catalog equals a replay of the log."""

from __future__ import annotations

import signal
import time
import uuid

from catalog.claims import write_jsonl
from mint.demo import LORA_TARGETS, PROMPTS, TENANT
from mint.dev.workers import Workers
from mint.sdk import MintClient, rollouts_to_examples
from schemas.events import InferRequested, LoraSpec, UpdateRequested
from tests.integration.lifecycle._replay import assert_catalog_equals_replay

POLICY = "crash"
FRESH = "crash-fresh"


def _log_has(workers: Workers, name: str, text: str) -> bool:
    path = workers.log_dir / f"{name}.log"
    return path.exists() and text in path.read_text(errors="replace")


def test_kill9_trainer_mid_update_and_engine_mid_requests(
    lifecycle_settings, lifecycle_model, cassandra_cluster, tmp_path
) -> None:
    s = lifecycle_settings
    workers = Workers(s, lifecycle_model, tmp_path / "logs")
    client = None
    try:
        workers.start_all()
        client = MintClient(s, TENANT, producer="test", timeout_s=600)
        lora = LoraSpec(rank=8, alpha=16, target_modules=LORA_TARGETS)
        client.base_models[POLICY] = str(lifecycle_model)
        r1 = client.init_policy(POLICY, lora=lora).revision
        client.promote(POLICY, r1, reason="baseline")
        ro = client.rollout(
            POLICY,
            PROMPTS,
            revision=r1,
            reward="even_tokens",
            samples_per_prompt=8,
            max_tokens=8,
            seed=1,
        )

        # --- the trainer, killed in the middle of a long update (100 GRPO steps) of a fresh
        # policy: the trainer logs "policy_added" when it starts on the request, before training.
        examples = rollouts_to_examples(ro.rows)
        uri = write_jsonl(client.store, TENANT, FRESH, "data", uuid.uuid4().hex, examples)
        req = client.send(
            FRESH,
            UpdateRequested(
                base_model=str(lifecycle_model),
                objective="rl",
                data_uri=uri,
                steps=100,
                batch_size=len(examples),
                learning_rate=1e-2,
                lora=lora,
            ),
        )
        deadline = time.monotonic() + 300
        while not _log_has(workers, "trainer", f'"policy": "{TENANT}/{FRESH}"'):
            assert time.monotonic() < deadline, "the trainer never started the update"
            time.sleep(0.1)
        t_started = time.monotonic()
        time.sleep(1.0)
        early = client.events(FRESH, ["update.completed", "export.completed"])
        assert not early, "the update finished before the kill: make it longer"
        workers.stop("trainer", sig=signal.SIGKILL)
        t_killed = time.monotonic() - t_started
        workers.start(
            "trainer2", "trainer", "--base-model", str(lifecycle_model), OMP_NUM_THREADS="1"
        )
        done = client.wait_caused_by(req, "update.completed")
        export = client.wait_caused_by(req, "export.completed")
        # The kill fell inside the update: the whole (redone) update outlasts the time to kill.
        assert done.payload.duration_s > t_killed, (done.payload.duration_s, t_killed)
        assert export.payload.revision == 1 and done.payload.steps == 100

        # --- the engine, killed while it generates a wave of long requests
        warm = client.infer(POLICY, "hello", max_tokens=4)
        assert warm.revision == r1
        ids = [f"crash-{i}" for i in range(32)]
        for i, rid in enumerate(ids):
            client.send(
                POLICY,
                InferRequested(
                    request_id=rid, prompt=PROMPTS[i % 4], max_tokens=110, temperature=1.0, seed=i
                ),
            )

        def answered() -> set[str]:
            return {
                e.payload.request_id
                for e in client.events(POLICY, ["infer.completed", "infer.failed"])
            }

        time.sleep(0.5)
        before_kill = answered() & set(ids)
        workers.stop("engine", sig=signal.SIGKILL)
        assert len(before_kill) < len(ids), "every request was answered before the kill"
        workers.start_engine("engine2")
        deadline = time.monotonic() + 600
        while set(ids) - answered() and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.5)
        missing = set(ids) - answered()
        assert not missing, f"{len(missing)} requests lost across the engine's kill -9"
        results = [
            e for e in client.events(POLICY, ["infer.completed"]) if e.payload.request_id in ids
        ]
        assert {e.payload.revision for e in results} == {r1}

        # --- no revision duplicated, the update announced once (one event id)
        assert [r.revision for r in client.revisions(FRESH)] == [1]
        assert [r.revision for r in client.revisions(POLICY)] == [r1]
        exports = client.events(FRESH, ["export.completed"])
        assert len({e.event_id for e in exports}) == 1
        from mint.dev.workers import wait_projected

        wait_projected(s, client.catalog)
    except BaseException:
        print(workers.report())  # which worker did not answer, and why
        raise
    finally:
        if client is not None:
            client.close()
        workers.stop_all()
    # The projector may still be applying the last events: it is stopped, so replay now.
    assert_catalog_equals_replay(s, cassandra_cluster[1])
