"""One report of every benchmark's figures against its targets: a Markdown table and a bar chart.

Two sources, one output:

- ``--smoke``: run each benchmark's ``--smoke`` (one subprocess each, with a timeout) and report
  its JSON line. Smoke figures come from tiny configurations: they show that the benchmarks run
  and which way they point, not the full-run figures; the table labels them ``(smoke)``.
- ``--from DIR``: read saved JSON lines (``DIR/*.jsonl``, e.g. ``benchmarks/results/``), one
  benchmark line per line. A line may carry a ``command`` field (how it was produced); otherwise
  the command shown is the benchmark's default one.

The table has one row per figure that has a target: benchmark, figure, target, measured, met or
missed, command. Benchmark lines come in two shapes, both read here:

- ``"targets": {figure: target, ...}`` with ``"met": {figure: bool, ...}`` (``meets_targets`` is
  read as ``met``; without either, a target of 0 or true/false is met when the figure equals it).
  A figure is a key of the line, or ``<key>_<sub>`` for a nested ``{key: {sub: value}}``.
- one scalar ``target`` (or ``target_ratio``) with one ``met`` bool for the whole line; which
  figures it is about is listed in ``SCALAR_FIGURES`` (marked ``*`` in the table: the line's one
  ``met`` is shown on each of its figures).

The target's direction (at least / at most) is read from ``met``: a figure above its target that
met it had a minimum, and so on. The chart (``--png``) draws measured / target for every figure
with a non-zero numeric target, a line at 1.0, missed figures in another colour.

    python benchmarks/report.py --from benchmarks/results --out report.md --png report.png
    python benchmarks/report.py --smoke --only events_throughput,moe_packed_load
    python benchmarks/report.py --smoke --skip fault_injection --timeout 600
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._harness import targets_and_met  # noqa: E402

__all__ = ["targets_and_met"]  # the harness's; benchmarks' lines are judged in its shape
HERE = Path(__file__).resolve().parent

# Lines with one scalar target and one ``met``: (figure key, target key) pairs it is about.
SCALAR_FIGURES: dict[str, list[tuple[str, str]]] = {
    "moe_packed_load": [("speedup_cold", "target"), ("speedup_warm", "target")],
    "deepspeed_ranks": [
        ("ratio_per_rank", "target_ratio"),
        ("max_weight_diff", "weight_tolerance"),
    ],
}
SCALAR_TARGET_KEYS = ("target", "target_ratio")
# Smoke runs that take longer than the default timeout (their own Kafka and Cassandra, restarts).
SMOKE_TIMEOUT_S = {"fault_injection": 1500}
DEFAULT_TIMEOUT_S = 900
SMOKE_ARGS = {"fault_injection": ["--secure"]}  # what its test runs


@dataclass
class Row:
    benchmark: str
    figure: str
    target: object
    measured: object
    met: bool | None  # None: unknown (no met given) or the run failed
    command: str
    smoke: bool = False
    whole_line: bool = False  # one met for the whole line, shown on each of its figures
    error: str | None = None


def failed(benchmark: str, command: str, error: str, smoke: bool = False) -> Row:
    """The one row of a run or a saved line that gave no figures, with the reason."""
    return Row(benchmark, "—", None, None, None, command, smoke=smoke, error=error)


def default_command(name: str, smoke: bool) -> str:
    extra = " ".join(["--smoke", *SMOKE_ARGS.get(name, [])]) if smoke else ""
    return f"python -m benchmarks.{name}" + (f" {extra}" if extra else "")


def lookup(record: dict, figure: str) -> object:
    """The value of ``figure`` in a line: a key, ``a.b`` or ``<key>_<sub>`` of a nested dict."""
    if figure in record:
        return record[figure]
    if "." in figure:
        head, _, rest = figure.partition(".")
        if isinstance(record.get(head), dict):
            return lookup(record[head], rest)
    for key, value in record.items():
        if isinstance(value, dict) and figure.startswith(key + "_"):
            found = lookup(value, figure[len(key) + 1 :])
            if found is not None:
                return found
    return None


def rows_of(record: dict, command: str | None = None) -> list[Row]:
    """The rows of one benchmark line, whatever its shape."""
    name = str(record.get("benchmark", "?"))
    smoke = bool(record.get("smoke", False))
    cmd = command or record.get("command") or default_command(name, smoke)
    targets = record.get("targets")
    if isinstance(targets, dict):
        met = record.get("met", record.get("meets_targets"))
        met = met if isinstance(met, dict) else {}
        rows = []
        for figure, target in targets.items():
            measured = lookup(record, figure)
            ok = met.get(figure)
            if (
                ok is None
                and measured is not None
                and (target is True or target is False or target == 0)
            ):
                ok = measured == target
            rows.append(Row(name, figure, target, measured, ok, cmd, smoke))
        return rows
    target_key = next((k for k in SCALAR_TARGET_KEYS if k in record), None)
    met = record.get("met")
    if target_key is not None or isinstance(met, bool):
        ok = met if isinstance(met, bool) else None
        pairs = SCALAR_FIGURES.get(name)
        if not pairs:  # an unknown benchmark: the line as one figure
            return [
                Row(
                    name,
                    "line",
                    record.get(target_key) if target_key else None,
                    None,
                    ok,
                    cmd,
                    smoke,
                    whole_line=True,
                )
            ]
        return [
            Row(
                name,
                figure,
                record.get(tkey, record.get(target_key)),
                record.get(figure),
                ok,
                cmd,
                smoke,
                whole_line=len(pairs) > 1,
            )
            for figure, tkey in pairs
        ]
    return [Row(name, "(no target)", None, None, None, cmd, smoke)]


def direction(row: Row) -> str:
    """``>=``, ``<=`` or ``=``: read from met and which side of the target the figure is on."""
    m, t = row.measured, row.target
    if row.met is None or row.whole_line or isinstance(t, bool) or not _number(t):
        return ""
    if not _number(m):
        return ""
    if t == 0 or m == t:
        return "=" if t == 0 else ""
    above = m > t
    return ">=" if above == row.met else "<="


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def fmt(x: object) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) < 0.001:
            return f"{x:.2e}"
        return f"{x:.4g}" if abs(x) < 100 else f"{x:.1f}"
    if isinstance(x, list | tuple):
        return ", ".join(fmt(v) for v in x)
    if isinstance(x, dict):
        return ", ".join(f"{k} {fmt(v)}" for k, v in x.items())
    return str(x)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def verdict(row: Row, md: bool = False) -> str:
    """met, missed, failed or ? (unknown); ``*`` where the line's one met stands for it."""
    word = (
        "failed"
        if row.error is not None
        else "?"
        if row.met is None
        else "met"
        if row.met
        else "missed"
    )
    star = "*" if row.whole_line and row.error is None and row.met is not None else ""
    if not md:
        return word + star
    return (f"**{word}**" if word in ("failed", "missed") else word) + star.replace("*", "\\*")


