"""What no event from outside may make the controller do (issue 25): decide on another suite's
numbers, take an alias back with a replayed move, or keep a stale view after a refusal."""

from __future__ import annotations

import pytest

from schemas import make_event
from schemas.events import (
    AliasMoved,
    EvalCompleted,
    EvalRequested,
    PolicyConfigured,
    PromoteCommand,
    RollbackCommand,
    Threshold,
)
from tests.unit.test_controller import D, completed, ev, export
from tests.unit.test_controller_evaluator import DIGEST, FakeEngine, FakeResolver, FakeSet
from workers.controller import Controller
from workers.controller.logic import RECENT, Refusal
from workers.evaluator import EvaluatorCore, result_id

CONFIG = PolicyConfigured(
    base_model="tiny",
    suite="toy",
    thresholds={"reward": Threshold(min=0.6)},
    rollback_metric="reward",
    rollback_tolerance=0.05,
)


@pytest.fixture
def ctl() -> Controller:
    c = Controller({}, {})
    c.handle(ev(CONFIG))
    return c


def state(ctl: Controller) -> dict:
    return ctl.lifecycle["acme/math"]


def evaluate(ctl: Controller, rev: int, reward: float, suite: str = "toy"):
    req = ev(EvalRequested(revision=rev, adapter_digest=D[rev], suite=suite))
    ctl.handle(req)
    return ctl.handle(completed(req, {"reward": reward}))


def move(cmd, frm: int | None, seq: int | None):
    """The alias.moved the catalog returns for ``cmd`` (its seq is the alias's move counter)."""
    p = cmd.payload
    to = p.revision if isinstance(p, PromoteCommand) else p.to_revision
    return make_event(
        AliasMoved(
            alias=p.alias,
            from_revision=frm,
            to_revision=to,
            adapter_digest=D[to],
            store_uri=f"file:///s/acme/math/{to}",
            cause="promote" if isinstance(p, PromoteCommand) else "rollback",
            seq=seq,
        ),
        tenant="acme",
        policy="math",
        producer="controller",
        caused_by=cmd,
    )


def promote(ctl: Controller, rev: int, reward: float, frm: int | None, seq: int | None):
    (req,) = ctl.handle(export(rev))
    ctl.handle(req)
    (cmd,) = ctl.handle(completed(req, {"reward": reward}))
    assert isinstance(cmd.payload, PromoteCommand) and cmd.payload.expected_revision == frm
    mv = move(cmd, frm, seq)
    ctl.handle(cmd, mv)
    return mv


def forget(ctl: Controller) -> None:
    """Push every earlier event id out of the redelivery window (RECENT ids per policy)."""
    for _ in range(RECENT):
        ctl.handle(ev(EvalRequested(revision=1, adapter_digest=D[1], suite="toy")))


# ---------------------------------------------------------------------- defect 4: one suite


def test_another_suites_result_never_rolls_back_nor_becomes_the_baseline(ctl) -> None:
    promote(ctl, 1, 0.9, None, seq=1)
    # Anyone who may write eval.requests asks for a suite the policy does not use: its low
    # reward is not a regression of the configured suite's 0.9.
    assert evaluate(ctl, 1, 0.1, suite="other") == []
    assert state(ctl)["evals"]["1"] == {"reward": 0.9} == state(ctl)["baseline"]["1"]
    assert state(ctl)["aliases"] == {"prod": 1}
    # The configured suite still decides: a real regression rolls back.
    (rb,) = evaluate(ctl, 1, 0.5)
    assert isinstance(rb.payload, RollbackCommand) and "from 0.9" in rb.payload.reason


def test_another_suites_pass_neither_promotes_nor_spends_the_candidate(ctl) -> None:
    (req,) = ctl.handle(export(1))  # a candidate for prod, evaluated on "toy"
    other = ev(EvalRequested(revision=1, adapter_digest=D[1], suite="other"))
    ctl.handle(other)
    assert ctl.handle(completed(other, {"reward": 1.0})) == []
    assert state(ctl)["evals"] == {}
    (cmd,) = ctl.handle(completed(req, {"reward": 0.7}))  # the configured suite's result
    assert isinstance(cmd.payload, PromoteCommand) and cmd.payload.revision == 1


