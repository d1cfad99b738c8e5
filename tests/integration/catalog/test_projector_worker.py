"""The projector worker end to end: real Kafka in, real Cassandra out, then rebuild from the log."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from catalog.projection import execute_serving_command
from catalog.rebuild import rebuild
from catalog.repository import CatalogRepository
from catalog.snapshot import compare
from schemas.events import PromoteCommand, RollbackCommand
from streams.producer import EventProducer
from streams.records import RetryPolicy
from workers.projector import LogStats, read_log, run_projector

from .test_projection import T0, command, export

# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("parallel", [1, 4], ids=["one-by-one", "runs-of-a-policy"])
def test_projector_applies_log_with_duplicates_and_rebuild_matches(
    settings, live, tmp_path, parallel
):
    """``parallel`` > 1: a policy's records of one poll go to ``apply_events`` together (a run
    with a refused export in it is applied again one by one)."""
    session = live
    tenant = "acme"
    exports = [export(tenant, p, n, minute=n) for p in ("a", "b") for n in (1, 2, 3)]
    bad = export(tenant, "a", 9, minute=30, parent=None)  # out of order: refused, dead-lettered
    with EventProducer(settings) as producer:
        # Every export twice: the at-least-once redelivery the projector must absorb.
        producer.publish_many(exports + exports + [bad])
        assert (
            run_projector(
                settings,
                idle_timeout_s=3,
                max_records=13,
                parallel_keys=parallel,
                retry=RetryPolicy(max_attempts=2, backoff_s=0.05),
            ).records
            == 13
        )
        repo = CatalogRepository(session, settings.keyspace)
        assert [r.revision for r in repo.iter_revisions(tenant, "a")] == [3, 2, 1]
        # The controller runs commands against the catalog and publishes the facts.
        cmds = [
            command(
                PromoteCommand(alias="prod", revision=2, requested_by="alice"), tenant, "a", 40
            ),
            command(PromoteCommand(alias="prod", revision=3, expected_revision=2), tenant, "a", 41),
            command(RollbackCommand(alias="prod", reason="p99 regression"), tenant, "a", 42),
        ]
        facts = [execute_serving_command(repo, c, producer="controller/test") for c in cmds]
        producer.publish_many(facts + facts[:1])  # one fact redelivered
    stats = run_projector(settings, idle_timeout_s=3, max_records=4, parallel_keys=parallel)
    assert stats.handled == 4 and stats.dead_lettered == 0
    assert repo.resolve(f"{tenant}/a@prod").revision == 2
    hist = repo.alias_history(tenant, "a", "prod")
    assert [(h.from_revision, h.to_revision, h.kind) for h in hist] == [
        (3, 2, "rollback"),
        (2, 3, "promote"),
        (None, 2, "promote"),
    ]
    assert hist[-1].moved_by == "alice" and hist[0].moved_at == T0 + timedelta(minutes=42)
    # One pointer per move, in order; the stale redelivered first move is not re-published.
    assert _policy_state(settings) == {f"{tenant}/a@prod".encode(): [2, 3, 2]}

    # Rebuild from the log (library path) into an empty keyspace: identical to the live catalog.
    target = f"{settings.keyspace}_rb"
    try:
        log_stats = LogStats()
        report = rebuild(
            session, target, settings.keyspace_replication, read_log(settings, stats=log_stats)
        )
        assert log_stats.records == 13 + 4
        assert report.outcomes["applied"] == 9 and report.outcomes["duplicate"] == 7
        assert report.outcomes["failed"] == 1 and "says revision 9" in report.failures[0]
        diff = compare(session, settings.keyspace, target)
        assert diff.identical, diff.summary()
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)

    # The CLI does the same and exits 1 only because one event in the log is refused.
    env = {
        **os.environ,
        "MINT_TOPIC_PREFIX": settings.topic_prefix,
        "MINT_KEYSPACE": settings.keyspace,
    }
    cli = subprocess.run(
        [sys.executable, "-m", "mint.cli", "catalog", "rebuild", "--drop"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "identical" in cli.stderr, cli.stderr
    assert "refused" in cli.stderr and cli.returncode == 1


def _policy_state(settings) -> dict[bytes, list[int]]:
    """Every pointer on the (compacted, not yet cleaned) policy.state topic, per alias key."""
    from kafka import TopicPartition

    from schemas import decode_event
    from streams.clients import make_consumer
    from streams.topics import POLICY_STATE, topic_for

    topic = topic_for(settings, POLICY_STATE)
    consumer = make_consumer(settings, group_id=None, consumer_timeout_ms=3000)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    pointers: dict[bytes, list[int]] = {}
    for m in consumer:
        pointers.setdefault(m.key, []).append(decode_event(m.value).payload.to_revision)
    consumer.close()
    return pointers


def test_the_projector_redrives_a_window_as_mint_replay_help_shows(settings, live) -> None:
    """`mint replay export.events --processor workers.projector:handler` (the --help example):
    the window's exports land in the catalog, and a second re-drive changes nothing."""
    from streams.replay import redrive, resolve_window

    exports = [export("acme", "r", n, minute=n) for n in (1, 2)]
    with EventProducer(settings) as producer:
        producer.publish_many(exports)
    window = resolve_window(settings, settings.topic("export.events"))
    assert window.total == 2
    for _ in range(2):
        _, stats = redrive(settings, window, "workers.projector:handler")
        assert stats.handled == 2 and stats.dead_lettered == 0
    repo = CatalogRepository(live, settings.keyspace)
    assert [r.revision for r in repo.iter_revisions("acme", "r")] == [2, 1]
