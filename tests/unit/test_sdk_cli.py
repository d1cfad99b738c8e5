"""The lifecycle CLI without services: gate parsing, references, help that teaches."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from mint.cli import main
from mint.commands.args import tenant_policy
from mint.commands.lifecycle import parse_gate


def test_gate_parsing() -> None:
    assert parse_gate(("reward>=0.6", "loss <= 2", "reward<=1")) == {
        "reward": {"min": 0.6, "max": 1.0},
        "loss": {"max": 2.0},
    }


@pytest.mark.parametrize("bad", ["reward>0.6", "reward", ">=1", "reward>=x"])
def test_bad_gates_say_what_is_expected(bad: str) -> None:
    with pytest.raises(click.BadParameter, match="is not METRIC>=VALUE or METRIC<=VALUE"):
        parse_gate((bad,))


@pytest.mark.parametrize(
    ("ref", "want"),
    [
        ("acme/math", ("acme", "math")),
        ("acme/math@prod", ("acme", "math")),
        ("acme/math@7", ("acme", "math")),
    ],
)
def test_references(ref, want) -> None:
    assert tenant_policy(ref) == want


@pytest.mark.parametrize("bad", ["math", "/math", "acme/", "acme/../x", "ac me/math"])
def test_bad_references(bad: str) -> None:
    with pytest.raises(click.BadParameter, match="must be tenant/policy"):
        tenant_policy(bad)


def test_commands_are_registered_and_help_teaches() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"]).output
    for name in ("policies", "revisions", "promote", "rollback", "history", "infer", "demo"):
        assert f"  {name} " in top, top
    demo = runner.invoke(main, ["demo", "--help"]).output
    assert "rolls back" in demo and "--rounds" in demo
    workers = runner.invoke(main, ["worker", "--help"]).output
    assert "controller" in workers and "evaluator" in workers
    ctl = runner.invoke(main, ["worker", "controller", "--help"]).output
    assert "eval.completed    -> serving.promote" in ctl
    assert "--with-serving" in runner.invoke(main, ["worker", "evaluator", "--help"]).output
