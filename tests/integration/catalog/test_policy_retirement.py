"""`mint policies retire` on real Kafka and Cassandra: the CLI publishes policy.retire, a
controller running in a thread carries it out (writes the catalog, answers policy.retired), a
projector in a thread records the fact again from the log, the retired policy takes no revision
and no alias move while its alias still resolves, `--undo` restores it, each fact answers its
command, and a catalog rebuilt from the log has the same policies row (retired_at, retired_by)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from catalog.exceptions import PolicyRetired
from catalog.projection import execute_serving_command
from catalog.rebuild import rebuild
from catalog.repository import CatalogRepository
from catalog.snapshot import compare
from mint.cli import main
from schemas.events import PromoteCommand
from streams.producer import EventProducer
from workers.controller.worker import run_controller
from workers.projector import read_log, run_projector

from .test_projection import command, export

TENANT, POLICY = "acme", "old-rl"
# slow: over 9 s a module here (worker processes, own services, waits); `-m "not slow"` skips it
pytestmark = pytest.mark.slow


PID = f"{TENANT}/{POLICY}"


@pytest.fixture
def cli_env(settings, monkeypatch):
    from schemas.settings import get_settings

    monkeypatch.setenv("MINT_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("MINT_KEYSPACE", settings.keyspace)
    monkeypatch.setenv("MINT_STORE_URI", settings.store_uri)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def projector(settings, live):
    """`mint worker projector` in a thread for the test's duration."""
    stop = threading.Event()
    thread = threading.Thread(
        target=run_projector,
        args=(settings,),
        kwargs={"stop": stop, "group_id": f"{settings.topic_prefix}-catalog-projector"},
        daemon=True,
    )
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


@pytest.fixture
def controller(settings, live):
    """`mint worker controller` in a thread for the test's duration (it carries out
    policy.retire)."""
    stop = threading.Event()
    thread = threading.Thread(
        target=run_controller,
        args=(settings,),
        kwargs={"stop": stop, "group_id": f"{settings.topic_prefix}-controller"},
        daemon=True,
    )
    thread.start()
    yield
    stop.set()
    thread.join(timeout=30)


def _until(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
        except Exception:
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, "the workers did not apply it in time"
        time.sleep(0.2)


def _latest(repo: CatalogRepository) -> int | None:
    page, _ = repo.list_revisions(TENANT, POLICY, page_size=1)
    return page[0].revision if page else None


def _retire(*args: str):
    # (the first one waits for the controller thread to join its group on a busy machine)
    return CliRunner().invoke(main, ["policies", "retire", PID, "--timeout", "120", *args])


def test_retire_refuses_revisions_keeps_aliases_and_undo_restores(
    settings, live, cli_env, projector, controller
) -> None:
    session = live
    repo = CatalogRepository(session, settings.keyspace)
    with EventProducer(settings) as producer:
        producer.publish_many([export(TENANT, POLICY, n, minute=n) for n in (1, 2)])
        _until(lambda: _latest(repo) == 2)
        promote = command(PromoteCommand(alias="prod", revision=2), TENANT, POLICY, 5)
        fact = execute_serving_command(repo, promote, producer="controller/test")
        producer.publish(fact)
    # (Projected before the retirement: a move the projector reads after it is refused.)
    _until(lambda: repo.is_applied(fact.event_id))

    missing = CliRunner().invoke(main, ["policies", "retire", "acme/nope"])
    assert missing.exit_code == 1 and "does not exist" in missing.output

    done = _retire("--reason", "superseded by new-rl")
    assert done.exit_code == 0, done.output
    assert "retired at" in done.output and "by cli" in done.output
    pol = repo.get_policy(TENANT, POLICY)
    assert pol.retired_at is not None and pol.retired_by == "cli"
    # No new revision, no alias move; what is there stays readable.
    with pytest.raises(PolicyRetired, match="--undo"):
        repo.register_revision(TENANT, POLICY, digest="sha256:" + "e" * 64, store_uri="file:///x")
    again = command(PromoteCommand(alias="prod", revision=1), TENANT, POLICY, 6)
    with pytest.raises(PolicyRetired):
        execute_serving_command(repo, again, producer="controller/test")
    assert repo.resolve(f"{PID}@prod").revision == 2
    assert [r.revision for r in repo.iter_revisions(TENANT, POLICY)] == [2, 1]
    assert "nothing to do" in _retire().output  # already retired: nothing sent

    shown = CliRunner().invoke(main, ["policies", "show", PID, "-o", "json"])
    row = json.loads(shown.stdout)
    assert row["retired"] is True and row["aliases"] == {"prod": 2} and row["latest_revision"] == 2

    undone = _retire("--undo")
    assert undone.exit_code == 0 and "restored" in undone.output, undone.output
    assert repo.get_policy(TENANT, POLICY).retired_at is None
    with EventProducer(settings) as producer:  # registration works again (through the log)
        producer.publish(export(TENANT, POLICY, 3, minute=3))
    _until(lambda: _latest(repo) == 3)

    assert _retire("--reason", "for good").exit_code == 0
    live_row = repo.get_policy(TENANT, POLICY)
    assert live_row.retired_at is not None

    # Each fact answers its command (three asked, three carried out) and was projected too.
    log = list(read_log(settings, topics=("serving.commands", "serving.events")))
    asked = {e.event_id: e for e in log if e.type == "policy.retire" and e.policy_id == PID}
    facts = [e for e in log if e.type == "policy.retired" and e.policy_id == PID]
    assert len(asked) == 3 and sorted(f.causation_id for f in facts) == sorted(asked)
    assert [f.payload.retired for f in facts] == [
        asked[f.causation_id].payload.retired for f in facts
    ]
    _until(lambda: all(repo.is_applied(f.event_id) for f in facts))

    # The catalog is a projection of the log: a rebuild has the same policies row.
    target = f"{settings.keyspace}_rb"
    try:
        report = rebuild(session, target, settings.keyspace_replication, read_log(settings))
        assert report.failures == []
        rebuilt = CatalogRepository(session, target).get_policy(TENANT, POLICY)
        assert (rebuilt.retired_at, rebuilt.retired_by) == (live_row.retired_at, "cli")
        assert rebuilt == live_row
        diff = compare(session, settings.keyspace, target, tables=("policies", "revisions"))
        assert diff.identical, diff.summary()
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)
