"""The controller's decisions (no faust, no broker): gate, promotion, automatic rollback, dedup."""

from __future__ import annotations

import pytest

from schemas import make_event
from schemas.events import (
    AliasMoved,
    EvalCompleted,
    EvalRequested,
    ExportCompleted,
    PolicyConfigured,
    PromoteCommand,
    RollbackCommand,
    Threshold,
    threshold_failures,
)
from workers.controller import Controller, derived_id

D = {n: "sha256:" + f"{n:x}" * 64 for n in range(1, 6)}
FP = "sha256:" + "cd" * 32


def ev(payload, caused_by=None, policy="math"):
    return make_event(payload, tenant="acme", policy=policy, producer="test", caused_by=caused_by)


def export(rev: int):
    return ev(
        ExportCompleted(
            revision=rev,
            adapter_digest=D[rev],
            store_uri=f"file:///s/acme/math/{rev}",
            size_bytes=1,
            rank=8,
            base_model="tiny",
            base_model_fingerprint=FP,
        )
    )


def completed(req, metrics: dict[str, float]):
    p = req.payload
    failures = threshold_failures(metrics, p.thresholds)
    return ev(
        EvalCompleted(
            revision=p.revision,
            adapter_digest=p.adapter_digest,
            suite=p.suite,
            metrics=metrics,
            thresholds=p.thresholds,
            passed=not failures,
            failures=failures,
        ),
        caused_by=req,
    )


def moved(cmd, frm: int | None):
    p = cmd.payload
    to = p.revision if isinstance(p, PromoteCommand) else p.to_revision
    return ev(
        AliasMoved(
            alias=p.alias,
            from_revision=frm,
            to_revision=to,
            adapter_digest=D[to],
            store_uri=f"file:///s/acme/math/{to}",
            cause="promote" if isinstance(p, PromoteCommand) else "rollback",
        ),
        caused_by=cmd,
    )


@pytest.fixture
def ctl() -> Controller:
    c = Controller({}, {})
    c.handle(
        ev(
            PolicyConfigured(
                base_model="tiny",
                suite="toy",
                thresholds={"reward": Threshold(min=0.6)},
                rollback_metric="reward",
                rollback_tolerance=0.05,
            )
        )
    )
    return c


def test_export_requests_an_evaluation_with_the_policys_gate(ctl) -> None:
    exp = export(1)
    (req,) = ctl.handle(exp)
    assert isinstance(req.payload, EvalRequested)
    assert (req.payload.revision, req.payload.suite, req.payload.promote_to) == (1, "toy", "prod")
    assert req.payload.thresholds == {"reward": Threshold(min=0.6)}
    assert req.causation_id == exp.event_id and req.correlation_id == exp.correlation_id
    assert req.event_id == derived_id(exp, "eval")  # a redelivery re-emits the same id


def test_unconfigured_policy_is_not_evaluated() -> None:
    assert Controller({}, {}).handle(export(1)) == []


@pytest.mark.parametrize(
    ("metrics", "promotes"),
    [({"reward": 0.7}, True), ({"reward": 0.5}, False), ({"other": 0.9}, False)],
)
def test_the_gate_promotes_only_a_passing_revision(ctl, metrics, promotes) -> None:
    (req,) = ctl.handle(export(1))
    ctl.handle(req)
    out = ctl.handle(completed(req, metrics))
    if promotes:
        (cmd,) = out
        assert isinstance(cmd.payload, PromoteCommand)
        assert (cmd.payload.alias, cmd.payload.revision, cmd.payload.expected_revision) == (
            "prod",
            1,
            None,
        )
        assert "gate passed" in cmd.payload.reason
    else:
        assert out == []


def _promote(ctl, rev: int, reward: float, frm: int | None):
    (req,) = ctl.handle(export(rev))
    ctl.handle(req)
    (cmd,) = ctl.handle(completed(req, {"reward": reward}))
    mv = moved(cmd, frm)
    assert ctl.handle(cmd, mv) == [mv]  # the executed command's alias.moved is published
    ctl.handle(mv)
    return cmd


def test_regression_of_the_serving_revision_rolls_back(ctl) -> None:
    _promote(ctl, 1, 0.7, None)
    cmd2 = _promote(ctl, 2, 0.8, 1)
    assert cmd2.payload.expected_revision == 1
    # Within tolerance: nothing. Below baseline - tolerance: rollback, CAS on revision 2.
    again = ev(EvalRequested(revision=2, adapter_digest=D[2], suite="toy"))
    ctl.handle(again)
    assert ctl.handle(completed(again, {"reward": 0.76})) == []
    later = ev(EvalRequested(revision=2, adapter_digest=D[2], suite="toy"))
    ctl.handle(later)
    (rb,) = ctl.handle(completed(later, {"reward": 0.6}))
    assert isinstance(rb.payload, RollbackCommand)
    assert (rb.payload.alias, rb.payload.expected_revision) == ("prod", 2)
    assert "fell to 0.6" in rb.payload.reason
    # An evaluation of a revision nobody serves never rolls anything back.
    other = ev(EvalRequested(revision=1, adapter_digest=D[1], suite="toy"))
    ctl.handle(other)
    assert ctl.handle(completed(other, {"reward": 0.0})) == []


