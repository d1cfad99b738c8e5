"""A revision's figures as the CLI shows them: the rows of `mint revisions` and `mint catalog
revisions` (tags, training loss and reward, evaluation verdicts), `mint revision show REF` (every
field of one revision, each evaluation with all its metrics against its thresholds), and
`mint revision tag REF TAG…` (a revision's labels, changed through the controller)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from mint.commands.clients import carried_out_later, cli_client, sending
from mint.commands.errors import one_line_errors
from mint.commands.listing import (
    Cell,
    echo_json,
    object_output_option,
    print_rows,
    text,
    when,
)
from schemas.names import TagName
from schemas.settings import get_settings

console = Console(stderr=True)
out = Console()

# The order `revision show` lists training figures in (TrainingFigures' fields).
FIGURES = ("steps", "tokens", "loss", "reward", "learning_rate")
# A tag's rule, the wire contract's (TagCommand's add/remove), checked before anything is sent.
TAG_RE = TagName.__metadata__[0].pattern
TAG_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"


@contextmanager
def catalog_repo() -> Iterator[Any]:
    """The catalog repository of MINT_KEYSPACE for one command (tests replace it)."""
    from catalog.repository import CatalogRepository
    from mint.commands.cassandra import catalog_session

    settings = get_settings()
    with catalog_session(settings) as session:
        yield CatalogRepository(session, settings.keyspace)


# ---------------------------------------------------------------------- rows


def evaluation_fields(e: Any) -> dict[str, Any]:
    """One evaluation (catalog.models.Evaluation) as JSON output carries it."""
    return {
        "passed": e.passed,
        "metrics": dict(e.metrics),
        "thresholds": dict(e.thresholds),
        "failures": list(e.failures),
        "refused": e.refused,
        "evaluated_at": e.evaluated_at,
        "evaluated_by": e.evaluated_by,
        "event_id": str(e.event_id) if e.event_id else None,
    }


def revision_row(
    rev: Any, aliases: Iterable[str] | None, evaluations: Iterable[Any]
) -> dict[str, Any]:
    """A revision with its aliases (None: not listed), training figures and evaluations by
    suite: one row of a listing, one object of ``-o json``."""
    row: dict[str, Any] = {
        "revision": rev.revision,
        "digest": rev.digest,
        "store_uri": rev.store_uri,
        "parent_revision": rev.parent_revision,
    }
    if aliases is not None:
        row["aliases"] = sorted(aliases)
    row |= {
        "tags": sorted(getattr(rev, "tags", None) or []),
        "created_at": rev.created_at,
        "created_by": rev.created_by,
        "training": dict(getattr(rev, "training", None) or {}),
        "evaluations": {e.suite: evaluation_fields(e) for e in sorted(evaluations, key=_suite)},
    }
    return row


def revision_rows(
    revs: Iterable[Any], aliases: Iterable[Any], evaluations: Mapping[int, list[Any]]
) -> list[dict[str, Any]]:
    """The rows of `mint revisions` and `mint catalog revisions`: each revision with the
    aliases (catalog.models.Alias) that point at it and its evaluations (by revision)."""
    by_rev: dict[int, list[str]] = {}
    for a in aliases:
        by_rev.setdefault(a.revision, []).append(a.alias)
    return [
        revision_row(r, by_rev.get(r.revision, []), evaluations.get(r.revision, [])) for r in revs
    ]


def _suite(e: Any) -> str:
    return e.suite


def number(value: float | None) -> str:
    """A figure for a table: 4 significant digits, integers as integers, blank when absent."""
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def headline(evaluation: Mapping[str, Any]) -> tuple[str, float] | None:
    """The metric a verdict is shown with: the first thresholded one (what the gate judged),
    else the first by name; None for a refused evaluation (no metrics)."""
    metrics = evaluation["metrics"]
    names = sorted(n for n in evaluation["thresholds"] if n in metrics) or sorted(metrics)
    return (names[0], metrics[names[0]]) if names else None


def verdicts(row: Mapping[str, Any]) -> str:
    """``suite ✓ 0.82`` per suite (✗ when its gate failed, ``refused`` when it did not run)."""
    parts = []
    for suite, e in row["evaluations"].items():
        if e["refused"] is not None:
            parts.append(f"{suite} refused")
            continue
        mark = "✓" if e["passed"] else "✗"
        first = headline(e)
        parts.append(f"{suite} {mark}" + (f" {number(first[1])}" if first else ""))
    return ", ".join(parts)


def figure(name: str) -> Cell:
    return lambda row: number(row["training"].get(name))


def columns(with_aliases: bool, with_store: bool) -> dict[str, Cell]:
    cols: dict[str, Cell] = {
        "rev": text("revision"),
        "digest": lambda r: r["digest"][:19] + "…",
    }
    if with_store:
        cols["store uri"] = text("store_uri")
    cols["parent"] = text("parent_revision")
    if with_aliases:
        cols["aliases"] = lambda r: ", ".join(r["aliases"])
    cols |= {
        "tags": lambda r: ", ".join(r["tags"]) or "-",
        "created": when("created_at"),
        "by": text("created_by"),
        "loss": figure("loss"),
        "reward": figure("reward"),
        "eval": verdicts,
    }
    return cols


def print_revisions(rows: list[dict[str, Any]], output: str, *, store: bool = False) -> None:
    """The rows of `mint revisions` (with aliases) or `mint catalog revisions` (store URIs)."""
    with_aliases = bool(rows) and "aliases" in rows[0]
    print_rows(out, rows, columns(with_aliases, store), output)


# ---------------------------------------------------------------------- revision show


@click.group("revision")
def revision() -> None:
    """One revision of a policy: `mint revision show|tag|download tenant/policy@N|@alias|…`."""


@revision.command("show")
@click.argument("reference")
@object_output_option
@one_line_errors
def show(reference: str, output: str) -> None:
    """Every field of one revision: digest, parent, aliases, tags, created, by, training figures
    and each evaluation with all its metrics against the thresholds.

    REFERENCE is tenant/policy@N, @alias or @sha256:… (tenant/policy alone: the latest)."""
    with catalog_repo() as repo:
        tenant, policy, target = resolve(repo, reference)
        rev = repo.get_revision(tenant, policy, target)
        aliases = [a.alias for a in repo.list_aliases(tenant, policy) if a.revision == target]
        evaluations = repo.evaluations(tenant, policy, target)
    row = revision_row(rev, aliases, evaluations)
    row = {"tenant": tenant, "policy": policy, **row, "metadata": dict(rev.metadata)}
    if output == "json":
        echo_json(row)
        return
    print_revision(row)


def resolve(repo: Any, reference: str) -> tuple[str, str, int]:
    """REFERENCE (tenant/policy@N, @alias, @sha256:…, or tenant/policy: the latest) →
    (tenant, policy, revision number)."""
    from catalog.refs import parse_ref
    from mint.commands.args import tenant_policy

    if "@" in reference:
        ref = parse_ref(reference)
        return ref.tenant, ref.policy, repo.resolve(ref).revision
    tenant, policy = tenant_policy(reference)
    page, _ = repo.list_revisions(tenant, policy, page_size=1)
    if not page:
        raise click.ClickException(f"{tenant}/{policy} has no revisions yet")
    return tenant, policy, page[0].revision


# ---------------------------------------------------------------------- revision tag


def _tags(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[str]:
    """Each tag checked against the contract's rule: a bad one is a usage error naming it."""
    for value in values:
        if not re.match(TAG_RE, value):
            raise click.BadParameter(
                f"{value!r} is not a tag: a tag is {TAG_RULE} ({TAG_RE}), e.g. 'candidate', "
                "'reviewed' or 'release-2026-12'"
            )
    return list(dict.fromkeys(values))


