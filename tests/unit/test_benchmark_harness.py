"""benchmarks/_harness.py: what every benchmark script shares (options, figures, the JSON line)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks import _harness as h


def options() -> h.Options:
    ap = h.parser("A benchmark.\n\nMore.", "tiny")
    ap.size("--prompts", 8, 64, "requests")
    ap.size("--kill-every", 3.0, 20.0, "seconds")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def test_a_size_left_unset_is_its_smoke_or_full_value_and_a_given_one_wins() -> None:
    ap = options()
    assert ap.description == "A benchmark."
    full, smoke = ap.parse_args([]), ap.parse_args(["--smoke"])
    assert (full.smoke, full.prompts, full.kill_every) == (False, 64, 20.0)
    assert (smoke.smoke, smoke.prompts, smoke.kill_every) == (True, 8, 3.0)
    given = ap.parse_args(["--smoke", "--prompts", "5", "--kill-every", "0"])
    assert (given.prompts, given.kill_every) == (5, 0.0)  # 0 is a value, not "unset"
    assert "(default 64; smoke 8)" in ap.format_help()


def test_pct_is_the_nearest_rank_and_none_without_values() -> None:
    assert h.pct([], 0.5) is None
    assert h.pct([3.0, 1.0, 2.0], 0.5) == 2.0
    assert h.pct(list(range(101)), 0.99) == 99


def test_emit_prints_one_line_and_exits_1_on_a_missed_target(capsys) -> None:
    line = {"benchmark": "b", **h.targets_and_met(a=(2.0, ">=", 1.0), b=(5, "<=", 4))}
    assert line["targets"] == {"a": 1.0, "b": 4} and line["met"] == {"a": True, "b": False}
    assert h.emit(line) == 1
    assert h.emit({"benchmark": "b", "met": {"a": True}}) == 0
    assert h.emit({"benchmark": "b"}) == 0  # no targets: nothing missed
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["benchmark"] for x in lines] == ["b", "b", "b"]


def test_finish_names_the_command_and_the_missed_targets(capsys) -> None:
    said: list[str] = []
    line = {"benchmark": "b", "met": {"a": True, "b": False}, "path": Path("/x")}
    assert h.finish(line, "canary", ["--smoke"], said.append) == ["b"]
    out = json.loads(capsys.readouterr().out)
    assert out["command"] == "python benchmarks/canary.py --smoke" and out["path"] == "/x"
    assert said == ["[red]missed: b"]


@dataclass
class Plan:
    engines: int = 3
    interval_s: float = 8.0
    seed: int = 0


def test_overrides_puts_only_the_given_options_on_the_plan() -> None:
    plan = Plan(engines=2)  # a preset (--smoke) the options may override
    args = options().parse_args(["--seed", "7"])
    args.engines, args.interval = None, 4.0
    h.overrides(plan, args, "engines", "seed", interval_s="interval")
    assert plan == Plan(engines=2, interval_s=4.0, seed=7)


def test_run_settings_are_the_runs_own(tmp_path: Path) -> None:
    a, b = h.run_settings("tk", tmp_path), h.run_settings("tk", tmp_path, base_model="m")
    assert a.topic_prefix.startswith("bench-tk-") and a.keyspace.startswith("bench_tk_")
    assert a.topic_prefix != b.topic_prefix and b.base_model == "m"
    assert a.store_uri == str(tmp_path / "store") and a.state_dir == tmp_path / "state"


def test_the_report_judges_lines_in_the_harness_shape() -> None:
    from benchmarks import report

    assert report.targets_and_met is h.targets_and_met  # report reads the harness's shape
