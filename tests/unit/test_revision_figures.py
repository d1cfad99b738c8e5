"""Revisions carry their figures, without services: the training figures' validation, the
export event with and without them, and how `mint revisions`, `mint catalog revisions` and
`mint revision show` render figures and evaluations (a fake repository and client)."""

from __future__ import annotations

import json
import math
import uuid
from collections import namedtuple
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from rich.console import Console

from catalog.exceptions import InvalidReference
from catalog.models import Alias, Evaluation, Resolved, Revision, from_row
from catalog.registration import _figures
from mint.cli import main
from mint.commands import lifecycle
from mint.commands import revisions as shown
from schemas import decode_event, encode_event, make_event
from schemas.events import ExportCompleted, TrainingFigures
from workers.trainer.exporting import RevisionExporter

AT = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32
EXPORT = {
    "revision": 1,
    "adapter_digest": DIGEST,
    "store_uri": "file:///store/acme/math/1",
    "size_bytes": 10,
    "rank": 8,
    "base_model": "tiny",
    "base_model_fingerprint": DIGEST,
}

# ---------------------------------------------------------------------- the model


def test_figures_are_all_optional_and_only_set_ones_are_stored() -> None:
    assert TrainingFigures().figures() == {}
    f = TrainingFigures(steps=3, loss=0.5)
    assert f.figures() == {"steps": 3.0, "loss": 0.5}
    assert TrainingFigures.known(steps=None, loss=None) is None
    assert TrainingFigures.known(steps=2, reward=None) == TrainingFigures(steps=2)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"loss": math.nan}, "loss"),
        ({"reward": math.inf}, "reward"),
        ({"steps": -1}, "steps"),
        ({"tokens": -5}, "tokens"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": math.inf}, "learning_rate"),
        ({"accuracy": 0.9}, "accuracy"),  # not a training figure
    ],
)
def test_bad_figures_are_refused_naming_the_field(given, field) -> None:
    with pytest.raises(ValidationError, match=field):
        TrainingFigures(**given)


def test_an_export_without_figures_stays_valid_and_one_with_them_round_trips() -> None:
    old = make_event(ExportCompleted(**EXPORT), tenant="acme", policy="math", producer="t")
    wire = json.loads(encode_event(old))
    assert wire["payload"].get("training") is None
    wire["payload"].pop("training", None)  # an older producer's event has no such key
    assert decode_event(json.dumps(wire)).payload.training is None
    figures = TrainingFigures(steps=20, tokens=4096, loss=0.25, reward=0.7, learning_rate=1e-4)
    new = make_event(
        ExportCompleted(**EXPORT, training=figures), tenant="acme", policy="math", producer="t"
    )
    assert decode_event(encode_event(new)).payload.training == figures
    with pytest.raises(ValidationError, match="loss"):
        ExportCompleted(**EXPORT, training={"loss": "nan"})


def test_the_trainer_announces_the_figures_the_catalog_registered() -> None:
    request = make_event(ExportCompleted(**EXPORT), tenant="acme", policy="math", producer="t")
    exporter = RevisionExporter()
    exporter.name = "trainer/test"
    r = {
        "revision": 1,
        "digest": DIGEST,
        "store_uri": EXPORT["store_uri"],
        "size_bytes": 10,
        "rank": 8,
        "lora_alpha": None,
        "target_modules": [],
        "target_parameters": [],
        "base_model": "tiny",
        "base_model_fingerprint": DIGEST,
        "parent_revision": None,
        "training": {"steps": 8.0, "loss": 0.5, "learning_rate": 1e-4},  # as the catalog has it
    }
    event = exporter.export_event(request, r)
    assert event.payload.training == TrainingFigures(steps=8, loss=0.5, learning_rate=1e-4)
    assert exporter.export_event(request, {**r, "training": {}}).payload.training is None


def test_a_direct_registration_refuses_a_figure_that_is_not_finite() -> None:
    assert _figures({"steps": 3, "loss": 0.5}) == {"steps": 3.0, "loss": 0.5}
    with pytest.raises(InvalidReference, match="training figure 'loss'"):
        _figures({"loss": math.nan})
    with pytest.raises(InvalidReference, match="not a finite number"):
        _figures({"reward": "high"})


def test_null_collections_read_as_empty() -> None:
    cols = [
        "tenant policy revision suite digest metrics thresholds passed failures refused "
        "evaluated_at evaluated_by event_id"
    ][0].split()
    row = namedtuple("Row", cols)(
        "a", "p", 1, "s", DIGEST, None, None, None, None, "no", None, None, None
    )
    e = from_row(Evaluation, row)
    assert (e.metrics, e.thresholds, e.failures, e.passed, e.evaluated_by) == (
        {},
        {},
        [],
        False,
        "",
    )


# ---------------------------------------------------------------------- the CLI


def _revision(n: int, training: dict) -> Revision:
    return Revision(
        "acme",
        "math",
        n,
        DIGEST,
        f"file:///store/acme/math/{n}",
        "tiny",
        n - 1 or None,
        AT,
        "trainer/test",
        None,
        {"rank": 8},
        training,
    )


def _evaluation(n: int, suite: str, metrics: dict, thresholds: dict, failures=(), refused=None):
    return Evaluation(
        "acme",
        "math",
        n,
        suite,
        DIGEST,
        metrics,
        thresholds,
        not failures and refused is None,
        list(failures),
        refused,
        AT,
        "evaluator/test",
        uuid.uuid4(),
    )