@revision.command("tag")
@click.argument("reference")
@click.argument("tags", nargs=-1, metavar="[TAG]...", callback=_tags)
@click.option(
    "--remove",
    multiple=True,
    metavar="TAG",
    callback=_tags,
    help="Take this tag off the revision (repeat for more).",
)
@click.option("--timeout", default=60.0, help="Seconds to wait for the controller's answer.")
@one_line_errors
def tag(reference: str, tags: list[str], remove: list[str], timeout: float) -> None:
    """Add tags to a revision (and take others off with --remove): labels a registry keeps,
    such as candidate, reviewed or release-2026-12. Prints the revision's tags afterwards.

    REFERENCE is tenant/policy@N, @alias or @sha256:… (an alias or a digest is resolved to its
    revision number first: the tag stays with that revision when the alias moves on).

    \b
    Publishes revision.tag on serving.commands; it is carried out by the controller
    (`mint worker controller`), which answers revision.tagged (the whole resulting set) or
    serving.refused, whose reason is printed (exit 1): e.g. no such revision.
    \b
    Example:
      mint revision tag acme/math-rl@7 candidate reviewed
      mint revision tag acme/math-rl@prod release-2026-12 --remove candidate
      mint revisions acme/math-rl -o json | jq '{revision, tags}'
    """
    from catalog.exceptions import InvalidReference
    from catalog.refs import parse_ref
    from schemas.events.serving import check_tag_change

    try:  # before connecting: the command's own rule
        check_tag_change(tags, remove)
    except ValueError as e:
        raise click.UsageError(
            f"{e}: give TAG arguments and/or --remove TAG (see --help)"
        ) from None
    if "@" not in reference:
        raise click.BadParameter(
            f"{reference!r} names no revision: give tenant/policy@N, @alias or @sha256:…",
            param_hint="REFERENCE",
        )
    try:
        ref = parse_ref(reference)
    except InvalidReference as e:
        raise click.BadParameter(str(e), param_hint="REFERENCE") from None
    number = ref.revision
    if number is None:  # an alias or a digest: the revision it names now
        with catalog_repo() as repo:
            number = repo.resolve(ref).revision
    where = f"{ref.tenant}/{ref.policy}@{number}"
    check = f"mint revision show {where}"
    with (
        sending(
            f"nothing was sent, {where} was not tagged",
            f"check `{check}` before sending it again",
            carried_out_later(check),
        ),
        cli_client(ref.tenant, timeout) as c,
    ):
        now = c.tag(ref.policy, number, add=tags, remove=remove)
    click.echo(f"{where}: {', '.join(now) or 'no tags'}")