def markdown(rows: list[Row], source: str) -> str:
    smoke = any(r.smoke for r in rows)
    lines = ["# Benchmark report", "", f"Source: {source}."]
    if smoke:
        lines += [
            "",
            "Rows marked (smoke) come from `--smoke` runs: tiny configurations that show "
            "the benchmark runs and which way it points; they are not the full-run figures.",
        ]
    lines += [
        "",
        "| benchmark | figure | target | measured | met | command |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        name = r.benchmark + (" (smoke)" if r.smoke else "")
        target = f"{direction(r)} {fmt(r.target)}".strip() if r.target is not None else "—"
        measured = f"error: {r.error}" if r.error is not None else fmt(r.measured)
        lines.append(
            "| "
            + " | ".join(
                _cell(c)
                for c in (name, r.figure, target, measured, verdict(r, md=True), f"`{r.command}`")
            )
            + " |"
        )
    notes = []
    if any(r.whole_line for r in rows):
        notes.append(
            "\\* the line has one target and one `met` for all its figures; it is shown "
            "on each of them."
        )
    met = sum(r.met is True for r in rows)
    missed = sum(r.met is False and r.error is None for r in rows)
    failed = sum(r.error is not None for r in rows)
    notes.append(
        f"{met} met, {missed} missed, {failed} failed, {len(rows) - met - missed - failed} unknown."
    )
    return "\n".join(lines + [""] + notes) + "\n"


def chart_ratio(row: Row) -> float | None:
    """measured / target, or None where it means nothing (a target of 0 or true/false)."""
    t, m = row.target, row.measured
    if row.error is not None or not _number(t) or t == 0:
        return None
    values = [v for v in (m if isinstance(m, list) else [m]) if _number(v)]
    if not values:
        return None
    return max((v / t for v in values), key=lambda q: abs(math.log(q)) if q > 0 else math.inf)


def chart(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(r, q) for r in rows if (q := chart_ratio(r)) is not None]
    left = [r for r in rows if chart_ratio(r) is None]
    height = max(2.5, 0.45 * len(drawn) + 1.8)
    fig, ax = plt.subplots(figsize=(9, height))
    labels = [f"{r.benchmark}{' (smoke)' if r.smoke else ''}: {r.figure}" for r, _ in drawn]
    colours = ["#2e7d32" if r.met else "#c62828" if r.met is False else "#9e9e9e" for r, _ in drawn]
    ys = list(range(len(drawn)))[::-1]
    ax.barh(ys, [q for _, q in drawn], color=colours)
    for y, (r, q) in zip(ys, drawn, strict=True):
        target = f"{direction(r)} {fmt(r.target)}".strip()
        ax.text(q, y, f" {q:.2f} ({fmt(r.measured)} vs {target})", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel(
        "measured / target (green met, red missed, grey unknown)\n"
        "for an at-most target (<=), below 1.0 is met"
    )
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max([q for _, q in drawn] + [1.0]) * 1.45)
    if left:
        note = "not drawn (target 0 or true/false, or failed): " + "; ".join(
            f"{r.benchmark}: {r.figure} {verdict(r)}" for r in left
        )
        fig.text(0.01, 0.005, note, fontsize=6, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.06 if left else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_dir(folder: Path) -> list[Row]:
    rows: list[Row] = []
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"no *.jsonl files in {folder}: save benchmark lines there first")
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                rows.append(failed(path.stem, f"{path.name}:{n}", f"not JSON ({e.msg})"))
                continue
            rows.extend(rows_of(record))
    return rows


def benchmark_names() -> list[str]:
    """The runnable benchmarks: not this report, nor the underscore modules they share."""
    return sorted(p.stem for p in HERE.glob("*.py") if p.stem != "report" and p.stem[0] != "_")


def run_smoke(name: str, timeout_s: float) -> list[Row]:
    """Run one benchmark's smoke mode; its rows, or one failed row with the reason."""
    cmd = [sys.executable, "-m", f"benchmarks.{name}", "--smoke", *SMOKE_ARGS.get(name, [])]
    shown = default_command(name, smoke=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return [failed(name, shown, f"timed out after {timeout_s:.0f} s", smoke=True)]
    print(f"{name}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:  # a line with a missed zero still counts (fault_injection exits 1 then)
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [failed(name, shown, f"exit {proc.returncode}, no JSON line: {tail}", smoke=True)]
    try:
        record = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        return [failed(name, shown, f"not JSON ({e.msg})", smoke=True)]
    record.setdefault("smoke", True)
    return rows_of(record, command=shown)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:]),
    )
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--smoke", action="store_true", help="run every benchmark's --smoke")
    source.add_argument(
        "--from", dest="folder", type=Path, help="read saved JSON lines from DIR/*.jsonl"
    )
    ap.add_argument("--only", help="comma-separated benchmark names (--smoke)")
    ap.add_argument("--skip", help="comma-separated benchmark names not to run (--smoke)")
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per smoke run (default {DEFAULT_TIMEOUT_S}, "
        f"fault_injection {SMOKE_TIMEOUT_S['fault_injection']})",
    )
    ap.add_argument("--out", type=Path, help="write the Markdown here (default: stdout)")
    ap.add_argument("--png", type=Path, help="write the bar chart here")
    args = ap.parse_args(argv)

    if args.smoke:
        names = benchmark_names()
        unknown = [
            n for arg in (args.only, args.skip) if arg for n in arg.split(",") if n not in names
        ]
        if unknown:
            ap.error(f"unknown benchmark {unknown[0]!r}: choose from {', '.join(names)}")
        if args.only:
            names = [n for n in names if n in args.only.split(",")]
        if args.skip:
            names = [n for n in names if n not in args.skip.split(",")]
        rows = []
        for name in names:
            timeout = args.timeout or SMOKE_TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S)
            print(
                f"{name}: {default_command(name, True)} (timeout {timeout:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            rows.extend(run_smoke(name, timeout))
        where = "`--smoke` runs of " + ", ".join(names)
    else:
        rows = read_dir(args.folder)
        where = f"saved full-run lines in `{args.folder}/*.jsonl`"

    text = markdown(rows, where)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    if args.png:
        title = "Benchmarks: measured / target" + (" (smoke runs)" if args.smoke else "")
        chart(rows, args.png, title)
    return 1 if any(r.error is not None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
