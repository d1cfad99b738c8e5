"""benchmarks/report.py on canned benchmark lines: one table row per figure with a target, met or
missed, from both shapes (``targets``/``met`` dicts and one scalar ``target``/``met``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report

EVENTS = {
    "benchmark": "events_throughput",
    "smoke": False,
    "pipeline_eps": 5300,
    "targets": {"pipeline_eps": 15000},
    "met": {"pipeline_eps": False},
}
MULTI = {
    "benchmark": "multi_policy_training",
    "smoke": True,
    "wall_time_ratio": 2.7,
    "peak_rss_ratio": 1.0,
    "targets": {"wall_time_ratio": 1.77, "peak_rss_ratio": 1.05},
    "met": {"wall_time_ratio": True, "peak_rss_ratio": True},
}
CATALOG = {
    "benchmark": "catalog_scale",
    "smoke": False,
    "rows_per_s": 30147,
    "resolve_alias": {"p50_ms": 0.5, "p99_ms": 2.38, "n": 10000},
    "targets": {"rows_per_s": 20000, "resolve_alias_p99_ms": 2.0},
    "meets_targets": {"rows_per_s": True, "resolve_alias_p99_ms": False},
}
CATALOG_NEW = {
    "benchmark": "catalog_scale",
    "smoke": False,
    "import_rows_per_s": 51000,
    "resolve_catalog": {"p99_ms": 1.2},
    "resolve_cached": {"p99_ms": 0.00412},
    "targets": {
        "import_rows_per_s": 45000,
        "resolve_catalog_p99_ms": 1.5,
        "resolve_cached_p99_ms": 0.1,
    },
    "met": {
        "import_rows_per_s": True,
        "resolve_catalog_p99_ms": True,
        "resolve_cached_p99_ms": True,
    },
}
FAULTS = {
    "benchmark": "fault_injection",
    "smoke": False,
    "lost": 0,
    "duplicate_revisions": 1,
    "catalog_equals_replay": True,
    "targets": {"lost": 0, "duplicate_revisions": 0, "catalog_equals_replay": True},
}
MOE = {
    "benchmark": "moe_packed_load",
    "smoke": True,
    "speedup_cold": 9.5,
    "speedup_warm": 8.1,
    "target": 9.0,
    "met": False,
}
RANKS = {
    "benchmark": "deepspeed_ranks",
    "smoke": True,
    "ranks": 2,
    "ratio_per_rank": [0.52, 0.49],
    "target_ratio": 0.5,
    "max_weight_diff": 3e-7,
    "weight_tolerance": 1e-5,
    "met": True,
}


def table(rows: list[report.Row]) -> dict[tuple[str, str], list[str]]:
    """(benchmark cell, figure) -> the other cells of the Markdown table."""
    out = {}
    for line in report.markdown(rows, "canned").splitlines():
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        if len(cells) == 6 and cells[0] not in ("benchmark", "---"):
            out[(cells[0], cells[1])] = cells[2:]
    return out


def test_dict_shape_rows_met_and_missed_with_direction() -> None:
    t = table(report.rows_of(EVENTS) + report.rows_of(MULTI) + report.rows_of(CATALOG))
    assert t[("events_throughput", "pipeline_eps")][:3] == [">= 15,000", "5,300", "**missed**"]
    assert t[("multi_policy_training (smoke)", "wall_time_ratio")][:3] == [">= 1.77", "2.7", "met"]
    assert t[("multi_policy_training (smoke)", "peak_rss_ratio")][:3] == ["<= 1.05", "1", "met"]
    # catalog_scale: a nested figure (resolve_alias.p99_ms) and ``meets_targets`` read as met
    assert t[("catalog_scale", "rows_per_s")][:3] == [">= 20,000", "30,147", "met"]
    assert t[("catalog_scale", "resolve_alias_p99_ms")][:3] == ["<= 2", "2.38", "**missed**"]
    # its newer shape: nested figures beside each other, ``met`` a dict
    t_new = table(report.rows_of(CATALOG_NEW))
    assert t_new[("catalog_scale", "resolve_catalog_p99_ms")][:3] == ["<= 1.5", "1.2", "met"]
    assert t_new[("catalog_scale", "resolve_cached_p99_ms")][:3] == ["<= 0.1", "0.00412", "met"]
    assert t[("events_throughput", "pipeline_eps")][3] == "`python -m benchmarks.events_throughput`"
    assert t[("multi_policy_training (smoke)", "wall_time_ratio")][3] == (
        "`python -m benchmarks.multi_policy_training --smoke`"
    )


def test_zero_and_boolean_targets_without_met_compare_equal() -> None:
    rows = {r.figure: r for r in report.rows_of(FAULTS)}
    assert rows["lost"].met is True and rows["catalog_equals_replay"].met is True
    assert rows["duplicate_revisions"].met is False
    t = table(list(rows.values()))
    assert t[("fault_injection", "lost")][:3] == ["= 0", "0", "met"]
    assert t[("fault_injection", "catalog_equals_replay")][:3] == ["true", "true", "met"]
    assert all(report.chart_ratio(r) is None for r in rows.values())  # nothing to divide by


def test_scalar_shape_rows_carry_the_lines_one_met() -> None:
    t = table(report.rows_of(MOE) + report.rows_of(RANKS))
    assert t[("moe_packed_load (smoke)", "speedup_cold")][:3] == ["9", "9.5", "**missed**\\*"]
    assert t[("moe_packed_load (smoke)", "speedup_warm")][:3] == ["9", "8.1", "**missed**\\*"]
    assert t[("deepspeed_ranks (smoke)", "ratio_per_rank")][:3] == ["0.5", "0.52, 0.49", "met\\*"]
    assert t[("deepspeed_ranks (smoke)", "max_weight_diff")][:3] == [
        "1.00e-05",
        "3.00e-07",
        "met\\*",
    ]
    text = report.markdown(report.rows_of(MOE), "canned")
    assert "one target and one `met` for all its figures" in text
    assert "not the full-run figures" in text  # smoke rows are labelled as such


def test_unknown_scalar_and_no_target_lines() -> None:
    (row,) = report.rows_of({"benchmark": "new_one", "target": 2, "met": True})
    assert (row.figure, row.target, row.met) == ("line", 2, True)
    (row,) = report.rows_of({"benchmark": "plain", "x": 1})
    assert row.figure == "(no target)" and row.met is None


@pytest.mark.parametrize(
    ("row", "ratio"),
    [
        (report.rows_of(EVENTS)[0], 5300 / 15000),
        (report.rows_of(MULTI)[1], 1.0 / 1.05),
        (report.rows_of(RANKS)[0], 0.52 / 0.5),  # the element furthest from the target
    ],
)
def test_chart_ratio(row: report.Row, ratio: float) -> None:
    assert report.chart_ratio(row) == pytest.approx(ratio)


def test_from_folder_writes_markdown_and_png(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "events_throughput.jsonl").write_text(json.dumps(EVENTS) + "\n")
    lines = [json.dumps(x) for x in (CATALOG, FAULTS, MOE)] + ["", "{not json"]
    (results / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    out, png = tmp_path / "report.md", tmp_path / "report.png"
    rc = report.main(["--from", str(results), "--out", str(out), "--png", str(png)])
    assert rc == 1  # the malformed line is a failed row
    text = out.read_text()
    assert "saved full-run lines" in text and "(smoke)" in text  # MOE is a smoke line
    assert "| events_throughput | pipeline_eps | >= 15,000 | 5,300 | **missed** |" in text
    assert "| mixed | — | — | error: not JSON" in text
    assert "3 met, 5 missed, 1 failed, 0 unknown." in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smoke_run_failure_is_a_failed_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def timeout(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(report.subprocess, "run", timeout)
    (row,) = report.run_smoke("events_throughput", 5)
    assert row.smoke and row.error == "timed out after 5 s" and row.met is None
    assert "**failed**" in report.markdown([row], "smoke")


def test_smoke_runs_only_the_benchmarks_not_their_shared_modules() -> None:
    names = report.benchmark_names()
    assert "poison_traffic" in names and "multi_engine" in names
    assert not [n for n in names if n.startswith("_")]  # _poison*.py have no --smoke of their own
    assert "report" not in names


def test_a_line_judged_by_targets_and_met_reads_back_with_its_direction() -> None:
    line = {
        "benchmark": "multi_policy_training",
        "wall_time_ratio": 1.8,
        "peak_rss_ratio": 1.2,
        **report.targets_and_met(
            wall_time_ratio=(1.8, ">=", 1.77), peak_rss_ratio=(1.2, "<=", 1.05)
        ),
    }
    rows = {r.figure: r for r in report.rows_of(line)}
    assert (rows["wall_time_ratio"].met, report.direction(rows["wall_time_ratio"])) == (True, ">=")
    assert (rows["peak_rss_ratio"].met, report.direction(rows["peak_rss_ratio"])) == (False, "<=")
