"""`mint canary status` and `mint feedback`: watching a canary release and scoring answers.

The controller keeps one view per policy (its latest canary: one runs at a time per policy, on
the alias it names), so `canary status T/P@alias` shows it when it is that alias's.

A canary (`mint promote T/P@N --canary 0.1`) sends a share of an alias's callers to a new
revision while the rest stay on the incumbent; the controller counts each side's answers,
failures and feedback scores (`mint feedback`) and promotes or ends it by the policy's canary
rule (`mint policies configure --canary-…`). `mint rollback` ends a running one by hand.
The lines `mint promote --canary` and `mint rollback` print are written here too.
"""

from __future__ import annotations

import re
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mint.commands import policy_status
from mint.commands.args import tenant_policy
from mint.commands.clients import cli_client, sending
from mint.commands.errors import one_line_errors
from mint.commands.listing import echo_json, object_output_option
from mint.commands.policy_status import describe_rule
from schemas.events import CanaryRule
from schemas.events.inference import REQUEST_ID_RE

console = Console(stderr=True)
out = Console()


# ---------------------------------------------------------------------- lines


def say(line: str) -> None:
    """One message line on stderr, as written: never wrapped, no rich markup (reasons are
    free text that may hold brackets)."""
    console.print(line, soft_wrap=True, markup=False, highlight=False)


def percent(share: float) -> str:
    return f"{share * 100:.4g}%"


def started_line(started: Any, rule: CanaryRule | None) -> str:
    """What `mint promote --canary` prints for a ``canary.started``."""
    p = started.payload
    judged = (
        describe_rule(rule)
        if rule
        else f"the policy's canary rule (`mint policies show {started.policy_id}`)"
    )
    return (
        f"canary: {percent(p.share)} of {started.policy_id}@{p.alias}'s callers -> revision "
        f"{p.revision}; the rest stay on {p.incumbent_revision}; judged by {judged}"
    )


def ended_line(ended: Any) -> str:
    """What `mint rollback` prints when its answer is a ``canary.ended``."""
    p = ended.payload
    where = f"{ended.policy_id}@{p.alias}"
    if p.outcome == "promoted":
        return f"canary of revision {p.revision} ended (promoted): {p.reason}; {where} moves to {p.revision}"
    return (
        f"canary of revision {p.revision} ended (rolled back): {p.reason}; "
        f"{where} stays on {p.incumbent_revision}"
    )


def started_rule(client: Any, started: Any) -> CanaryRule | None:
    """The rule the controller judges the canary ``started`` by: its live view's, else the
    policy's configured one; None when neither can be read (the canary runs all the same,
    so a failed read only shortens the line)."""
    from schemas.exceptions import MintError

    p = started.payload
    try:
        view = client.canary_status(started.policy, p.alias)
        if view is not None and view.canary_id == p.canary_id:
            return view.rule
        # Through the module: the configuration read is policy_status's (tests replace it).
        cfg = policy_status.policy_configuration(client.catalog, started.tenant, started.policy)
    except MintError:
        return None
    return CanaryRule.model_validate(cfg["canary"]) if cfg else CanaryRule()


# ---------------------------------------------------------------------- status


def load_view(tenant: str, policy: str):
    """The controller's view of tenant/policy's latest canary, or None (tests replace it)."""
    from mint.commands.revisions import catalog_repo
    from workers.controller.canary_view import read_canary_view

    with catalog_repo() as repo:
        return read_canary_view(repo.session, repo.keyspace, tenant, policy)


def share_got(view: Any) -> float | None:
    """The canary's share of both sides' answers (None before any answer)."""
    total = view.canary.answers + view.incumbent.answers
    return view.canary.answers / total if total else None


def view_fields(view: Any, tenant: str, policy: str) -> dict[str, Any]:
    """The view as `canary status -o json` prints it: the controller's fields (less its
    offset bookkeeping) with each side's rates and the share got."""
    row = {"policy_id": f"{tenant}/{policy}", **view.model_dump(mode="json")}
    row.pop("offsets", None)
    row["early_scores"] = len(view.early_scores)  # scores waiting for their answer
    for name in ("canary", "incumbent"):
        side = getattr(view, name)
        row[name].update(
            failure_rate=side.failure_rate,
            mean_latency_ms=side.mean_latency_ms,
            mean_score=side.mean_score,
        )
    row["share_got"] = share_got(view)
    return row


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else format(value, fmt) + unit


