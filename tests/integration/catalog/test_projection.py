"""The projector's logic (apply one event) and rebuild-from-log, on real Cassandra."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from catalog.exceptions import AliasConflict, Conflict
from catalog.projection import Outcome, apply_event, execute_serving_command
from catalog.rebuild import rebuild
from catalog.repository import CatalogRepository
from catalog.snapshot import compare, dump
from schemas import make_event
from schemas.events import AliasMoved, ExportCompleted, PromoteCommand, RollbackCommand

from .conftest import digest_of

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def export(tenant, policy, n, minute=0, parent=-1):
    return make_event(
        ExportCompleted(
            revision=n,
            adapter_digest=digest_of(tenant, policy, n),
            store_uri=f"file:///store/{tenant}/{policy}/{n}",
            size_bytes=1000 + n,
            rank=8,
            target_modules=["q_proj", "v_proj"],
            base_model="tiny-llama",
            base_model_fingerprint=digest_of("base"),
            parent_revision=(n - 1 or None) if parent == -1 else parent,
        ),
        tenant=tenant,
        policy=policy,
        producer="trainer/test",
        occurred_at=T0 + timedelta(minutes=minute),
    )


def command(payload, tenant, policy, minute):
    return make_event(
        payload,
        tenant=tenant,
        policy=policy,
        producer="sdk/test",
        occurred_at=T0 + timedelta(minutes=minute),
    )


def live_history(repo, tenant):
    """Drive a live catalog the way the workers do; return the event log it produced."""
    log = [export(tenant, p, n, minute=n) for p in ("a", "b") for n in (1, 2, 3)]
    for env in log:
        assert apply_event(repo, env) is Outcome.APPLIED
    cmds = [
        command(PromoteCommand(alias="prod", revision=1, reason="first"), tenant, "a", 10),
        command(PromoteCommand(alias="prod", revision=3, expected_revision=1), tenant, "a", 11),
        command(RollbackCommand(alias="prod", reason="regression"), tenant, "a", 12),
        command(PromoteCommand(alias="canary", revision=2), tenant, "b", 13),
    ]
    moved = [execute_serving_command(repo, c, producer="controller/test") for c in cmds]
    for env in moved:  # the projector then sees the facts the controller published
        assert apply_event(repo, env) is Outcome.APPLIED
    return log + moved


def test_live_flow_yields_expected_catalog(repo, tenant):
    log = live_history(repo, tenant)
    assert repo.resolve(f"{tenant}/a@prod").revision == 1
    assert repo.resolve(f"{tenant}/b@canary").revision == 2
    hist = repo.alias_history(tenant, "a", "prod")
    assert [(h.from_revision, h.to_revision, h.kind) for h in hist] == [
        (3, 1, "rollback"),
        (1, 3, "promote"),
        (None, 1, "promote"),
    ]
    assert hist[0].moved_at == T0 + timedelta(minutes=12)  # times come from the events
    moved = [e for e in log if isinstance(e.payload, AliasMoved)]
    assert [e.payload.cause for e in moved] == ["promote", "promote", "rollback", "promote"]
    rev = repo.get_revision(tenant, "a", 2)
    assert (
        rev.metadata["rank"] == 8 and rev.parent_revision == 1 and rev.created_by == "trainer/test"
    )


def test_applying_the_same_events_twice_changes_nothing(catalog_keyspace, repo, tenant):
    session, ks = catalog_keyspace
    log = live_history(repo, tenant)
    before = dump(session, ks, tenant=tenant)
    assert all(apply_event(repo, e) is Outcome.DUPLICATE for e in log)
    assert dump(session, ks, tenant=tenant) == before
    # A crash after the write but before the applied_events row: the writes alone are idempotent.
    for e in log:
        session.execute(f"DELETE FROM {ks}.applied_events WHERE event_id = %s", (e.event_id,))
    assert all(apply_event(repo, e) is Outcome.APPLIED for e in log)
    assert dump(session, ks, tenant=tenant) == before


def test_redelivered_command_returns_the_same_fact(repo, tenant):
    apply_event(repo, export(tenant, "a", 1))
    apply_event(repo, export(tenant, "a", 2))
    cmd = command(PromoteCommand(alias="prod", revision=2), tenant, "a", 5)
    first = execute_serving_command(repo, cmd, producer="controller/test")
    # Another move lands before the redelivery: the command is still recognised as done.
    repo.move_alias(tenant, "a", "prod", 1, expected=2)
    again = execute_serving_command(repo, cmd, producer="controller/test")
    assert again.event_id == first.event_id and again.payload == first.payload
    assert len(repo.alias_history(tenant, "a", "prod")) == 2
    stale = command(PromoteCommand(alias="prod", revision=2, expected_revision=2), tenant, "a", 6)
    with pytest.raises(AliasConflict, match="is at revision 1, not the expected 2"):
        execute_serving_command(repo, stale, producer="controller/test")


def test_contradicting_export_is_refused_and_writes_nothing(catalog_keyspace, repo, tenant):
    session, ks = catalog_keyspace
    apply_event(repo, export(tenant, "a", 1))
    before = dump(session, ks, tenant=tenant)
    with pytest.raises(Conflict, match="says revision 3 but the next revision is 2"):
        apply_event(repo, export(tenant, "a", 3, parent=None))
    same_digest_other_number = export(tenant, "a", 1).model_copy(
        update={
            "event_id": uuid.uuid4(),
            "payload": export(tenant, "a", 1).payload.model_copy(update={"revision": 2}),
        }
    )
    with pytest.raises(Conflict, match="cannot be two revisions"):
        apply_event(repo, same_digest_other_number)
    assert dump(session, ks, tenant=tenant) == before


def test_rebuild_from_log_equals_live(catalog_keyspace, base_settings, repo, tenant):
    session, ks = catalog_keyspace
    log = live_history(repo, tenant)
    target = f"rb_{uuid.uuid4().hex[:12]}"
    try:
        # Log order as a replay reads it: the export topic, then the serving events topic.
        ordered = [e for e in log if e.type == "export.completed"] + [
            e for e in log if e.type == "alias.moved"
        ]
        report = rebuild(session, target, base_settings.keyspace_replication, ordered)
        assert report.outcomes == {"applied": len(log)} and not report.failures
        diff = compare(session, ks, target, tenant=tenant)
        assert diff.identical, diff.summary()
        assert diff.tables["revisions"][0] == 6 and diff.tables["alias_history"][0] == 4
        with pytest.raises(Conflict, match="is not empty"):
            rebuild(session, target, base_settings.keyspace_replication, ordered)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)


def canary_fact(repo, tenant, policy, route, reason=""):
    """The ``canary.started`` the controller publishes for a route it set."""
    from schemas.events import CanaryStarted

    fact = CanaryStarted(
        alias="prod",
        canary_id=route.canary_id,
        incumbent_revision=route.incumbent_revision,
        revision=route.revision,
        adapter_digest=route.digest,
        store_uri=route.store_uri,
        share=route.share,
        reason=reason,
        requested_by=route.started_by,
    )
    return command(fact, tenant, policy, 0).model_copy(update={"occurred_at": route.started_at})


def test_a_rebuild_routes_a_running_canary_as_the_live_catalog_does(
    catalog_keyspace, base_settings, repo, tenant
):
    """Routes live on the alias rows beside the pointers, written by the controller: a rebuild
    during a canary must keep routing its share (and the compare find the catalogs equal), and
    a canary that ended must stay ended, also where the live projector reads its start late."""
    from schemas.events import CanaryEnded

    session, ks = catalog_keyspace
    log = live_history(repo, tenant)  # a@prod is at revision 1, b@canary at 2
    facts = []
    for policy, revision in (("a", 2), ("b", 3)):
        if policy == "b":
            move = command(PromoteCommand(alias="prod", revision=1), tenant, "b", 20)
            facts.append(execute_serving_command(repo, move, producer="controller/test"))
            apply_event(repo, facts[-1])
        route = repo.start_canary(
            tenant, policy, "prod", revision, 0.25, canary_id=uuid.uuid4(), by="ops",
            reason="try it", at=T0 + timedelta(minutes=30),
        )  # fmt: skip
        facts.append(canary_fact(repo, tenant, policy, route, reason="try it"))
        repo.record_canary(facts[-1])
    ended = CanaryEnded(
        alias="prod", canary_id=route.canary_id, revision=3, incumbent_revision=1,
        outcome="rolled_back", reason="worse",
    )  # fmt: skip
    repo.end_canary(tenant, "b", "prod", route.canary_id)
    facts.append(command(ended, tenant, "b", 40))
    repo.record_canary(facts[-1])
    canaries = [f for f in facts if f.type.startswith("canary.")]
    for fact in canaries:  # a projector behind the controller: it never restarts b's canary
        assert apply_event(repo, fact) is Outcome.APPLIED
    assert repo.resolve(f"{tenant}/b@prod").canary is None
    target = f"rb_{uuid.uuid4().hex[:12]}"
    try:
        report = rebuild(session, target, base_settings.keyspace_replication, log + facts)
        assert not report.failures
        rebuilt = CatalogRepository(session, target)
        running = rebuilt.resolve(f"{tenant}/a@prod").canary
        assert running == repo.resolve(f"{tenant}/a@prod").canary
        assert running is not None and (running.revision, running.share) == (2, 0.25)
        assert rebuilt.resolve(f"{tenant}/b@prod").canary is None
        diff = compare(session, ks, target, tenant=tenant)
        assert diff.identical, diff.summary()
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)


def test_compare_notices_a_difference(catalog_keyspace, base_settings, repo, tenant):
    session, ks = catalog_keyspace
    log = live_history(repo, tenant)
    target = f"rb_{uuid.uuid4().hex[:12]}"
    try:
        rebuild(session, target, base_settings.keyspace_replication, log[:-1])  # one move lost
        diff = compare(session, ks, target, tenant=tenant)
        assert not diff.identical
        assert diff.tables["aliases"][1] == 1 and diff.tables["alias_history"][1] == 1
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)


def test_rebuild_lists_a_refused_event_and_applies_the_rest_of_its_policy(
    base_settings, catalog_keyspace, tenant
):
    # Policy a's run carries a contradicting export (revision 3 right after 1): the rebuild
    # applies a's other events one at a time, lists the refused one, and b is untouched.
    session, _ = catalog_keyspace
    bad = export(tenant, "a", 3, parent=None)
    log = [export(tenant, "a", 1), bad, export(tenant, "a", 2), export(tenant, "b", 1)]
    target = f"rb_{uuid.uuid4().hex[:12]}"
    seen: list[int] = []
    try:
        report = rebuild(
            session, target, base_settings.keyspace_replication, log, progress=seen.append
        )
        assert report.outcomes == {"applied": 3, "failed": 1}
        assert len(report.failures) == 1 and str(bad.event_id) in report.failures[0]
        rebuilt = CatalogRepository(session, target)
        assert [r.revision for r in rebuilt.list_revisions(tenant, "a")[0]] == [2, 1]
        assert [r.revision for r in rebuilt.list_revisions(tenant, "b")[0]] == [1]
        assert sum(seen) == len(log)
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)


def test_a_tenant_exists_since_its_earliest_policy_in_any_order(repo, tenant):
    # The projector applies policies on parallel threads and a rebuild reads the log partition
    # by partition: the tenant's created_at must not depend on which came first.
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for policy, minutes in (("late", 30), ("early", 10), ("middle", 20)):
        repo.create_policy(tenant, policy, "tiny", at=t0 + timedelta(minutes=minutes))
    other = CatalogRepository(repo.session, repo.keyspace)  # another process, nothing cached
    other.create_policy(tenant, "first", "tiny", at=t0)
    row = repo.session.execute(
        f"SELECT created_at FROM {repo.keyspace}.tenants WHERE tenant = %s", (tenant,)
    ).one()
    assert row.created_at.replace(tzinfo=UTC) == t0
