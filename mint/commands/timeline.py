"""`mint timeline POLICY`: every step of a policy's life from the event log, and `--png` to see it."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from mint.commands.args import tenant_policy
from mint.commands.errors import one_line_errors
from mint.commands.listing import output_option, print_rows, text, when
from schemas.settings import get_settings
from streams.timeline import Step, policy_events, timeline

out = Console()
console = Console(stderr=True)

# How each kind of step is drawn: marker, colour (the revision is the height).
STYLE = {
    "trained": ("o", "tab:gray"),
    "exported": ("s", "tab:blue"),
    "evaluation asked": ("^", "tab:olive"),
    "evaluated": ("D", "tab:green"),
    "evaluation refused": ("x", "tab:red"),
    "promote asked": (">", "tab:purple"),
    "promoted": ("P", "tab:purple"),
    "rollback asked": ("<", "tab:orange"),
    "rolled back": ("X", "tab:orange"),
    "refused": ("x", "tab:red"),
    "canary asked": ("v", "tab:cyan"),
    "canaried": ("h", "tab:cyan"),
    "canary won": ("*", "tab:green"),
    "canary ended": ("*", "tab:red"),
    "tagged": ("d", "tab:brown"),
    "retired": ("8", "black"),
    "restored": ("8", "tab:gray"),
}


@click.command("timeline")
@click.argument("policy_id")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Draw it to FILE.")
@click.option(
    "--bucket-s",
    type=click.IntRange(1, 86_400),
    default=60,
    help="Answers are counted per revision in buckets this long.",
)
@output_option
@one_line_errors
def timeline_cmd(policy_id: str, png: Path | None, bucket_s: int, output: str) -> None:
    """Every step of POLICY (tenant/policy) from the event log, oldest first: trained,
    exported, evaluation asked, evaluated, promote or rollback asked, promoted, rolled back,
    refused, and the answers served per revision (counted per bucket).

    What the log still holds: the catalog's topics forever, requests and answers for a day.

    \b
      mint timeline demo/arith
      mint timeline demo/arith --png arith.png
      mint timeline demo/arith -o json | jq 'select(.kind == "served")'
    """
    tenant, policy = tenant_policy(policy_id)
    steps = timeline(policy_events(get_settings(), tenant, policy), bucket_s=bucket_s)
    if not steps:
        console.print(f"no events of {tenant}/{policy} in the log (check the name and prefix)")
    print_rows(
        out,
        [s.row() for s in steps],
        {
            "at": when("at"),
            "step": text("kind"),
            "rev": text("revision"),
            "detail": text("detail"),
        },
        output,
        title=f"{tenant}/{policy}",
    )
    if png is not None:
        draw(steps, png, f"{tenant}/{policy}", bucket_s)
        console.print(f"wrote {png}")


def draw(steps: list[Step], path: Path, title: str, bucket_s: int = 60) -> None:
    """Steps as markers at (time, revision); answers served as bars below, per revision."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(11, 6), height_ratios=[3, 1], constrained_layout=True
    )
    for kind, (marker, colour) in STYLE.items():
        mine = [s for s in steps if s.kind == kind]
        if mine:  # a step of no revision yet (a training round) sits at 0
            top.scatter(
                [s.at for s in mine],
                [s.revision or 0 for s in mine],
                marker=marker,
                color=colour,
                s=60,
                label=kind,
                zorder=3,
            )
    top.set_ylabel("revision (trained: its parent, 0 none)")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    highest = max((s.revision or 0 for s in steps), default=1)
    top.set_ylim(-0.5, highest + 0.5)
    top.grid(alpha=0.3)
    top.set_title(f"{title}: its life from the event log")
    if any(s.kind != "served" for s in steps):
        top.legend(loc="upper left", fontsize=8, ncols=2)
    served = [s for s in steps if s.kind == "served"]
    for revision in sorted({s.revision for s in served}, key=lambda r: r or 0):
        mine = [s for s in served if s.revision == revision]
        bottom.bar(
            [s.at for s in mine],
            [s.count for s in mine],
            width=0.8 * bucket_s / 86_400,  # in days, matplotlib's unit for dates
            label=f"r{revision}" if revision else "unresolved",
        )
    bottom.set_ylabel("answers")
    if served:
        bottom.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


COMMANDS: list[click.Command] = [timeline_cmd]