REVISIONS = [
    _revision(2, {}),
    _revision(1, {"steps": 20.0, "loss": 0.4125, "reward": 0.71, "learning_rate": 1e-4}),
]
EVALUATIONS = {
    1: [
        _evaluation(1, "arith", {"format": 1.0, "accuracy": 0.82}, {"accuracy": {"min": 0.8}}),
        _evaluation(1, "safety", {"refusals": 0.3}, {"refusals": {"max": 0.1}}, ["refusals"]),
    ],
    2: [_evaluation(2, "arith", {}, {}, refused="suite arith is not configured")],
}
ALIASES = [Alias("acme", "math", "prod", 1, DIGEST, "file:///x", 1, AT, "cli", None)]


class FakeRepo:
    def iter_revisions(self, tenant, policy):
        assert (tenant, policy) == ("acme", "math")
        return iter(REVISIONS)

    def list_revisions(self, tenant, policy, page_size):
        return REVISIONS[:page_size], None

    def get_revision(self, tenant, policy, n):
        return next(r for r in REVISIONS if r.revision == n)

    def list_aliases(self, tenant, policy):
        return ALIASES

    def resolve(self, ref):
        n = 1 if ref.alias == "prod" else ref.revision
        return Resolved("acme", "math", n, DIGEST, "file:///x", ref.alias)

    def evaluations(self, tenant, policy, revision=None):
        return EVALUATIONS.get(revision, [])

    def evaluations_by_revision(self, tenant, policy):
        return EVALUATIONS


class FakeClient(FakeRepo):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def revisions(self, policy):
        return REVISIONS

    def aliases(self, policy):
        return ALIASES

    def evaluations_by_revision(self, policy):
        return EVALUATIONS


@pytest.fixture
def mint(monkeypatch):
    @contextmanager
    def fake_repo():
        yield FakeRepo()

    monkeypatch.setattr(shown, "catalog_repo", fake_repo)
    monkeypatch.setattr(shown, "out", Console(width=200))
    monkeypatch.setattr(lifecycle, "cli_client", lambda tenant, *a, **k: FakeClient())

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    return run


@pytest.mark.parametrize("command", [("revisions",), ("catalog", "revisions")])
def test_the_listings_show_loss_reward_and_each_suites_verdict(mint, command) -> None:
    table = mint(*command, "acme/math")
    assert all(h in table for h in ("loss", "reward", "eval"))
    line_1 = next(line for line in table.splitlines() if "0.4125" in line)
    assert "0.71" in line_1 and "arith ✓ 0.82" in line_1 and "safety ✗ 0.3" in line_1
    assert "prod" in line_1
    line_2 = next(line for line in table.splitlines() if "arith refused" in line)
    assert "0.4125" not in line_2 and "0.71" not in line_2  # blank when unknown


@pytest.mark.parametrize("command", [("revisions",), ("catalog", "revisions")])
def test_json_rows_carry_training_and_evaluations(mint, command) -> None:
    rows = [json.loads(line) for line in mint(*command, "acme/math", "-o", "json").splitlines()]
    assert [r["revision"] for r in rows] == [2, 1]
    assert rows[0]["training"] == {} and rows[1]["training"]["reward"] == 0.71
    arith = rows[1]["evaluations"]["arith"]
    assert arith["passed"] is True and arith["metrics"]["accuracy"] == 0.82
    assert arith["thresholds"] == {"accuracy": {"min": 0.8}}
    assert rows[1]["evaluations"]["safety"]["failures"] == ["refusals"]
    assert rows[0]["evaluations"]["arith"]["refused"] == "suite arith is not configured"
    assert rows[1]["aliases"] == ["prod"] and rows[1]["evaluations"]["arith"]["evaluated_at"]


@pytest.mark.parametrize("ref", ["acme/math@1", "acme/math@prod"])
def test_revision_show_prints_every_field_and_each_metric_against_its_threshold(mint, ref) -> None:
    text = mint("revision", "show", ref)
    for want in (
        "acme/math@1",
        DIGEST,
        "file:///store/acme/math/1",
        "prod",
        "2026-12-06 17:00:00",
        "trainer/test",
        "training steps",
        "training loss",
        "0.4125",
        "training learning_rate",
        "0.0001",
        "arith: passed",
        ">= 0.8",
        "safety: failed: refusals",
        "<= 0.1",
    ):
        assert want in text, (want, text)
    assert "✗" in text and "✓" in text


def test_revision_show_json_and_a_revision_without_figures(mint) -> None:
    whole = json.loads(mint("revision", "show", "acme/math@1", "-o", "json"))
    assert whole["tenant"] == "acme" and whole["metadata"] == {"rank": 8}
    assert whole["training"]["steps"] == 20.0 and set(whole["evaluations"]) == {"arith", "safety"}
    text = mint("revision", "show", "acme/math")  # no @: the latest
    assert "acme/math@2" in text and "refused" in text and "suite arith is not configured" in text


def test_a_bad_reference_is_a_clear_error(mint) -> None:
    result = CliRunner().invoke(main, ["revision", "show", "acme/math@Bad Alias"])
    assert result.exit_code != 0 and "alias" in result.output.lower()


def test_numbers_and_headlines() -> None:
    assert shown.number(None) == "" and shown.number(20.0) == "20"
    assert shown.number(0.123456) == "0.1235"
    gated = {"metrics": {"a": 1.0, "z": 0.5}, "thresholds": {"z": {"min": 0.1}}}
    assert shown.headline(gated) == ("z", 0.5)  # what the gate judged comes first
    assert shown.headline({"metrics": {"b": 2.0, "a": 1.0}, "thresholds": {}}) == ("a", 1.0)
    assert shown.headline({"metrics": {}, "thresholds": {"a": {"min": 1}}}) is None
