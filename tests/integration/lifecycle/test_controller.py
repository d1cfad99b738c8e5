"""The lifecycle controller as a real worker process on real Kafka and Cassandra.

The test plays the trainer (registers revisions, publishes export.completed) and the evaluator
(answers eval.requested with chosen metrics), so that the gate and the regression rule are
exercised with exact numbers; the controller and the projector are the real workers. Midway the
controller is killed with SIGKILL and restarted: it decides from the state it saved in Cassandra.
Finally the catalog equals a rebuild from the log.
"""

from __future__ import annotations

import pytest

from catalog.repository import CatalogRepository
from mint.sdk import CommandRefused, MintClient
from schemas import make_event
from schemas.events import EvalCompleted, ExportCompleted, threshold_failures
from streams.producer import EventProducer
from tests.integration.lifecycle._helpers import wait_until
from tests.integration.lifecycle._replay import assert_catalog_equals_replay

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


FP = "sha256:" + "cd" * 32


def export(repo: CatalogRepository, tenant: str, policy: str, n: int):
    """Register revision ``n`` as the trainer does (before announcing it), then its event."""
    digest = "sha256:" + f"{n:02x}" * 32
    uri = f"file:///store/{tenant}/{policy}/adapters/{n}"
    env = make_event(
        ExportCompleted(
            revision=n,
            adapter_digest=digest,
            store_uri=uri,
            size_bytes=1,
            rank=8,
            base_model="tiny",
            base_model_fingerprint=FP,
            parent_revision=n - 1 or None,
        ),
        tenant=tenant,
        policy=policy,
        producer="trainer/test",
    )
    if n == 1:
        repo.create_policy(tenant, policy, "tiny", by=env.producer, at=env.occurred_at)
    repo.register_revision(
        tenant,
        policy,
        digest=digest,
        store_uri=uri,
        base_model="tiny",
        parent_revision=n - 1 or None,
        revision=n,
        by=env.producer,
        at=env.occurred_at,
        source_event_id=env.event_id,
        metadata={
            "size_bytes": 1,
            "rank": 8,
            "lora_alpha": None,
            "target_modules": [],
            "target_parameters": [],
            "base_model_fingerprint": FP,
        },
    )
    return env


def answer(req, reward: float):
    p = req.payload
    metrics = {"reward": reward}
    failures = threshold_failures(metrics, dict(p.thresholds))
    return make_event(
        EvalCompleted(
            revision=p.revision,
            adapter_digest=p.adapter_digest,
            suite=p.suite,
            metrics=metrics,
            thresholds=p.thresholds,
            passed=not failures,
            failures=failures,
        ),
        tenant=req.tenant,
        policy=req.policy,
        producer="evaluator/test",
        caused_by=req,
    )


def test_gate_promotion_kill9_restart_auto_rollback_and_rebuild(settings, live, procs):
    session = live
    repo = CatalogRepository(session, settings.keyspace)
    tenant, policy = "acme", "math"
    projector = procs(settings, "projector", "projector")
    controller = procs(settings, "controller", "controller")
    client = MintClient(settings, tenant, producer="test", timeout_s=120)
    producer = EventProducer(settings)
    try:
        client.create_policy(
            policy,
            base_model="tiny",
            suite="toy",
            thresholds={"reward": {"min": 0.6}},
            rollback_metric="reward",
            rollback_tolerance=0.05,
        )

        def step(n: int, reward: float):
            exp = export(repo, tenant, policy, n)
            producer.publish(exp)
            # Caused by the export, or by the configuration when the controller read that
            # later (topics are not ordered among each other): match on the revision.
            req = client.wait_for(
                lambda e: (
                    e.type == "eval.requested" and e.policy == policy and e.payload.revision == n
                ),
                what=f"eval.requested of {n}",
            )
            assert req.payload.thresholds["reward"].min == 0.6 and req.payload.promote_to == "prod"
            done = answer(req, reward)
            producer.publish(done)
            return done

        # Revision 1 passes the gate: the controller promotes it (from nothing).
        e1 = step(1, 0.7)
        cmd = client.wait_caused_by(e1, "serving.promote")
        moved = client.wait_caused_by(cmd, "alias.moved")
        assert (moved.payload.from_revision, moved.payload.to_revision) == (None, 1)
        # Revision 2 fails the gate: nothing moves. Revision 3 passes: prod 1 → 3 by CAS.
        step(2, 0.4)
        e3 = step(3, 0.9)
        cmd3 = client.wait_caused_by(e3, "serving.promote")
        assert cmd3.payload.expected_revision == 1
        client.wait_caused_by(cmd3, "alias.moved")
        assert not [
            e for e in client.events(policy, ["serving.promote"]) if e.payload.revision == 2
        ]

        # kill -9 the controller; the restarted one decides from the state it saved.
        controller.kill9()
        controller = procs(settings, "controller2", "controller")
        # A re-evaluation of the serving revision 3 within tolerance: nothing; below: rollback.
        from schemas.events import EvalRequested

        for reward, expect_rollback in ((0.87, False), (0.5, True)):
            req = client.send(
                policy,
                EvalRequested(revision=3, adapter_digest=e3.payload.adapter_digest, suite="toy"),
            )
            done = answer(req, reward)
            producer.publish(done)
            if expect_rollback:
                rb = client.wait_caused_by(done, "serving.rollback")
                assert "fell to 0.5" in rb.payload.reason and rb.payload.expected_revision == 3
                back = client.wait_caused_by(rb, "alias.moved")
                assert (back.payload.from_revision, back.payload.to_revision) == (3, 1)
        assert len(client.events(policy, ["serving.rollback"])) == 1

        # An operator promote through the CLI path (SDK): prod 1 → 2 despite the failed gate.
        manual = client.promote(policy, 2, reason="operator override")
        assert manual.payload.to_revision == 2
        # A stale compare-and-set is refused with a readable event, not a log line and a timeout.
        with pytest.raises(CommandRefused, match="at revision 2") as refused:
            client.promote(policy, 3, expected_revision=1, reason="stale")
        assert refused.value.current_revision == 2

        hist = wait_until(
            lambda: (h := repo.alias_history(tenant, policy, "prod")) and len(h) == 4 and h,
            60,
            "4 history rows",
            projector,
        )
        assert [(h.from_revision, h.to_revision, h.kind) for h in hist] == [
            (1, 2, "promote"),
            (3, 1, "rollback"),
            (1, 3, "promote"),
            (None, 1, "promote"),
        ]
        assert hist[1].moved_by == "controller" and hist[0].moved_by == "test"
        assert repo.resolve(f"{tenant}/{policy}@prod").revision == 2
    finally:
        client.close()
        producer.close()
        controller.stop()
        projector.stop()

    # The catalog equals a replay of the log into an empty keyspace.
    try:
        assert_catalog_equals_replay(settings, session)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}_rb", timeout=60)
