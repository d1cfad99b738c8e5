"""`mint policies configure|show|retire`: one policy's lifecycle configuration, its state, and
retiring or restoring it.

Retiring is a command (``policy.retire`` on serving.commands) that the controller carries out:
it writes the policy's catalog row and publishes the fact (``policy.retired`` on serving.events),
which the projector records again from the log, so `mint catalog rebuild` gives the same row.
While a policy is retired the catalog registers no revision and moves no alias in it; its
revisions and aliases stay readable and served. ``--undo`` restores it.
"""

from __future__ import annotations

import re
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from mint.commands.args import tenant_policy
from mint.commands.clients import carried_out_later, cli_client, sending
from mint.commands.errors import one_line_errors
from mint.commands.listing import echo_json, object_output_option
from schemas.events import CanaryRule

console = Console(stderr=True)
out = Console()


# ---------------------------------------------------------------------- configure

GATE_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._/-]*)\s*(>=|<=)\s*(-?[0-9.eE+-]+)$")
RULE = CanaryRule.model_fields  # the canary flags' defaults and bounds are the contract's


def describe_rule(rule: CanaryRule) -> str:
    """One line: when a canary is judged and what makes it win."""
    scores = f" and {rule.min_scores} scores" if rule.min_scores else ""
    return (
        f"after {rule.min_answers} answers{scores}, it wins if its failure rate is at most "
        f"the incumbent's + {rule.max_failure_increase:g} and its mean score at least the "
        f"incumbent's - {rule.max_score_drop:g}"
    )


