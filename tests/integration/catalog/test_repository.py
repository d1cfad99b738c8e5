"""The repository against real Cassandra: registration, resolve, CAS moves, rollback, errors."""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from catalog.cluster import connect
from catalog.exceptions import (
    AliasConflict,
    AliasNotFound,
    Conflict,
    CrossTenantReference,
    InvalidReference,
    MalformedDigest,
    PolicyExists,
    PolicyNotFound,
    PolicyRetired,
    RegistrationInProgress,
    RevisionNotFound,
)
from catalog.importer import import_file
from catalog.repository import CatalogRepository
from catalog.snapshot import dump

from .conftest import digest_of, uri_of


def _policy_with(repo, tenant, n=3, policy="math-rl"):
    repo.create_policy(tenant, policy, "tiny-llama", by="test")
    return [
        repo.register_revision(
            tenant, policy, digest=digest_of(tenant, i), store_uri=uri_of(tenant, policy, i)
        )
        for i in range(1, n + 1)
    ]


def test_create_policy_is_idempotent_and_refuses_another_base(repo, tenant):
    a = repo.create_policy(tenant, "p", "tiny-llama", by="alice")
    assert repo.create_policy(tenant, "p", "tiny-llama", by="bob") == a
    with pytest.raises(PolicyExists, match="base_model 'tiny-llama', not 'other'"):
        repo.create_policy(tenant, "p", "other")
    assert [p.policy for p in repo.list_policies(tenant)] == ["p"]


def test_register_numbers_revisions_and_is_idempotent(repo, tenant):
    revs = _policy_with(repo, tenant, 3)
    assert [r.revision for r in revs] == [1, 2, 3]
    assert all(r.is_new for r in revs)
    again = repo.register_revision(
        tenant, "math-rl", digest=digest_of(tenant, 2), store_uri=uri_of(tenant, "math-rl", 2)
    )
    assert again.revision == 2 and not again.is_new
    # By source event id: a redelivered export never creates revision N+1.
    eid = uuid.uuid4()
    kw = dict(digest=digest_of(tenant, "x"), store_uri="file:///s/x", source_event_id=eid)
    first = repo.register_revision(tenant, "math-rl", **kw)
    second = repo.register_revision(tenant, "math-rl", **kw)
    assert (first.revision, first.is_new, second.revision, second.is_new) == (4, True, 4, False)
    page, _ = repo.list_revisions(tenant, "math-rl")
    assert [r.revision for r in page] == [4, 3, 2, 1]


def test_register_with_demanded_number(repo, tenant):
    repo.create_policy(tenant, "math-rl", "tiny-llama")
    with pytest.raises(Conflict, match="says revision 2 but the next revision is 1"):
        repo.register_revision(
            tenant, "math-rl", digest=digest_of("early"), store_uri="file:///s/e", revision=2
        )
    _policy_with(repo, tenant, 2)
    with pytest.raises(Conflict, match="says revision 5 but the next revision is 3"):
        repo.register_revision(
            tenant, "math-rl", digest=digest_of("gap"), store_uri="file:///s/g", revision=5
        )
    # The refused registration left no claim: the same digest registers fine as revision 3.
    r = repo.register_revision(
        tenant, "math-rl", digest=digest_of("gap"), store_uri="file:///s/g", revision=3
    )
    assert r.revision == 3