def test_a_redelivered_event_changes_nothing_and_re_emits_the_same_events(ctl) -> None:
    # Redelivered when the crash came between saving the state and publishing: its outputs
    # come again from the outbox, with the same ids (consumers dedupe), and nothing new.
    exp = export(1)
    (first,) = ctl.handle(exp)
    state = dict(ctl.lifecycle["acme/math"])
    (again,) = ctl.handle(exp)
    assert again == first
    assert ctl.lifecycle["acme/math"] == state
    assert ctl.handle(first) == [] and ctl.handle(first) == []  # one that led to nothing


def test_a_refused_command_becomes_a_serving_refused_event(ctl) -> None:
    from schemas.events import ServingRefused
    from workers.controller.logic import Refusal

    cmd = ev(PromoteCommand(alias="prod", revision=3, expected_revision=1))
    (out,) = ctl.handle(cmd, refusal=Refusal("alias acme/math@prod is at revision 2", 2))
    assert isinstance(out.payload, ServingRefused) and out.causation_id == cmd.event_id
    assert (out.payload.command_id, out.payload.current_revision) == (cmd.event_id, 2)
    assert out.payload.command_type == "serving.promote" and "revision 2" in out.payload.reason


def test_state_is_json_and_kept_per_policy(ctl) -> None:
    import json

    _promote(ctl, 1, 0.9, None)
    ctl.handle(export(1).model_copy(update={"policy": "code"}))
    st = json.loads(json.dumps(ctl.lifecycle["acme/math"]))
    assert st["aliases"] == {"prod": 1} and st["baseline"]["1"] == {"reward": 0.9}
    assert [t[0] for t in st["transitions"]] == ["configured", "exported", "evaluated", "promote"]
    assert set(ctl.lifecycle) == {"acme/math", "acme/code"}


def test_an_export_read_before_the_configuration_is_still_evaluated() -> None:
    c = Controller({}, {})
    assert c.handle(export(1)) == [] and c.handle(export(2)) == []
    (req,) = c.handle(ev(PolicyConfigured(base_model="tiny", suite="toy")))
    assert isinstance(req.payload, EvalRequested) and req.payload.revision == 2
    # Its own request comes back through eval.requests: nothing is requested twice.
    c.handle(req)
    assert c.handle(ev(PolicyConfigured(base_model="tiny", suite="toy"))) == []


def test_an_evaluation_read_before_the_echo_of_the_move_still_rolls_back(ctl) -> None:
    # Topics are not ordered among each other: after a restart the new evaluation can be read
    # before the alias.moved echo of the controller's own promotion.
    (req,) = ctl.handle(export(1))
    ctl.handle(req)
    (cmd,) = ctl.handle(completed(req, {"reward": 0.9}))
    mv = moved(cmd, None)
    assert ctl.handle(cmd, mv) == [mv]
    again = ev(EvalRequested(revision=1, adapter_digest=D[1], suite="toy"))
    ctl.handle(again)
    (rb,) = ctl.handle(completed(again, {"reward": 0.5}))
    assert isinstance(rb.payload, RollbackCommand) and "from 0.9" in rb.payload.reason
    # The late echo is a duplicate: the baseline stays the one at promotion.
    ctl.handle(mv)
    assert ctl.lifecycle["acme/math"]["baseline"]["1"] == {"reward": 0.9}


def test_a_forged_request_with_an_empty_gate_promotes_nothing(ctl) -> None:
    ctl.handle(export(1))  # requested by the controller with the configured gate (reward ≥ 0.6)
    forged = ev(
        EvalRequested(
            revision=1, adapter_digest=D[1], suite="toy", thresholds={}, promote_to="prod"
        )
    )
    ctl.handle(forged)
    done = completed(forged, {"reward": 0.1})
    assert done.payload.passed  # the evaluator's verdict on the request's (empty) thresholds
    assert ctl.handle(done) == []  # the configured gate decides: 0.1 < 0.6
    other = ev(EvalRequested(revision=1, adapter_digest=D[1], suite="toy", promote_to="canary"))
    ctl.handle(other)
    assert ctl.handle(completed(other, {"reward": 0.9})) == []  # prod is configured, not canary
    assert ctl.lifecycle["acme/math"]["candidates"] == {}


def test_a_result_read_before_its_requests_echo_still_promotes(ctl) -> None:
    (req,) = ctl.handle(export(1))
    (cmd,) = ctl.handle(completed(req, {"reward": 0.7}))  # eval.requests echo not read yet
    assert isinstance(cmd.payload, PromoteCommand) and cmd.payload.revision == 1
    ctl.handle(req)  # the late echo does not make the revision a candidate twice
    assert ctl.lifecycle["acme/math"]["candidates"] == {}
