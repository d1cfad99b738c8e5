"""`mint policies show|retire`: one policy's state, and retiring or restoring it.

Retirement is a fact in the log (``policy.retired`` on serving.events) that the projector
records on the policy's catalog row, so `mint catalog rebuild` gives the same row. While a
policy is retired the catalog registers no revision and moves no alias in it; its revisions
and aliases stay readable and served. ``--undo`` restores it.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from mint.commands.args import tenant_policy
from mint.commands.errors import one_line_errors
from mint.commands.listing import _plain, object_output_option
from schemas.settings import get_settings

console = Console(stderr=True)
out = Console()


def _client(tenant: str, timeout_s: float):
    from mint.sdk import MintClient

    return MintClient(get_settings(), tenant, producer="cli", timeout_s=timeout_s)


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
)


def policy_configuration(repo: Any, tenant: str, policy: str) -> dict[str, Any] | None:
    """The policy's latest lifecycle configuration as the controller keeps it (its worker
    state: `mint policies configure`), or None when it was never configured."""
    from catalog.state import StateTable
    from workers.controller.logic import CONFIGS_STATE

    cfg = StateTable(repo.session, repo.keyspace, CONFIGS_STATE).get(f"{tenant}/{policy}")
    return None if cfg is None else {k: cfg.get(k) for k in CONFIG_FIELDS}


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
        click.echo(json.dumps(row, default=_plain, ensure_ascii=False))
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
@click.option("--timeout", default=30.0, help="Seconds to wait for the catalog to show it.")
@one_line_errors
def policies_retire(policy_id: str, reason: str, undo: bool, timeout: float) -> None:
    """Retire a policy: no new revisions and no alias moves; its revisions and aliases stay
    readable and served. Reversible with --undo.

    \b
    Publishes policy.retired on serving.events and waits until the catalog shows it (the
    projector applies it: `mint worker projector`). A policy the catalog lacks is refused
    before anything is sent. While retired, training updates of the policy fail (their
    revision cannot be registered) and promotions are refused.
    \b
    Example:
      mint policies retire acme/math-rl --reason "superseded by math-rl-v2"
      mint policies retire acme/math-rl --undo
    """
    from mint.sdk import MintError
    from mint.sdk.exceptions import WaitTimeout
    from streams.exceptions import KafkaUnavailable, PublishError

    tenant, policy = tenant_policy(policy_id)
    verb = "restore" if undo else "retire"
    try:
        with _client(tenant, timeout) as c:
            pol = c.policy(policy)  # PolicyNotFound: nothing sent
            if (pol.retired_at is None) == undo:
                console.print(f"{policy_id} is {'not ' if undo else ''}retired: nothing to do")
                if not undo:
                    console.print(f"  retired: {_retired(pol)}")
                return
            pol = c.retire(policy, reason=reason, undo=undo, timeout_s=timeout)
    except KafkaUnavailable as e:
        raise MintError(f"{e}; nothing was sent, {policy_id} was not {verb}d") from None
    except PublishError as e:
        raise MintError(
            f"{e}; check `mint policies show {policy_id}` before sending it again"
        ) from None
    except WaitTimeout as e:
        raise MintError(
            f"{e} The event is on serving.events: the catalog records it when the projector "
            f"runs (`mint worker projector`); `mint policies show {policy_id}` shows when"
        ) from None
    if pol.retired_at is None:
        console.print(f"{policy_id} restored: revisions can be registered and promoted again")
    else:
        console.print(
            f"{policy_id} retired at {pol.retired_at:%Y-%m-%d %H:%M:%S} by {pol.retired_by}: "
            "no new revisions or alias moves; its revisions and aliases stay readable "
            f"(undo: `mint policies retire {policy_id} --undo`)"
        )


COMMANDS: list[click.Command] = [policies_show, policies_retire]