def test_concurrent_registrations_get_distinct_gapless_numbers(catalog_keyspace, tenant):
    session, ks = catalog_keyspace
    repo = CatalogRepository(session, ks)
    repo.create_policy(tenant, "p", "tiny-llama")
    got, errors = [], []

    def worker(k: int) -> None:
        try:
            for i in range(5):
                d = digest_of(tenant, k, i)
                got.append(repo.register_revision(tenant, "p", digest=d, store_uri="file:///s/x"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.revision for r in got) == list(range(1, 21))
    assert len({r.digest for r in got}) == 20


def test_resolve_alias_number_and_digest(repo, tenant):
    revs = _policy_with(repo, tenant, 3)
    repo.move_alias(tenant, "math-rl", "prod", 2, expected=None, by="alice", reason="good eval")
    by_alias = repo.resolve(f"{tenant}/math-rl@prod")
    by_number = repo.resolve(f"{tenant}/math-rl@2")
    by_digest = repo.resolve(f"{tenant}/math-rl@{revs[1].digest}")
    assert by_alias.revision == by_number.revision == by_digest.revision == 2
    assert by_alias.digest == revs[1].digest and by_alias.store_uri == revs[1].store_uri
    assert by_alias.alias == "prod"


def test_paging_over_1000_revisions(catalog_keyspace, repo, tenant, tmp_path):
    session, ks = catalog_keyspace
    revs = [(digest_of(tenant, i), f"file:///s/{tenant}/big/{i}") for i in range(1, 1001)]
    lines = [
        json.dumps(
            {
                "tenant": tenant,
                "policy": "big",
                "revision": i,
                "digest": d,
                "uri": u,
                "base_model": "tiny-llama",
            }
        )
        for i, (d, u) in enumerate(revs, 1)
    ]
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    assert import_file(session, ks, tmp_path / "big.jsonl").counts.accepted == 1000
    seen, state, pages = [], None, 0
    while True:
        page, state = repo.list_revisions(tenant, "big", page_size=64, page_state=state)
        seen += [r.revision for r in page]
        pages += 1
        if state is None:
            break
    assert seen == list(range(1000, 0, -1))
    assert pages == 16  # 15 full pages of 64 and one of 40
    # Bulk rows are real catalog rows: the next registration is 1001 and digests resolve.
    assert (
        repo.register_revision(
            tenant, "big", digest=digest_of("new"), store_uri="file:///n"
        ).revision
        == 1001
    )
    assert repo.resolve(f"{tenant}/big@{revs[499][0]}").revision == 500


@pytest.mark.parametrize("start", [None, 1], ids=["new-alias", "existing-alias"])
def test_two_racing_promotions_exactly_one_wins(
    catalog_keyspace, base_settings, repo, tenant, start
):
    """Real concurrency: two threads, each with its own cluster connection and session, move
    the same alias from the same expected value at the same moment."""
    _, ks = catalog_keyspace
    _policy_with(repo, tenant, 3)
    if start is not None:
        repo.move_alias(tenant, "math-rl", "prod", start, expected=None)
    sessions = [connect(base_settings) for _ in range(2)]
    repos = [CatalogRepository(s, ks) for _, s in sessions]
    barrier = threading.Barrier(2)
    results: dict[int, object] = {}

    def promote(i: int, to: int) -> None:
        barrier.wait()
        try:
            results[i] = repos[i].move_alias(
                tenant, "math-rl", "prod", to, expected=start, by=f"w{i}"
            )
        except AliasConflict as e:
            results[i] = e

    try:
        threads = [threading.Thread(target=promote, args=(i, i + 2)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for cluster, _ in sessions:
            cluster.shutdown()
    wins = [r for r in results.values() if not isinstance(r, AliasConflict)]
    losses = [r for r in results.values() if isinstance(r, AliasConflict)]
    assert len(wins) == 1 and len(losses) == 1
    winner = wins[0].to_revision
    assert losses[0].current == winner
    assert f"is at revision {winner}, not the expected" in str(losses[0])
    history = repo.alias_history(tenant, "math-rl", "prod")
    raced = [h for h in history if h.seq > (0 if start is None else 1)]
    assert [(h.from_revision, h.to_revision, h.moved_by) for h in raced] == [
        (start, winner, f"w{winner - 2}")
    ]
    assert repo.resolve(f"{tenant}/math-rl@prod").revision == winner


def test_rollback_restores_previous_target_and_is_recorded(repo, tenant):
    _policy_with(repo, tenant, 3)
    repo.move_alias(tenant, "math-rl", "prod", 1, expected=None, by="a")
    repo.move_alias(tenant, "math-rl", "prod", 3, expected=1, by="a", reason="rev 3 passed eval")
    back = repo.rollback(tenant, "math-rl", "prod", by="oncall", reason="regression")
    assert (back.from_revision, back.to_revision, back.kind) == (3, 1, "rollback")
    assert repo.resolve(f"{tenant}/math-rl@prod").revision == 1
    named = repo.rollback(tenant, "math-rl", "prod", to=2, by="oncall")
    assert (named.from_revision, named.to_revision) == (1, 2)
    history = repo.alias_history(tenant, "math-rl", "prod")
    assert [(h.seq, h.from_revision, h.to_revision, h.kind, h.moved_by) for h in history] == [
        (4, 1, 2, "rollback", "oncall"),
        (3, 3, 1, "rollback", "oncall"),
        (2, 1, 3, "promote", "a"),
        (1, None, 1, "promote", "a"),
    ]
    assert history[1].reason == "regression" and history[2].reason == "rev 3 passed eval"


def test_rollback_without_previous_target(repo, tenant):
    _policy_with(repo, tenant, 1)
    repo.move_alias(tenant, "math-rl", "prod", 1, expected=None)
    with pytest.raises(Conflict, match="no previous target"):
        repo.rollback(tenant, "math-rl", "prod")


def test_move_with_same_event_id_is_a_no_op(repo, tenant):
    _policy_with(repo, tenant, 2)
    eid = uuid.uuid4()
    a = repo.move_alias(tenant, "math-rl", "prod", 2, expected=None, event_id=eid)
    b = repo.move_alias(tenant, "math-rl", "prod", 2, expected=None, event_id=eid)
    assert a == b
    assert len(repo.alias_history(tenant, "math-rl", "prod")) == 1


def test_a_retired_policy_takes_no_registrations_or_moves(catalog_keyspace, repo, tenant):
    # Nothing in MinT retires a policy (an operator may, in CQL); the catalog honours it.
    session, ks = catalog_keyspace
    _policy_with(repo, tenant, 1)
    session.execute(
        f"UPDATE {ks}.policies SET retired_at = toTimestamp(now()), "
        "retired_by = 'admin' WHERE tenant = %s AND policy = 'math-rl'",
        (tenant,),
    )
    retired = repo.get_policy(tenant, "math-rl")
    assert retired.retired_at is not None and retired.retired_by == "admin"
    with pytest.raises(PolicyRetired):
        repo.register_revision(tenant, "math-rl", digest=digest_of("z"), store_uri="file:///z")
    with pytest.raises(PolicyRetired):
        repo.move_alias(tenant, "math-rl", "prod", 1, expected=None)


def _tenant_rows(session, ks, tenant):
    return {
        t: {r for r in rows if dict(r).get("tenant") == tenant}
        for t, rows in dump(session, ks).items()
    }


BAD_INPUTS = [
    # (what, call, error, message fragment)
    (
        "unknown policy",
        lambda r, t: r.register_revision(t, "nope", digest=digest_of(1), store_uri="file:///x"),
        PolicyNotFound,
        "policy {t}/nope does not exist",
    ),
    (
        "malformed digest",
        lambda r, t: r.register_revision(t, "math-rl", digest="sha256:XYZ", store_uri="file:///x"),
        MalformedDigest,
        "digest 'sha256:XYZ' is malformed",
    ),
    (
        "digest without prefix",
        lambda r, t: r.resolve(f"{t}/math-rl@{'a' * 64}"),
        InvalidReference,
        "alias",
    ),
    (
        "another tenant's revision",
        lambda r, t: r.move_alias(t, "math-rl", "prod", "other-tenant/math-rl@1", expected=None),
        CrossTenantReference,
        "belongs to another tenant",
    ),
    (
        "another policy's revision",
        lambda r, t: r.move_alias(t, "math-rl", "prod", f"{t}/other@1", expected=None),
        CrossTenantReference,
        "belongs to another policy",
    ),
    (
        "alias to a missing revision",
        lambda r, t: r.move_alias(t, "math-rl", "prod", 99, expected=None),
        RevisionNotFound,
        "revision 99 of {t}/math-rl does not exist",
    ),
    (
        "alias to a missing digest",
        lambda r, t: r.move_alias(
            t, "math-rl", "prod", f"{t}/math-rl@{digest_of('missing')}", expected=None
        ),
        RevisionNotFound,
        "no revision of {t}/math-rl has digest",
    ),
    (
        "stale expected revision",
        lambda r, t: r.move_alias(t, "math-rl", "canary", 1, expected=2),
        AliasConflict,
        "points nowhere, not the expected 2",
    ),
    (
        "unknown alias",
        lambda r, t: r.resolve(f"{t}/math-rl@staging"),
        AliasNotFound,
        "points nowhere",
    ),
    (
        "bad alias name",
        lambda r, t: r.move_alias(t, "math-rl", "Prod!", 1, expected=None),
        InvalidReference,
        "alias 'Prod!' is not valid",
    ),
    (
        "bad tenant name",
        lambda r, t: r.create_policy("Bad Tenant", "p", "m"),
        InvalidReference,
        "tenant 'Bad Tenant' is not a valid name",
    ),
    (
        "revision zero",
        lambda r, t: r.get_revision(t, "math-rl", 0),
        InvalidReference,
        "expected an integer >= 1",
    ),
    (
        "malformed reference",
        lambda r, t: r.resolve("no-slash@prod"),
        InvalidReference,
        "expected 'tenant/policy@alias'",
    ),
]


@pytest.mark.parametrize("what,call,error,fragment", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_typed_error_and_writes_nothing(
    catalog_keyspace, repo, tenant, what, call, error, fragment
):
    session, ks = catalog_keyspace
    _policy_with(repo, tenant, 1)
    before = _tenant_rows(session, ks, tenant)
    with pytest.raises(error, match=fragment.format(t=tenant).replace("(", r"\(")) as info:
        call(repo, tenant)
    assert isinstance(info.value, ValueError | LookupError | PermissionError | RuntimeError)
    assert _tenant_rows(session, ks, tenant) == before


def test_resume_after_crash_between_revision_and_index(catalog_keyspace, repo, tenant):
    """A registrant died after writing revision N but before indexing it: the retry (same
    source event) finds its own revision instead of creating N+1."""
    session, ks = catalog_keyspace
    _policy_with(repo, tenant, 2)
    eid = uuid.uuid4()
    d = digest_of(tenant, "crash")
    first = repo.register_revision(
        tenant, "math-rl", digest=d, store_uri="file:///c", source_event_id=eid
    )
    session.execute(
        f"UPDATE {ks}.revisions_by_digest SET revision = null WHERE tenant = %s AND policy = 'math-rl' AND digest = %s",
        (tenant, d),
    )
    session.execute(f"DELETE FROM {ks}.applied_events WHERE event_id = %s", (eid,))
    again = repo.register_revision(
        tenant, "math-rl", digest=d, store_uri="file:///c", source_event_id=eid
    )
    assert again.revision == first.revision == 3
    page, _ = repo.list_revisions(tenant, "math-rl")
    assert [r.revision for r in page] == [3, 2, 1]
    assert repo.resolve(f"{tenant}/math-rl@{d}").revision == 3


def test_foreign_claims_block_briefly_then_expire(catalog_keyspace, repo, tenant):
    session, ks = catalog_keyspace
    _policy_with(repo, tenant, 1)
    claim = f"INSERT INTO {ks}.revisions_by_digest (tenant, policy, digest, claimed_by, claimed_at) VALUES (%s, 'math-rl', %s, %s, %s)"
    fresh, stale = digest_of("fresh"), digest_of("stale")
    now = datetime.now(UTC)
    session.execute(claim, (tenant, fresh, uuid.uuid4(), now))
    session.execute(claim, (tenant, stale, uuid.uuid4(), now - timedelta(minutes=5)))
    with pytest.raises(RegistrationInProgress, match="retry in a few seconds"):
        repo.register_revision(tenant, "math-rl", digest=fresh, store_uri="file:///f")
    taken = repo.register_revision(tenant, "math-rl", digest=stale, store_uri="file:///s")
    assert taken.revision == 2 and taken.is_new


def test_a_crash_between_the_alias_move_and_its_history_row_loses_no_audit(repo, tenant):
    from catalog.exceptions import CatalogUnavailable

    _policy_with(repo, tenant, 3)
    repo.move_alias(tenant, "math-rl", "prod", 1, expected=None, by="a", reason="first")
    move_id = uuid.uuid4()
    real_run = repo._run

    def crash_on_history(stmt, params, **kw):
        if stmt is repo._ins_history:  # the process dies right after the compare-and-set
            raise CatalogUnavailable("killed between the pointer and its history row")
        return real_run(stmt, params, **kw)

    repo._run = crash_on_history
    with pytest.raises(CatalogUnavailable):
        repo.move_alias(
            tenant,
            "math-rl",
            "prod",
            3,
            expected=1,
            by="controller",
            reason="rev 3 passed eval",
            event_id=move_id,
        )
    repo._run = real_run
    assert repo.get_alias(tenant, "math-rl", "prod").revision == 3  # the pointer did move
    # A fresh reader sees the whole move in history, completed from the alias row.
    fresh = CatalogRepository(repo.session, repo.keyspace)
    (latest, first) = fresh.alias_history(tenant, "math-rl", "prod")
    assert (
        latest.from_revision,
        latest.to_revision,
        latest.reason,
        latest.moved_by,
        latest.event_id,
    ) == (1, 3, "rev 3 passed eval", "controller", move_id)
    assert (first.from_revision, first.to_revision) == (None, 1)
    # The redelivered command is recognised (no second move), and a rollback still works.
    again = fresh.move_alias(tenant, "math-rl", "prod", 3, expected=1, event_id=move_id)
    assert again.seq == latest.seq
    back = fresh.rollback(tenant, "math-rl", "prod", by="oncall")
    assert (back.from_revision, back.to_revision) == (3, 1)
    assert len(fresh.alias_history(tenant, "math-rl", "prod")) == 3


def test_a_registration_retried_after_a_crash_records_the_revisions_own_time(
    catalog_keyspace, repo, tenant
):
    # Found by benchmarks/fault_injection.py: Cassandra died after the claim and the revision
    # row, before the applied_events row. The retry must record the time the revision (and so
    # its export.completed event) carries, or a replay of the log differs from the catalog.
    import time

    from catalog.exceptions import CatalogUnavailable

    session, ks = catalog_keyspace
    repo.create_policy(tenant, "math-rl", "tiny-llama", by="test")
    source, real_run = uuid.uuid4(), repo._run

    def crash_on_applied(stmt, params, **kw):
        if stmt is repo._ins_applied:
            raise CatalogUnavailable("killed before the applied_events row")
        return real_run(stmt, params, **kw)

    repo._run = crash_on_applied
    kwargs = dict(
        digest=digest_of(tenant, 9), store_uri=uri_of(tenant, "math-rl", 9), source_event_id=source
    )
    with pytest.raises(CatalogUnavailable):
        repo.register_revision(tenant, "math-rl", at=datetime.now(UTC), **kwargs)
    repo._run = real_run
    time.sleep(0.05)
    rev = repo.register_revision(tenant, "math-rl", at=datetime.now(UTC), **kwargs)
    row = session.execute(
        f"SELECT applied_at, revision FROM {ks}.applied_events WHERE event_id = %s", (source,)
    ).one()
    assert row.revision == rev.revision == 1
    assert row.applied_at == rev.created_at.replace(tzinfo=None)  # the driver reads naive UTC


def _conditional_batches(repo):
    """Count the lightweight transactions a repository sends (conditional batches)."""
    from cassandra.query import BatchStatement

    sent, real_run = [], repo._run

    def counting(stmt, params, **kw):
        if isinstance(stmt, BatchStatement) and stmt.serial_consistency_level is not None:
            sent.append(len(stmt._statements_and_parameters))
        return real_run(stmt, params, **kw)

    repo._run = counting
    return sent


def _regs(tenant, numbers, tag="r", parent=True):
    from catalog.models import Registration

    return [
        Registration(
            digest_of(tenant, tag, n),
            uri_of(tenant, "math-rl", n),
            parent_revision=(n - 1 or None) if parent else None,
            revision=n,
            source_event_id=uuid.uuid4(),
            by="trainer/test",
        )
        for n in numbers
    ]


def test_a_run_of_exports_is_one_lightweight_transaction(catalog_keyspace, tenant):
    session, ks = catalog_keyspace
    repo = CatalogRepository(session, ks)
    repo.create_policy(tenant, "math-rl", "tiny-llama")
    lwts = _conditional_batches(repo)
    revs = repo.register_revisions(tenant, "math-rl", _regs(tenant, range(1, 6)))
    assert lwts == [6]  # one batch: the counter and five digest rows
    assert [(r.revision, r.is_new) for r in revs] == [(n, True) for n in range(1, 6)]
    assert [r.revision for r in repo.iter_revisions(tenant, "math-rl")] == [5, 4, 3, 2, 1]
    assert repo.resolve(f"{tenant}/math-rl@{digest_of(tenant, 'r', 3)}").revision == 3
    # The same run again (a redelivered poll): found, nothing new, no second number.
    again = repo.register_revisions(tenant, "math-rl", _regs(tenant, range(1, 6)))
    assert [(r.revision, r.is_new) for r in again] == [(n, False) for n in range(1, 6)]
    # The next run continues; one that repeats a digest registers up to it, then is refused.
    mixed = _regs(tenant, [6, 7]) + _regs(tenant, [8])
    mixed[2] = replace(mixed[2], digest=mixed[0].digest)
    with pytest.raises(Conflict, match="is revision 6 of .* cannot be two revisions"):
        repo.register_revisions(tenant, "math-rl", mixed)
    assert [r.revision for r in repo.iter_revisions(tenant, "math-rl")][:2] == [7, 6]
    with pytest.raises(Conflict, match="says revision 9 but the next revision is 8"):
        repo.register_revisions(tenant, "math-rl", _regs(tenant, [9, 10], tag="late"))
    # A malformed export stops the run there: the ones before it are registered.
    bad = _regs(tenant, [8, 9], tag="bad")
    with pytest.raises(MalformedDigest):
        repo.register_revisions(tenant, "math-rl", [bad[0], replace(bad[1], digest="sha256:x")])
    assert [r.revision for r in repo.iter_revisions(tenant, "math-rl")][0] == 8


def test_racing_runs_of_one_policy_never_share_a_number_or_a_digest(
    catalog_keyspace, base_settings, tenant
):
    """Two projectors (e.g. either side of a rebalance) register runs of the same policy at the
    same moment, each with its own connection: one run wins whole; the other's same content is
    found (no second number), its other content refused (the number is taken)."""
    _, ks = catalog_keyspace
    sessions = [connect(base_settings) for _ in range(3)]
    repos = [CatalogRepository(s, ks) for _, s in sessions]
    repos[0].create_policy(tenant, "math-rl", "tiny-llama")
    same, other = _regs(tenant, range(1, 5)), _regs(tenant, range(1, 5), tag="other")
    barrier, results = threading.Barrier(3), {}

    def run(i: int, regs) -> None:
        barrier.wait()
        try:
            results[i] = repos[i].register_revisions(tenant, "math-rl", regs)
        except Conflict as e:
            results[i] = e

    try:
        threads = [threading.Thread(target=run, args=a) for a in ((0, same), (1, same), (2, other))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for cluster, _ in sessions:
            cluster.shutdown()
    stored = {
        r.revision: r.digest
        for r in CatalogRepository(*catalog_keyspace).iter_revisions(tenant, "math-rl")
    }
    assert sorted(stored) == [1, 2, 3, 4]
    winner = same if stored[1] == same[0].digest else other
    assert [stored[n] for n in range(1, 5)] == [r.digest for r in winner]
    refused = [r for r in results.values() if isinstance(r, Conflict)]
    made = [r for r in results.values() if not isinstance(r, Conflict)]
    assert all("says revision 1 but the next revision is 5" in str(e) for e in refused)
    if winner is same:
        # Both same-content runs got revisions 1-4 as stored. They carry the same source events
        # (one event delivered to two projectors), so a loser that reads the claims before the
        # winner wrote its revision rows takes them for its own interrupted attempt and writes
        # the same rows: either both say new, or only the winner does.
        assert len(refused) == 1 and any(r[0].is_new for r in made)
        assert [(r.revision, r.digest) for r in made[1]] == [
            (r.revision, r.digest) for r in made[0]
        ]
    else:
        assert len(refused) == 2 and [r.is_new for r in made[0]] == [True] * 4
    assert all(r.revision == n for m in made for n, r in zip(range(1, 5), m, strict=True))


def test_a_crash_between_the_decision_and_the_revision_row_is_completed_by_the_retry(
    catalog_keyspace, repo, tenant
):
    from catalog.exceptions import CatalogUnavailable

    _policy_with(repo, tenant, 1)
    source, real_run = uuid.uuid4(), repo._run
    kwargs = dict(
        digest=digest_of(tenant, "c"),
        store_uri=uri_of(tenant, "math-rl", 2),
        source_event_id=source,
        revision=2,
    )

    def crash_on_revision_row(stmt, params, **kw):
        if stmt is repo.registrar.write_revision:  # the process dies after the transaction
            raise CatalogUnavailable("killed before the revision row")
        return real_run(stmt, params, **kw)

    repo._run = crash_on_revision_row
    first_try = datetime.now(UTC).replace(microsecond=0)
    with pytest.raises(CatalogUnavailable):
        repo.register_revision(tenant, "math-rl", at=first_try, **kwargs)
    repo._run = real_run
    # The number and the digest are taken: another registrant of that content waits, and a
    # registration numbered 2 with other content is refused.
    with pytest.raises(RegistrationInProgress, match="has not written yet"):
        repo.register_revision(tenant, "math-rl", digest=kwargs["digest"], store_uri="file:///o")
    with pytest.raises(Conflict, match="says revision 2 but the next revision is 3"):
        repo.register_revision(
            tenant, "math-rl", digest=digest_of("x"), store_uri="file:///x", revision=2
        )
    # The same export again (its redelivery) writes the row: revision 2, as first decided, at
    # the time first decided (the claim row's), which its event carries and a replay writes
    # (found by fault_injection.py --cluster: a compare-and-set that timed out but went through).
    retry_at = first_try + timedelta(seconds=9)
    rev = repo.register_revision(tenant, "math-rl", at=retry_at, **kwargs)
    assert (rev.revision, rev.is_new) == (2, True)
    assert rev.created_at.replace(tzinfo=UTC) == first_try
    assert [r.revision for r in repo.iter_revisions(tenant, "math-rl")] == [2, 1]
    assert repo.resolve(f"{tenant}/math-rl@{kwargs['digest']}").store_uri == kwargs["store_uri"]


def test_an_export_numbered_1_never_overwrites_an_imported_revision(
    catalog_keyspace, repo, tenant, tmp_path
):
    # An import sets only the older counter (revisions.latest_revision): registrations read it.
    session, ks = catalog_keyspace
    lines = [
        json.dumps(
            {
                "tenant": tenant,
                "policy": "imp",
                "revision": i,
                "digest": digest_of(i),
                "uri": f"file:///s/{tenant}/imp/{i}",
                "base_model": "tiny-llama",
            }
        )
        for i in (1, 2, 3)
    ]
    (tmp_path / "imp.jsonl").write_text("\n".join(lines) + "\n")
    assert import_file(session, ks, tmp_path / "imp.jsonl").counts.accepted == 3
    with pytest.raises(Conflict, match="says revision 1 but the next revision is 4"):
        repo.register_revision(
            tenant, "imp", digest=digest_of("new"), store_uri="file:///n", revision=1
        )
    assert repo.get_revision(tenant, "imp", 1).digest == digest_of(1)
    runs = repo.register_revisions(tenant, "imp", _regs(tenant, [4, 5], parent=False))
    assert [r.revision for r in runs] == [4, 5]
