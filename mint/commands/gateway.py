"""`mint gateway`, `mint tenants …`, `mint keys …`: the OpenAI-compatible front door and who may
call it (gateway/README.md)."""

from __future__ import annotations

from contextlib import contextmanager

import click
from rich.console import Console
from rich.table import Table

from mint.commands.cassandra import catalog_session
from mint.commands.errors import one_line_errors
from mint.commands.options import stack
from schemas.settings import get_settings

console = Console(stderr=True)
out = Console()


def _failure_bucket(flag: str, per: str, burst: int, per_s: float, what: str):
    """--FLAG-failures-burst and --FLAG-failures-per-s: the token bucket of failed key checks
    per ``per`` (a key id, a client address)."""
    return stack(
        click.option(
            f"--{flag}-failures-burst",
            type=int,
            default=burst,
            help=f"{what} per {per} before 429s.",
        ),
        click.option(
            f"--{flag}-failures-per-s",
            type=float,
            default=per_s,
            help=f"Then this many per {per} per second.",
        ),
    )


@click.command("gateway")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000)
@click.option(
    "--instance-id",
    default=None,
    help="Prefix of this instance's request ids (default: host, pid and a random "
    "suffix). Unique per running instance.",
)
@click.option(
    "--timeout",
    "answer_timeout_s",
    type=float,
    default=60.0,
    help="Seconds to wait for the engines' answer before a 503.",
)
@click.option(
    "--rate",
    "rate_per_s",
    type=float,
    default=20.0,
    help="Requests per second per tenant and instance, unless the tenant sets its own "
    "(`mint tenants create --rate`).",
)
@click.option(
    "--burst",
    type=int,
    default=40,
    help="Token bucket size per tenant and instance (same rule as --rate).",
)
@click.option(
    "--key-ttl",
    "key_ttl_s",
    type=float,
    default=5.0,
    help="Seconds a key's catalog row is cached: a revoked key stops working within "
    "this on every instance.",
)
@_failure_bucket("key", "key id", 10, 0.2, "Failed key checks (catalog read + scrypt)")
@_failure_bucket("client", "client address", 20, 1.0, "Failed key checks")
@click.option(
    "--key-check-threads",
    type=int,
    default=2,
    help="Threads that run scrypt (none of the catalog's).",
)
@click.option(
    "--max-tokens",
    type=int,
    default=4096,
    help="Largest max_tokens a request may ask for.",
)
@click.option("--max-body-bytes", type=int, default=256 * 1024)
@click.option(
    "--enable-auto-tool-choice",
    is_flag=True,
    default=False,
    help="As vllm serve: answer tools with tool_choice auto, required or a named function "
    "(needs --tool-call-parser).",
)
@click.option(
    "--tool-call-parser",
    type=click.Choice(["hermes"]),
    default=None,
    help="As vllm serve: how tool calls are read from an answer (hermes: <tool_call> tags).",
)
@click.option(
    "--max-model-len",
    type=int,
    default=None,
    help="The engines' context length, as /tokenize reports it (default: the model's config).",
)
@one_line_errors
def gateway(host: str, port: int, instance_id: str | None, **limits) -> None:
    """Serve the OpenAI API (chat and completions, streamed or not) over the engines.

    \b
    Requests travel as infer.requested to the serving engines; each instance follows
    infer.results (no consumer group) and takes only the answers to its own requests, so any
    number of instances run side by side behind a load balancer. Callers send
    `Authorization: Bearer <key>` with a key from `mint keys create`; `model` is
    policy@alias, policy@N or policy@sha256:… of the key's tenant.
    """
    from pydantic import ValidationError

    from gateway.config import GatewayConfig
    from gateway.main import serve
    from schemas.envelope import validation_message

    try:
        config = GatewayConfig(
            host=host, port=port, **limits, **({"instance_id": instance_id} if instance_id else {})
        )
    except ValidationError as e:
        raise click.UsageError(validation_message(e, "bad gateway option")) from None
    serve(get_settings(), config)


# ---------------------------------------------------------------------- tenants and keys


@contextmanager
def _access():
    from catalog.access import AccessRepository

    settings = get_settings()
    with catalog_session(settings) as session:
        yield AccessRepository(session, settings.keyspace)


