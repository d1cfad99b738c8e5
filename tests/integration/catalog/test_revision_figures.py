"""Revisions carry their figures, on real Cassandra: training figures of an export and
eval.completed results projected into the catalog, read back by the repository and by `mint`,
idempotent on replay, a result of another digest refused, a rebuild from the log equal."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from catalog.exceptions import Conflict, RevisionNotFound
from catalog.projection import Outcome, apply_event, apply_events
from catalog.rebuild import rebuild
from catalog.snapshot import compare, dump
from mint.cli import main
from schemas import make_event
from schemas.events import EvalCompleted, Threshold, TrainingFigures, threshold_failures
from schemas.settings import get_settings

from .test_projection import export

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIGURES = TrainingFigures(steps=20, tokens=5120, loss=0.4125, reward=0.71, learning_rate=1e-4)


def trained_export(tenant, policy, n, minute):
    env = export(tenant, policy, n, minute=minute)
    payload = env.payload.model_copy(update={"training": FIGURES})
    return env.model_copy(update={"payload": payload})


def evaluated(tenant, policy, n, digest, suite, metrics, thresholds, minute):
    limits = {k: Threshold(**v) for k, v in thresholds.items()}
    failures = threshold_failures(metrics, limits)
    return make_event(
        EvalCompleted(
            revision=n,
            adapter_digest=digest,
            suite=suite,
            metrics=metrics,
            thresholds=limits,
            passed=not failures,
            failures=failures,
        ),
        tenant=tenant,
        policy=policy,
        producer="evaluator/test",
        occurred_at=T0 + timedelta(minutes=minute),
    )


def history(tenant, policy="math"):
    first = trained_export(tenant, policy, 1, minute=1)
    second = export(tenant, policy, 2, minute=2)  # an older producer's: no figures
    digest = first.payload.adapter_digest
    evals = [
        evaluated(
            tenant,
            policy,
            1,
            digest,
            "arith",
            {"accuracy": 0.82, "format": 1.0},
            {"accuracy": {"min": 0.8}},
            minute=3,
        ),
        evaluated(
            tenant,
            policy,
            1,
            digest,
            "safety",
            {"refusals": 0.3},
            {"refusals": {"max": 0.1}},
            minute=4,
        ),
    ]
    return [first, second, *evals]


@pytest.fixture
def mint_cli(catalog_keyspace, monkeypatch):
    """`mint …` in process, on this module's keyspace."""
    monkeypatch.setenv("MINT_KEYSPACE", catalog_keyspace[1])
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    yield run
    get_settings.cache_clear()


def test_figures_and_results_are_projected_and_read_back(repo, tenant, mint_cli):
    log = history(tenant)
    assert [apply_event(repo, e) for e in log] == [Outcome.APPLIED] * 4
    first, second = repo.get_revision(tenant, "math", 1), repo.get_revision(tenant, "math", 2)
    assert (
        first.training
        == FIGURES.figures()
        == {
            "steps": 20.0,
            "tokens": 5120.0,
            "loss": 0.4125,
            "reward": 0.71,
            "learning_rate": 1e-4,
        }
    )
    assert second.training == {}
    arith, safety = repo.evaluations(tenant, "math", 1)
    assert (arith.suite, arith.passed, arith.metrics) == ("arith", True, log[2].payload.metrics)
    assert arith.thresholds == {"accuracy": {"min": 0.8}}
    assert arith.evaluated_at == T0 + timedelta(minutes=3)  # the event's time, not the clock
    assert arith.event_id == log[2].event_id and arith.evaluated_by == "evaluator/test"
    assert (safety.passed, safety.failures, safety.refused) == (False, ["refusals"], None)
    assert repo.evaluations(tenant, "math", 2) == []
    assert list(repo.evaluations_by_revision(tenant, "math")) == [1]

    rows = [
        json.loads(line)
        for line in mint_cli("catalog", "revisions", f"{tenant}/math", "-o", "json").splitlines()
    ]
    assert [r["revision"] for r in rows] == [2, 1]
    assert rows[1]["training"]["loss"] == 0.4125 and rows[0]["training"] == {}
    assert rows[1]["evaluations"]["arith"]["metrics"] == {"accuracy": 0.82, "format": 1.0}
    assert rows[1]["evaluations"]["safety"]["passed"] is False and rows[0]["evaluations"] == {}
    table = mint_cli("catalog", "revisions", f"{tenant}/math")
    assert "0.4125" in table and "0.71" in table
    assert "arith ✓ 0.82" in table and "safety ✗ 0.3" in table

    shown = mint_cli("revision", "show", f"{tenant}/math@1")
    for text in ("training loss", "0.4125", "training learning_rate", "0.0001", "arith: passed"):
        assert text in shown, shown
    assert "safety: failed: refusals" in shown and "<= 0.1" in shown
    whole = json.loads(mint_cli("revision", "show", f"{tenant}/math@1", "-o", "json"))
    assert whole["training"]["steps"] == 20 and set(whole["evaluations"]) == {"arith", "safety"}
    assert whole["metadata"]["rank"] == 8


