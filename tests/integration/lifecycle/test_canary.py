"""Canary releases decided by the real controller process on real Kafka and Cassandra.

The test plays the engines: each answer is routed as an engine routes it (``route`` on what the
catalog resolves, sticky per caller) and published as ``infer.completed``; a downstream system's
``feedback.submitted`` follows. A canary that scores better is promoted by itself, one that
scores worse is ended with the alias left where it was, a rollback command ends a running
canary, and the controller is killed with SIGKILL mid-canary without a count lost or doubled.
"""

from __future__ import annotations

import uuid

import pytest

from catalog.repository import CatalogRepository
from catalog.state import StateTable
from mint.sdk import MintClient
from schemas import make_event
from schemas.events import (
    CanaryCommand,
    CanaryRule,
    FeedbackSubmitted,
    InferCompleted,
    PolicyConfigured,
    RollbackCommand,
)
from streams.producer import EventProducer
from tests.integration.lifecycle._helpers import wait_until
from tests.integration.lifecycle._replay import assert_catalog_equals_replay
from tests.integration.lifecycle.test_controller import export
from workers.controller.canary_view import CANARY_STATE, CanaryView, canary_key
from workers.controller.logic import CONFIGS_STATE
from workers.serving.resolution import route

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


RULE = CanaryRule(min_answers=12, min_scores=12)


def _traffic(repo, producer, tenant, policy, n, scores, salt):
    """``n`` answers to prod from distinct callers, each with a score by revision."""
    sent = {}
    for i in range(n):
        res = route(repo.resolve(f"{tenant}/{policy}@prod"), f"user-{salt}-{i}")
        rid = f"req-{salt}-{i}-{uuid.uuid4().hex[:6]}"
        answer = InferCompleted(
            request_id=rid,
            revision=res.revision,
            adapter_digest=res.digest,
            engine_id="engine-test",
            text="4",
            finish_reason="stop",
            prompt_tokens=3,
            completion_tokens=1,
            latency_ms=10.0 + i % 5,
            alias="prod",
        )
        producer.publish(make_event(answer, tenant=tenant, policy=policy, producer="engine/test"))
        score = FeedbackSubmitted(request_id=rid, score=scores[res.revision])
        producer.publish(make_event(score, tenant=tenant, policy=policy, producer="app/test"))
        sent[rid] = res.revision
    return sent