def print_view(view: Any, where: str) -> None:
    table = Table(
        "side",
        "rev",
        "answers",
        "failures",
        "fail %",
        "latency",
        "scores",
        "score",
        title=f"canary of {where}",
    )
    for name in ("canary", "incumbent"):
        s = getattr(view, name)
        table.add_row(
            name,
            str(s.revision),
            str(s.answers),
            str(s.failures),
            f"{s.failure_rate:.2%}",
            _num(s.mean_latency_ms, ".1f", " ms"),  # the mean of an answer's
            str(s.scores),
            _num(s.mean_score, ".3f"),  # the mean of its feedback scores
        )
    out.print(table)
    rule, got = view.rule, share_got(view)
    grid = Table.grid(padding=(0, 2))
    grid.add_row(
        "started", f"{view.started_at:%Y-%m-%d %H:%M:%S} by {escape(view.started_by or '-')}"
    )
    grid.add_row("share asked", percent(view.share))
    grid.add_row("share got", "- (no answers yet)" if got is None else percent(got))
    scores = (
        f"{view.canary.scores}/{rule.min_scores}"
        if rule.min_scores
        else f"{view.canary.scores} (none needed)"
    )
    grid.add_row("progress", f"answers {view.canary.answers}/{rule.min_answers}, scores {scores}")
    grid.add_row("rule", describe_rule(rule))
    grid.add_row("decision", _decision(view, where))
    out.print(grid)


def _decision(view: Any, where: str) -> str:
    d = view.decision
    if d is None:
        return "none yet: the canary is live"
    outcome = d.outcome.replace("_", " ")
    stays = (
        f"{where} moves to {view.revision}"
        if d.outcome == "promoted"
        else f"{where} stays on {view.incumbent_revision}"
    )
    state = "" if d.done else " (being carried out)"
    # the reason is free text: escaped, so that brackets in it are not read as rich markup
    return f"{outcome} at {d.decided_at:%Y-%m-%d %H:%M:%S}{state}: {escape(d.reason)}; {stays}"


@click.group("canary")
def canary() -> None:
    """Canary releases: a share of an alias's callers on a new revision, judged live.

    \b
    Start one with `mint promote acme/math-rl@7 --canary 0.1`, watch it with
    `mint canary status acme/math-rl`, score answers with `mint feedback`, end it
    by hand with `mint rollback acme/math-rl`. The controller promotes or ends it by
    the policy's canary rule (`mint policies configure --canary-min-answers …`).
    """


@canary.command("status")
@click.argument("policy_id")
@click.option("--alias", default=None, help="Alias (default: the @alias of POLICY_ID, or prod).")
@object_output_option
@one_line_errors
def canary_status(policy_id: str, alias: str | None, output: str) -> None:
    """What the controller knows of an alias's canary, live: each side's answers, failures,
    failure rate, mean latency and feedback scores, the share asked and got, progress to the
    rule's minimums, and the decision once there is one.

    \b
    Example:
      mint canary status acme/math-rl            # prod's canary
      mint canary status acme/math-rl@beta -o json | jq .share_got
    """
    tenant, policy = tenant_policy(policy_id)
    alias = alias or (policy_id.partition("@")[2] or "prod")
    where = f"{tenant}/{policy}@{alias}"
    view = load_view(tenant, policy)
    if view is None or view.alias != alias:
        elsewhere = ""
        if view is not None:  # one canary per policy: its latest was on another alias
            elsewhere = (
                f" (the latest canary of {tenant}/{policy} is on @{view.alias}: "
                f"`mint canary status {tenant}/{policy}@{view.alias}`)"
            )
        say(
            f"no canary of {where}{elsewhere}: start one with "
            f"`mint promote {tenant}/{policy}@N --canary 0.1`"
            + ("" if alias == "prod" else f" --alias {alias}")
        )
        if output == "json":
            click.echo("null")
        return
    if output == "json":
        echo_json(view_fields(view, tenant, policy))
        return
    print_view(view, where)


# ---------------------------------------------------------------------- feedback


def _score(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise click.BadParameter(
            f"{value:g} is outside [0, 1]: give 1 for the best answer, 0 for the worst"
        )
    return value


def _request_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.match(REQUEST_ID_RE, value):
        raise click.BadParameter(
            f"{value!r} is not a request id (letters, digits and . _ : -, at most 128): give "
            "the id of an answered request of the policy (the SDK's "
            "`mint.infer(...).request_id`)"
        )
    return value


@click.command("feedback")
@click.argument("policy_id")
@click.argument("request_id", callback=_request_id)
@click.argument("score", type=float, callback=_score)
@click.option("--comment", default="", show_default=False, help="Why (kept with the score).")
@click.option("--timeout", default=30.0, help="Seconds to wait for the broker.")
@one_line_errors
def feedback(policy_id: str, request_id: str, score: float, comment: str, timeout: float) -> None:
    """Score one answer of a policy in [0, 1] (1 best): feedback.submitted on `feedback`.

    The controller joins the score to the revision that answered REQUEST_ID and judges a
    running canary on it (the rule's --canary-min-scores and --canary-max-score-drop).

    \b
    Example:
      mint feedback acme/math-rl 3f9c2a7e 0.9 --comment "right, and short"
    """
    tenant, policy = tenant_policy(policy_id)
    with (
        sending(
            "nothing was sent",
            "the score may or may not be recorded: sending it again may count it twice",
        ),
        cli_client(tenant, timeout) as c,
    ):
        env = c.feedback(policy, request_id, score, comment=comment)
    say(f"feedback on request {request_id} of {tenant}/{policy}: {score:g} (event {env.event_id})")


COMMANDS: list[click.Command] = [canary, feedback]