@revision.command("download")
@click.argument("reference")
@click.option(
    "--out",
    "dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A new (or empty) folder to write the adapter to.",
)
@one_line_errors
def download(reference: str, dest: Path) -> None:
    """Write one revision as a PEFT adapter folder (adapter_config.json and
    adapter_model.safetensors) that stock PEFT and `vllm serve --lora-modules NAME=DIR` load.
    The store's copy is verified first (digest, shapes, finite weights); a packed MoE revision
    is unpacked; mint-revision.json says where it came from.

    \b
      mint revision download acme/math@prod --out ./math-prod
      vllm serve BASE --enable-lora --lora-modules math=./math-prod
    """
    from catalog.download import write_peft_folder
    from catalog.store import AdapterStore

    with catalog_repo() as repo:
        tenant, policy, target = resolve(repo, reference)
        rev = repo.get_revision(tenant, policy, target)
    stored = AdapterStore.from_settings(get_settings()).open(rev.store_uri, owner=(tenant, policy))
    files = write_peft_folder(stored, dest)
    console.print(f"{rev.ref} ({rev.digest}) -> {dest}: {', '.join(files)}")


def print_revision(row: Mapping[str, Any]) -> None:
    """A revision as `mint revision show` prints it: its fields, then one table per evaluation."""
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    rows = [
        ("revision", f"{row['tenant']}/{row['policy']}@{row['revision']}"),
        ("digest", row["digest"]),
        ("store uri", row["store_uri"]),
        ("parent", str(row["parent_revision"] or "-")),
        ("aliases", ", ".join(row["aliases"]) or "-"),
        ("tags", ", ".join(row["tags"]) or "-"),
        ("created", f"{row['created_at']:%Y-%m-%d %H:%M:%S}"),
        ("by", row["created_by"] or "-"),
    ]
    training = row["training"]
    names = [n for n in FIGURES if n in training] + sorted(set(training) - set(FIGURES))
    rows += [(f"training {n}", number(training[n])) for n in names] or [("training", "-")]
    for name, value in rows:
        fields.add_row(name, value)
    out.print(fields)
    if not row["evaluations"]:
        out.print("evaluations: none")
    for suite, e in row["evaluations"].items():
        out.print(evaluation_table(suite, e))


def evaluation_table(suite: str, e: Mapping[str, Any]) -> Table | str:
    """One evaluation: every metric with its threshold and whether it met it."""
    when_ = f"{e['evaluated_at']:%Y-%m-%d %H:%M:%S}"
    if e["refused"] is not None:
        return f"evaluation {suite}: refused at {when_}: {e['refused']}"
    verdict = "passed" if e["passed"] else "failed: " + ", ".join(e["failures"])
    table = Table("metric", "value", "threshold", "met", title=f"{suite}: {verdict} ({when_})")
    limits = e["thresholds"]
    for name in sorted(set(e["metrics"]) | set(limits)):
        value = e["metrics"].get(name)
        bound = limits.get(name)
        met = "" if bound is None else ("✓" if _meets(value, bound) else "✗")
        shown = "missing" if value is None else number(value)
        table.add_row(name, shown, _bound(bound), met)
    return table


def _meets(value: float | None, bound: Mapping[str, float]) -> bool:
    if value is None or math.isnan(value):
        return False
    low, high = bound.get("min"), bound.get("max")
    return (low is None or value >= low) and (high is None or value <= high)


def _bound(bound: Mapping[str, float] | None) -> str:
    if not bound:
        return ""
    low, high = bound.get("min"), bound.get("max")
    if low is not None and high is not None:
        return f"{number(low)} ≤ x ≤ {number(high)}"
    return f">= {number(low)}" if low is not None else f"<= {number(high)}"