def test_a_new_suite_never_compares_with_the_old_suites_baseline(ctl) -> None:
    promote(ctl, 1, 0.9, None, seq=1)
    (again,) = ctl.handle(ev(CONFIG.model_copy(update={"suite": "toy-v2"})))
    assert (again.payload.revision, again.payload.suite) == (1, "toy-v2")  # measured anew
    assert evaluate(ctl, 1, 0.3, suite="toy-v2") == []  # 0.3 on v2 is no fall from 0.9 on toy


def test_a_refused_evaluation_decides_nothing(ctl) -> None:
    (req,) = ctl.handle(export(1))
    refused = ev(
        EvalCompleted(
            revision=1,
            adapter_digest=D[1],
            suite="toy",
            metrics={},
            passed=False,
            refused="not configured",
        ),
        caused_by=req,
    )
    assert ctl.handle(refused) == [] and state(ctl)["candidates"] == {"1": "prod"}


def test_the_evaluator_refuses_a_suite_not_configured_for_the_policy() -> None:
    engine = FakeEngine([2, 4])
    configs = {"acme/math": {"suite": "toy-even"}}
    core = EvaluatorCore(engine, FakeSet(), FakeResolver(), engine_id="e0", configs=configs)

    def request(suite: str, policy: str = "math"):
        return make_event(
            EvalRequested(
                revision=1,
                adapter_digest=DIGEST,
                suite=suite,
                thresholds={"reward": Threshold(min=0.5)},
            ),
            tenant="acme",
            policy=policy,
            producer="upstream",
        )

    wrong = request("toy-even-sampled")
    out = core.run(wrong)  # an answer the requester reads, not an exception or silence
    p = out.payload
    assert isinstance(p, EvalCompleted) and out.event_id == result_id(wrong)
    assert out.causation_id == wrong.event_id
    assert not p.passed and p.metrics == {} and p.suite == "toy-even-sampled"
    assert "'toy-even-sampled' is not the one configured for acme/math ('toy-even')" in p.refused
    unconfigured = core.run(request("toy-even", policy="code")).payload
    assert "acme/code has no lifecycle configuration" in unconfigured.refused
    assert engine.calls == []  # nothing loaded or generated for a refused request
    ok = core.run(request("toy-even")).payload
    assert ok.refused is None and ok.passed and len(engine.calls) == 1


def test_a_refused_result_carries_no_verdict() -> None:
    with pytest.raises(ValueError, match="a refused evaluation has no metrics"):
        EvalCompleted(
            revision=1,
            adapter_digest=D[1],
            suite="toy",
            metrics={"reward": 1.0},
            passed=True,
            refused="no",
        )


# ---------------------------------------------------------------------- defect 6: ordered moves


def test_a_replayed_old_move_never_takes_the_view_back(ctl) -> None:
    first = promote(ctl, 1, 0.7, None, seq=1)
    promote(ctl, 2, 0.8, 1, seq=2)
    forget(ctl)  # `mint replay serving.events --to-topic serving.events` after a while
    ctl.handle(first)
    assert state(ctl)["aliases"] == {"prod": 2}
    promote(ctl, 3, 0.9, 2, seq=3)  # the next promotion carries the right expected revision


def test_a_replayed_move_from_before_moves_had_a_seq_is_ordered_by_time(ctl) -> None:
    first = promote(ctl, 1, 0.7, None, seq=None)  # moves logged before AliasMoved.seq existed
    promote(ctl, 2, 0.8, 1, seq=None)
    forget(ctl)
    ctl.handle(first)
    assert state(ctl)["aliases"] == {"prod": 2}


def test_a_refusal_updates_the_view_so_the_next_promotion_succeeds(ctl) -> None:
    promote(ctl, 1, 0.7, None, seq=1)
    # prod moved to 2 where the controller did not see it: its view (1) is stale.
    (req,) = ctl.handle(export(3))
    ctl.handle(req)
    (cmd,) = ctl.handle(completed(req, {"reward": 0.9}))
    assert cmd.payload.expected_revision == 1
    (refused,) = ctl.handle(cmd, refusal=Refusal("alias acme/math@prod is at revision 2", 2))
    assert refused.payload.current_revision == 2
    assert state(ctl)["aliases"] == {"prod": 2}
    promote(ctl, 4, 0.95, 2, seq=3)  # not refused forever: CAS on the revision prod is at