def parse_gate(items: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """``reward>=0.6`` ``loss<=2`` → thresholds (both bounds on one metric are allowed)."""
    gate: dict[str, dict[str, float]] = {}
    for item in items:
        m = GATE_RE.match(item.strip())
        if not m:
            raise click.BadParameter(
                f"--gate {item!r} is not METRIC>=VALUE or METRIC<=VALUE (e.g. --gate reward>=0.6)"
            )
        name, op, value = m.groups()
        gate.setdefault(name, {})["min" if op == ">=" else "max"] = float(value)
    return gate


def _rule_option(field: str, type_: click.ParamType, help: str):
    """--canary-<field> (min_answers: --canary-min-answers), defaulting as the contract does."""
    flag = "--canary-" + field.replace("_", "-")
    return click.option(flag, type=type_, default=RULE[field].default, help=help)


@click.command("configure")
@click.argument("policy_id")
@click.option("--base-model", required=True, help="Base model path or id the policy trains on.")
@click.option("--suite", required=True, help="Evaluation suite (see workers/evaluator/suites.py).")
@click.option("--gate", multiple=True, help="Threshold METRIC>=X or METRIC<=X (repeatable).")
@click.option("--promote-to", default="prod", help="Alias a passing revision moves to.")
@click.option("--no-auto-promote", is_flag=True, help="Evaluate, but let people promote.")
@click.option("--rollback-metric", default=None, help="Metric watched on the serving revision.")
@click.option("--tolerance", default=0.0, help="Allowed drop before rollback.")
@_rule_option("min_answers", click.IntRange(1, 10_000_000), "Canary answers before it is judged.")
@_rule_option(
    "min_scores",
    click.IntRange(0, 10_000_000),
    "Canary feedback scores before it is judged (0: none needed).",
)
@_rule_option(
    "max_failure_increase",
    click.FloatRange(0.0, 1.0),
    "How far the canary's failure rate may exceed the incumbent's.",
)
@_rule_option(
    "max_score_drop",
    click.FloatRange(0.0, 1.0),
    "How far the canary's mean feedback score may fall below the incumbent's.",
)
@one_line_errors
def policies_configure(
    policy_id,
    base_model,
    suite,
    gate,
    promote_to,
    no_auto_promote,
    rollback_metric,
    tolerance,
    canary_min_answers,
    canary_min_scores,
    canary_max_failure_increase,
    canary_max_score_drop,
) -> None:
    """Publish a policy's lifecycle configuration (policy.configured, compacted topic): its
    evaluation suite and gate, automatic rollback, and when a canary
    (`mint promote T/P@N --canary 0.1`) wins.

    \b
    Example:
      mint policies configure acme/math-rl --base-model ./models/llama --suite toy-even \\
          --gate reward>=0.6 --rollback-metric reward --tolerance 0.05 \\
          --canary-min-answers 500 --canary-min-scores 50 --canary-max-score-drop 0.05
    """
    tenant, policy = tenant_policy(policy_id)
    thresholds = parse_gate(gate)
    rule = CanaryRule(
        min_answers=canary_min_answers,
        min_scores=canary_min_scores,
        max_failure_increase=canary_max_failure_increase,
        max_score_drop=canary_max_score_drop,
    )
    with cli_client(tenant, 60.0) as c:
        env = c.create_policy(
            policy,
            base_model=base_model,
            suite=suite,
            thresholds=thresholds,
            promote_to=promote_to,
            auto_promote=not no_auto_promote,
            rollback_metric=rollback_metric,
            rollback_tolerance=tolerance,
            canary=rule,
        )
    console.print(
        f"configured {policy_id}: suite {suite}, gate {thresholds or 'none'} → {promote_to}; "
        f"a canary: {describe_rule(rule)} (event {env.event_id})",
        soft_wrap=True,
    )


# ---------------------------------------------------------------------- show


# The lifecycle configuration's fields `policies show` prints (policy.configured's).
CONFIG_FIELDS = (
    "suite",
    "thresholds",
    "promote_to",
    "auto_evaluate",
    "auto_promote",
    "rollback_metric",
    "rollback_tolerance",
    "canary",
)


def policy_configuration(repo: Any, tenant: str, policy: str) -> dict[str, Any] | None:
    """The policy's latest lifecycle configuration as the controller keeps it (its worker
    state: `mint policies configure`), or None when it was never configured."""
    from catalog.state import StateTable
    from workers.controller.logic import CONFIGS_STATE

    cfg = StateTable(repo.session, repo.keyspace, CONFIGS_STATE).get(f"{tenant}/{policy}")
    if cfg is None:
        return None
    # A configuration published before canaries existed: the controller judges by the defaults.
    return {k: cfg.get(k) for k in CONFIG_FIELDS} | {
        "canary": cfg.get("canary") or CanaryRule().model_dump()
    }


def policy_fields(
    pol: Any, aliases: list[Any], latest: int | None, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One policy as `policies show -o json` prints it."""
    return {
        "tenant": pol.tenant,
        "policy": pol.policy,
        "base_model": pol.base_model,
        "created_at": pol.created_at,
        "created_by": pol.created_by,
        "retired": pol.retired_at is not None,
        "retired_at": pol.retired_at,
        "retired_by": pol.retired_by,
        "aliases": {a.alias: a.revision for a in aliases if a.revision is not None},
        "latest_revision": latest,
        "configuration": config,
    }


@click.command("show")
@click.argument("policy_id")
@object_output_option
@one_line_errors
def policies_show(policy_id: str, output: str) -> None:
    """One policy: base model, created, retired (when, by), aliases, latest revision and its
    lifecycle configuration (evaluation suite, gate, promotion, rollback rule)."""
    from mint.commands.revisions import catalog_repo

    tenant, policy = tenant_policy(policy_id)
    with catalog_repo() as repo:
        pol = repo.get_policy(tenant, policy)
        aliases = repo.list_aliases(tenant, policy)
        page, _ = repo.list_revisions(tenant, policy, page_size=1)
        config = policy_configuration(repo, tenant, policy)
    row = policy_fields(pol, aliases, page[0].revision if page else None, config)
    if output == "json":
        echo_json(row)
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_row("policy", f"{tenant}/{policy}")
    grid.add_row("base model", row["base_model"])
    grid.add_row("created", f"{row['created_at']:%Y-%m-%d %H:%M:%S} by {row['created_by'] or '-'}")
    grid.add_row("retired", _retired(pol))
    shown = ", ".join(f"{a}→{n}" for a, n in sorted(row["aliases"].items()))
    grid.add_row("aliases", shown or "-")
    grid.add_row("latest revision", str(row["latest_revision"] or "-"))
    for name, value in _configuration_rows(config):
        grid.add_row(name, value)
    out.print(grid)


def _configuration_rows(cfg: dict[str, Any] | None) -> list[tuple[str, str]]:
    if cfg is None:
        return [("configuration", "none (`mint policies configure`)")]
    gate = ", ".join(
        " ".join(
            f"{name}{op}{t[key]:g}"
            for key, op in (("min", ">="), ("max", "<="))
            if t.get(key) is not None
        )
        for name, t in sorted((cfg["thresholds"] or {}).items())
    )
    promote = cfg["promote_to"] if cfg["auto_promote"] else f"{cfg['promote_to']} (by hand)"
    rollback = "none"
    if cfg["rollback_metric"]:
        rollback = f"{cfg['rollback_metric']} falls > {cfg['rollback_tolerance']:g}"
    return [
        ("suite", cfg["suite"] + ("" if cfg["auto_evaluate"] else " (not automatic)")),
        ("gate", gate or "none"),
        ("canary", describe_rule(CanaryRule.model_validate(cfg.get("canary") or {}))),
        ("promotes to", promote),
        ("rolls back when", rollback),
    ]


def _retired(pol: Any) -> str:
    if pol.retired_at is None:
        return "no"
    return f"{pol.retired_at:%Y-%m-%d %H:%M:%S} by {pol.retired_by or '-'}"


# ---------------------------------------------------------------------- retire


@click.command("retire")
@click.argument("policy_id")
@click.option("--reason", default="", help="Why (kept with the event on serving.events).")
@click.option("--undo", is_flag=True, help="Restore a retired policy.")
@click.option("--timeout", default=30.0, help="Seconds to wait for the controller's answer.")
@one_line_errors
def policies_retire(policy_id: str, reason: str, undo: bool, timeout: float) -> None:
    """Retire a policy: no new revisions and no alias moves; its revisions and aliases stay
    readable and served. Reversible with --undo.

    \b
    Publishes policy.retire on serving.commands; it is carried out by the controller
    (`mint worker controller`), which writes the catalog and answers policy.retired (or
    serving.refused, whose reason is printed: exit 1). A policy the catalog lacks is refused
    before anything is sent. While retired, training updates of the policy fail (their
    revision cannot be registered) and promotions are refused.
    \b
    Example:
      mint policies retire acme/math-rl --reason "superseded by math-rl-v2"
      mint policies retire acme/math-rl --undo
    """
    tenant, policy = tenant_policy(policy_id)
    verb = "restore" if undo else "retire"
    check = f"mint policies show {policy_id}"
    with (
        sending(
            f"nothing was sent, {policy_id} was not {verb}d",
            f"check `{check}` before sending it again",
            carried_out_later(check),
        ),
        cli_client(tenant, timeout) as c,
    ):
        pol = c.policy(policy)  # PolicyNotFound: nothing sent
        if (pol.retired_at is None) == undo:
            console.print(f"{policy_id} is {'not ' if undo else ''}retired: nothing to do")
            if not undo:
                console.print(f"  retired: {_retired(pol)}")
            return
        pol = c.retire(policy, reason=reason, undo=undo, timeout_s=timeout)
    if pol.retired_at is None:
        console.print(f"{policy_id} restored: revisions can be registered and promoted again")
    else:
        console.print(
            f"{policy_id} retired at {pol.retired_at:%Y-%m-%d %H:%M:%S} by {pol.retired_by}: "
            "no new revisions or alias moves; its revisions and aliases stay readable "
            f"(undo: `mint policies retire {policy_id} --undo`)"
        )


COMMANDS: list[click.Command] = [policies_configure, policies_show, policies_retire]