def test_a_replay_writes_nothing_new_and_the_latest_result_wins(repo, tenant, catalog_keyspace):
    session, keyspace = catalog_keyspace
    log = history(tenant)
    apply_events(repo, log)
    before = dump(session, keyspace, tenant=tenant)
    assert [apply_event(repo, e) for e in log] == [Outcome.DUPLICATE] * 4
    assert apply_events(repo, log + log[2:]) == [Outcome.DUPLICATE] * 6
    assert dump(session, keyspace, tenant=tenant) == before

    # Two results of one suite: the later one (by its time) stays, whatever order they come in.
    digest = log[0].payload.adapter_digest
    later = evaluated(tenant, "math", 1, digest, "arith", {"accuracy": 0.9}, {}, minute=9)
    earlier = evaluated(tenant, "math", 1, digest, "arith", {"accuracy": 0.1}, {}, minute=5)
    assert apply_event(repo, later) is Outcome.APPLIED
    assert apply_event(repo, earlier) is Outcome.APPLIED
    (arith,) = [e for e in repo.evaluations(tenant, "math", 1) if e.suite == "arith"]
    assert arith.metrics == {"accuracy": 0.9} and arith.event_id == later.event_id


def test_a_result_of_another_digest_or_an_unknown_revision_is_refused(repo, tenant):
    log = history(tenant)
    apply_events(repo, log[:2])
    wrong = evaluated(tenant, "math", 1, "sha256:" + "0" * 64, "arith", {"a": 1.0}, {}, minute=3)
    with pytest.raises(Conflict, match="names digest sha256:0000.*another adapter"):
        apply_event(repo, wrong)
    missing = evaluated(tenant, "math", 7, log[0].payload.adapter_digest, "arith", {}, {}, 3)
    with pytest.raises(RevisionNotFound, match="revision 7"):
        apply_event(repo, missing)
    with pytest.raises(Conflict):
        apply_events(repo, [log[2], wrong])  # a run with a refused result raises
    assert not repo.is_applied(wrong.event_id) and not repo.is_applied(missing.event_id)
    assert [e.suite for e in repo.evaluations(tenant, "math", 1)] == ["arith"]  # log[2]'s


def test_a_rebuild_from_the_log_has_the_same_figures(repo, tenant, catalog_keyspace, base_settings):
    session, keyspace = catalog_keyspace
    log = history(tenant)
    for env in log:
        apply_event(repo, env)
    target = f"rb_{uuid.uuid4().hex[:12]}"
    try:
        # Log order as a replay reads it: exports first, then the results topic.
        report = rebuild(session, target, base_settings.keyspace_replication, log)
        assert report.failures == [] and report.outcomes["applied"] == 4
        diff = compare(session, keyspace, target, tenant=tenant)
        assert diff.identical, diff.summary()
        assert diff.tables["revision_evaluations"][0] == 2
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {target}", timeout=60)
