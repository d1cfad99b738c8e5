"""`mint worker serving|rollout`: registered, and a missing base model is a usage error."""

from __future__ import annotations

from click.testing import CliRunner

from mint.commands.workers import worker


def test_serving_and_rollout_commands_are_registered() -> None:
    runner = CliRunner()
    for name in ("serving", "rollout"):
        res = runner.invoke(worker, [name, "--help"])
        assert res.exit_code == 0 and "--max-cpu-loras" in res.output


def test_missing_model_is_a_usage_error(monkeypatch) -> None:
    monkeypatch.setenv("MINT_BASE_MODEL", "")
    from schemas.settings import get_settings

    get_settings.cache_clear()
    res = CliRunner().invoke(worker, ["serving"])
    assert res.exit_code == 2 and "--model DIR" in res.output