def test_canary_promotes_ends_and_rolls_back_on_what_serving_sees(settings, live, procs):
    repo = CatalogRepository(live, settings.keyspace)
    tenant, policy = "acme", "canaried"
    projector = procs(settings, "projector", "projector")
    controller = procs(settings, "controller", "controller")
    client = MintClient(settings, tenant, producer="test", timeout_s=120)
    producer = EventProducer(settings)
    views = StateTable(live, settings.keyspace, CANARY_STATE)
    configs = StateTable(live, settings.keyspace, CONFIGS_STATE)
    try:
        for n in (1, 2, 3):
            producer.publish(export(repo, tenant, policy, n))
        cfg = PolicyConfigured(
            base_model="tiny", suite="toy", auto_evaluate=False, auto_promote=False, canary=RULE
        )
        client.send(policy, cfg)
        # The rule is read when a canary starts; topics are not ordered among each other.
        wait_until(lambda: configs.get(f"{tenant}/{policy}"), 60, "configuration", controller)
        client.promote(policy, 1, reason="first")

        # A canary of 2 at half the callers that scores better is promoted by itself.
        start = client.send(policy, CanaryCommand(revision=2, share=0.5, expected_revision=1))
        started = client.wait_caused_by(start, "canary.started", "serving.refused")
        assert started.type == "canary.started", started.payload
        canary = repo.resolve(f"{tenant}/{policy}@prod").canary
        assert (canary.revision, canary.incumbent_revision, canary.share) == (2, 1, 0.5)
        # A second canary of the policy while one runs is refused with a reason.
        again = client.send(policy, CanaryCommand(revision=3, share=0.2))
        refused = client.wait_caused_by(again, "serving.refused")
        assert "already runs a canary of revision 2" in refused.payload.reason

        # kill -9 mid-canary: the restarted controller counts on from its saved offsets.
        sent = _traffic(repo, producer, tenant, policy, 8, {1: 0.6, 2: 0.9}, "a")
        wait_until(
            lambda: (
                (v := views.get(canary_key(tenant, policy)))
                and sum(v[s]["answers"] for s in ("canary", "incumbent")) == 8
            ),
            60,
            "8 answers counted",
            controller,
        )
        controller.kill9()
        controller = procs(settings, "controller2", "controller")
        sent |= _traffic(repo, producer, tenant, policy, 60, {1: 0.6, 2: 0.9}, "b")
        ended = client.wait_for(
            lambda e: e.type == "canary.ended" and e.policy == policy, what="canary.ended of 2"
        )
        p = ended.payload
        assert p.outcome == "promoted" and p.revision == 2, p.reason
        assert p.canary.answers >= RULE.min_answers and p.canary.scores >= RULE.min_scores
        assert p.deciding_event_at is not None and ended.occurred_at >= p.deciding_event_at
        moved = client.wait_for(
            lambda e: e.type == "alias.moved" and e.policy == policy and e.payload.to_revision == 2,
            what="prod moved to 2",
        )
        assert "canary won" in moved.payload.reason and moved.payload.from_revision == 1
        res = repo.resolve(f"{tenant}/{policy}@prod")
        assert res.revision == 2 and res.canary is None
        # Every answer counted once, on the side that gave it, up to the deciding one.
        view = CanaryView.model_validate(views.get(canary_key(tenant, policy)))
        counted = view.canary.answers + view.incumbent.answers
        on_canary = sum(1 for r in list(sent.values())[:counted] if r == 2)
        assert view.canary.answers == on_canary and view.decision.done

        # A canary of 3 that scores worse is ended; prod stays on 2.
        start = client.send(policy, CanaryCommand(revision=3, share=0.5))
        client.wait_caused_by(start, "canary.started")
        _traffic(repo, producer, tenant, policy, 80, {2: 0.8, 3: 0.3}, "c")
        ended = client.wait_for(
            lambda e: e.type == "canary.ended" and e.payload.revision == 3 and e.policy == policy,
            what="canary.ended of 3",
        )
        assert ended.payload.outcome == "rolled_back"
        assert "mean feedback" in ended.payload.reason, ended.payload.reason
        res = repo.resolve(f"{tenant}/{policy}@prod")
        assert res.revision == 2 and res.canary is None

        # Rolling back a running canary is one command; prod stays on 2.
        start = client.send(policy, CanaryCommand(revision=3, share=0.3))
        client.wait_caused_by(start, "canary.started")
        rb = client.send(policy, RollbackCommand(reason="not today"))
        out = client.wait_caused_by(rb, "canary.ended", "alias.moved")
        assert out.type == "canary.ended" and out.payload.outcome == "rolled_back"
        assert repo.resolve(f"{tenant}/{policy}@prod").canary is None
        history = repo.canary_history(tenant, policy)
        assert [(h.revision, h.outcome) for h in history] == [
            (3, "rolled_back"),
            (3, "rolled_back"),
            (2, "promoted"),
        ]
        assert "not today" in history[0].end_reason
        assert [h.to_revision for h in repo.alias_history(tenant, policy, "prod")] == [2, 1]
        # The projector writes the same canary history from the facts it reads back.
        wait_until(
            lambda: all(h.outcome for h in repo.canary_history(tenant, policy)),
            30,
            "history projected",
            projector,
        )
    finally:
        client.close()
        producer.close()
        controller.stop()
        projector.stop()
    # The catalog, canary history included, equals a replay of the log into an empty keyspace.
    try:
        assert_catalog_equals_replay(settings, live)
    finally:
        live.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}_rb", timeout=60)