def _when(at) -> str:
    return at.isoformat(timespec="seconds") if at else "-"


@click.group("tenants")
def tenants() -> None:
    """Tenants that may call the gateway, and their request rates (catalog: tenant_access).

    Writes the catalog: with credentials on, run it as `operator` or `admin`.
    """


@tenants.command("create")
@click.argument("tenant")
@click.option(
    "--rate",
    "rate_per_s",
    type=float,
    default=None,
    help="Requests per second per gateway instance (default: the gateway's --rate).",
)
@click.option("--burst", type=int, default=None, help="Token bucket size (default: --burst).")
@one_line_errors
def tenants_create(tenant: str, rate_per_s: float | None, burst: int | None) -> None:
    """Create TENANT (idempotent; an existing tenant's rate changes with `set-rate`)."""
    with _access() as repo:
        got = repo.create_tenant(tenant, rate_per_s=rate_per_s, burst=burst, by="cli")
    what = "created" if got.is_new else "exists"
    console.print(
        f"tenant {got.tenant} {what} (rate {got.rate_per_s or 'default'}/s, burst "
        f"{got.burst or 'default'}); a Kafka principal that reads only its answers: "
        f"`mint security tenant {got.tenant} --dir <secrets>`"
    )


@tenants.command("set-rate")
@click.argument("tenant")
@click.option("--rate", "rate_per_s", type=float, default=None, help="unset: the default")
@click.option("--burst", type=int, default=None, help="unset: the default")
@one_line_errors
def tenants_set_rate(tenant: str, rate_per_s: float | None, burst: int | None) -> None:
    """Set TENANT's request rate (gateways see it within their catalog cache time)."""
    with _access() as repo:
        got = repo.set_limits(tenant, rate_per_s, burst)
    console.print(
        f"tenant {got.tenant}: rate {got.rate_per_s or 'default'}/s, burst {got.burst or 'default'}"
    )


@tenants.command("list")
@one_line_errors
def tenants_list() -> None:
    """Every tenant with its rate."""
    with _access() as repo:
        rows = repo.list_tenants()
    table = Table("tenant", "rate/s", "burst", "created")
    for t in rows:
        table.add_row(
            t.tenant, str(t.rate_per_s or "default"), str(t.burst or "default"), _when(t.created_at)
        )
    out.print(table)


@click.group("keys")
def keys() -> None:
    """API keys of the gateway: `mint_<key id>_<secret>`, shown once; the catalog keeps a
    salted scrypt hash. A revoked key stops working within the gateways' --key-ttl.

    Writes the catalog: with credentials on, run it as `operator` or `admin`.
    """


_tenant = click.option("--tenant", required=True)


@keys.command("create")
@_tenant
@click.option("--name", default="", show_default=False, help="What the key is for, e.g. ci.")
@one_line_errors
def keys_create(tenant: str, name: str) -> None:
    """Make a key for TENANT and print it once (stdout), e.g. KEY=$(mint keys create …)."""
    with _access() as repo:
        key, stored = repo.create_key(tenant, name=name, by="cli")
    console.print(
        f"key {stored.key_id} of tenant {stored.tenant} created; it is shown once, store it now:"
    )
    click.echo(key.text)


@keys.command("list")
@_tenant
@one_line_errors
def keys_list(tenant: str) -> None:
    """TENANT's keys (ids and names; secrets are never stored)."""
    with _access() as repo:
        rows = repo.list_keys(tenant)
    table = Table("key id", "name", "created", "revoked")
    for k in rows:
        table.add_row(k.key_id, k.name or "-", _when(k.created_at), _when(k.revoked_at))
    out.print(table)


@keys.command("revoke")
@click.argument("key_id")
@click.option("--tenant", default=None, help="Refuse unless the key is this tenant's.")
@one_line_errors
def keys_revoke(key_id: str, tenant: str | None) -> None:
    """Revoke KEY_ID (the 12 hex digits after `mint_`)."""
    with _access() as repo:
        got = repo.revoke_key(key_id, tenant=tenant, by="cli")
    console.print(f"key {got.key_id} of tenant {got.tenant} revoked at {_when(got.revoked_at)}")


COMMANDS: list[click.Command] = [gateway, tenants, keys]
