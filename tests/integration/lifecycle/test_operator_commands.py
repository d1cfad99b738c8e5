"""Operator alias commands and replays against a real controller, Kafka and Cassandra (issue 25,
defects 6 and 7): `mint catalog promote|rollback` go through serving.commands like `mint
promote`, so the catalog never moves without its alias.moved in the log; a replayed old move
never takes the controller's view back, so the next automatic promotion is not refused."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from catalog.exceptions import AliasNotFound
from catalog.repository import CatalogRepository
from catalog.state import StateTable
from mint.sdk import MintClient
from schemas import make_event
from schemas.events import EvalRequested
from streams.producer import EventProducer
from tests.integration.lifecycle._helpers import ROOT, wait_until, worker_env
from tests.integration.lifecycle._replay import assert_catalog_equals_replay
from tests.integration.lifecycle.test_controller import answer, export
from workers.controller.logic import LIFECYCLE_STATE, RECENT

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


def mint(settings, *args: str, **env: str) -> subprocess.CompletedProcess:
    if args[:2] == ("catalog", "promote"):  # the controller may still be starting on a busy CPU
        args = (*args, "--timeout", "180")
    return subprocess.run(
        [sys.executable, "-m", "mint.cli", *args],
        cwd=ROOT,
        env=worker_env(settings, COLUMNS="300", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_catalog_promote_with_kafka_away_moves_nothing_and_says_so(settings, live) -> None:
    repo = CatalogRepository(live, settings.keyspace)
    repo.create_policy("acme", "math", "tiny")
    repo.register_revision(
        "acme", "math", digest="sha256:" + "01" * 32, store_uri="file:///store/acme/math/adapters/1"
    )
    t0 = time.monotonic()
    p = mint(
        settings,
        "catalog",
        "promote",
        "acme/math@prod",
        "--to",
        "1",
        MINT_KAFKA_BOOTSTRAP="127.0.0.1:1",
    )
    # at once, not after kafka-python's 30 s bootstrap timeout (the CLI's start is most of it)
    assert time.monotonic() - t0 < 20.0
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no Kafka broker at 127.0.0.1:1"), p.stderr
    assert last.endswith("nothing was sent, acme/math@prod did not move"), p.stderr
    with pytest.raises(AliasNotFound):  # not moved behind the log's back
        repo.get_alias("acme", "math", "prod")


def test_catalog_commands_go_through_the_controller_and_a_replay_never_wedges_promotion(
    settings, live, procs
) -> None:
    session = live
    repo = CatalogRepository(session, settings.keyspace)
    tenant, policy = "acme", "math"
    projector = procs(settings, "projector", "projector")
    controller = procs(settings, "controller", "controller")
    client = MintClient(settings, tenant, producer="test", timeout_s=120)
    producer = EventProducer(settings)
    view = StateTable(session, settings.keyspace, LIFECYCLE_STATE)
    try:
        client.create_policy(
            policy, base_model="tiny", suite="toy", thresholds={"reward": {"min": 0.6}}
        )
        exports = [export(repo, tenant, policy, n) for n in (1, 2)]
        producer.publish_many(exports)  # in the log, so that a rebuild has them too
        # The operator's moves: through the controller, recorded by it, echoed in the log.
        first = mint(settings, "catalog", "promote", "acme/math@prod", "--to", "1", "--by", "alice")
        assert first.returncode == 0 and "- -> 1 (promote" in first.stderr, first.stderr
        mid = datetime.now(UTC)
        second = mint(
            settings, "catalog", "promote", "acme/math@prod", "--to", "2", "--expected", "1"
        )
        assert second.returncode == 0, second.stderr
        stale = mint(
            settings, "catalog", "promote", "acme/math@prod", "--to", "1", "--expected", "1"
        )
        assert stale.returncode == 1 and "is at revision 2, not the expected 1" in stale.stderr
        assert "Traceback" not in stale.stderr
        moves = wait_until(
            lambda: len(m := client.events(policy, ["alias.moved"])) == 2 and m,
            30,
            "the two moves in the log",
            controller,
        )
        assert [(m.payload.to_revision, m.payload.seq) for m in moves] == [(1, 1), (2, 2)]
        assert moves[0].payload.requested_by == "alice" and moves[0].producer == "controller"

        # Enough events for the controller to forget the first move's id, then a replay of
        # serving.events up to between the two moves: the first move comes back.
        filler = [
            make_event(
                EvalRequested(
                    revision=1, adapter_digest=exports[0].payload.adapter_digest, suite="toy"
                ),
                tenant=tenant,
                policy=policy,
                producer="test",
            )
            for _ in range(RECENT)
        ]
        producer.publish_many(filler)
        wait_until(
            lambda: str(filler[-1].event_id) in view.get(f"{tenant}/{policy}")["recent"],
            120,
            "the controller to read the filler",
            controller,
        )
        assert str(moves[0].event_id) not in view.get(f"{tenant}/{policy}")["recent"]
        replay = mint(
            settings,
            "replay",
            "serving.events",
            "--to-time",
            mid.isoformat(),
            "--to-topic",
            "serving.events",
        )
        assert replay.returncode == 0 and "re-published 1 records" in replay.stdout, replay.stderr
        wait_until(
            lambda: str(moves[0].event_id) in view.get(f"{tenant}/{policy}")["recent"],
            120,
            "the controller to read the replayed move",
            controller,
        )
        assert view.get(f"{tenant}/{policy}")["aliases"] == {"prod": 2}

        # Revision 3 passes the gate: promoted from 2, not refused for expecting 1.
        producer.publish(exp3 := export(repo, tenant, policy, 3))
        req = client.wait_for(
            lambda e: e.type == "eval.requested" and e.policy == policy and e.payload.revision == 3,
            what="eval.requested of 3",
        )
        producer.publish(done := answer(req, 0.9))
        cmd = client.wait_caused_by(done, "serving.promote")
        assert cmd.payload.expected_revision == 2
        moved = client.wait_caused_by(cmd, "alias.moved", "serving.refused")
        assert moved.type == "alias.moved" and moved.payload.to_revision == 3, moved.payload
        assert exp3.payload.revision == 3 == repo.resolve(f"{tenant}/{policy}@prod").revision
        wait_until(
            lambda: len(repo.alias_history(tenant, policy, "prod")) == 3,
            60,
            "3 history rows",
            projector,
        )
    finally:
        client.close()
        producer.close()
        controller.stop()
        projector.stop()
    try:  # every move is in the log: a rebuild equals the catalog
        assert_catalog_equals_replay(settings, session)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}_rb", timeout=60)
