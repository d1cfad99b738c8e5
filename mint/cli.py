"""The ``mint`` command line."""

from __future__ import annotations

import os
import sys

import click
from rich.console import Console
from rich.table import Table

from mint import __version__
from mint.commands.errors import fail, one_line_errors, quiet_driver_tracebacks
from schemas.logs import configure_logging
from schemas.settings import get_settings

console = Console(stderr=True)  # progress and messages
out = Console()  # what a command answers: tables a pipe or a script reads


# Every command's --help shows its options' defaults: one setting here, inherited by each
# subcommand's context (an option whose default says nothing, such as "", sets show_default=False).
@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--log-format",
    type=click.Choice(["console", "json"]),
    default="console",
    help="Log lines for people (console) or machines (json).",
)
@click.version_option(
    __version__, "--version", "-V", prog_name="mint", message="%(prog)s %(version)s"
)
def main(log_format: str) -> None:
    """MinT: LoRA post-training and serving over resident base models.

    \b
    Quick start on a fresh machine:
      mint dev up        start local Kafka and Cassandra (JVM processes, data in .mint/)
      mint demo          run the end-to-end demo
      mint dev down      stop what `dev up` started

    \b
    References, everywhere: tenant/policy@alias (what the alias serves now), tenant/policy@N
    (revision N), tenant/policy@sha256:<64 hex> (the revision with that adapter digest).
    A command that moves an alias takes the alias's reference (`mint rollback acme/math@prod`)
    or the revision it moves to (`mint promote acme/math@7 --alias prod`).

    Configuration comes from MINT_* environment variables (see README, "Configuration").
    """
    level = get_settings().log_level
    configure_logging(level, log_format)
    if level != "DEBUG":
        quiet_driver_tracebacks()  # the driver's traceback repeats the command's own error line


@main.group()
def dev() -> None:
    """Local Kafka 4.4 (KRaft) and Cassandra 5.0 for development and tests.

    Jars come from MINT_KAFKA_JARS / MINT_CASSANDRA_JARS, else ../shared/vendor/jvm, else Maven
    (mint/dev/services/*-pom.xml). A non-loopback MINT_KAFKA_BOOTSTRAP or MINT_CASSANDRA_HOSTS (or
    MINT_KAFKA_EXTERNAL / MINT_CASSANDRA_EXTERNAL=true) names an external cluster: then nothing
    is started and `status` checks that cluster.
    """


SECURE_HELP = (
    "Credentials and ACLs on: SASL/SCRAM + ACLs on Kafka, password logins and a role "
    "per service on Cassandra, in their own state folder (.mint/secure)."
)


def _dev_settings(secure: bool):
    settings = get_settings()
    if secure or settings.kafka_secure:
        from mint.dev.secure import secure_settings

        return secure_settings(settings, "admin")
    return settings


@dev.command("up")
@click.option(
    "--only",
    type=click.Choice(["kafka", "cassandra"]),
    multiple=True,
    help="Start just this service (repeatable). Default: both.",
)
@click.option("--secure", is_flag=True, help=SECURE_HELP)
@click.option(
    "--nodes",
    type=click.IntRange(1, 5),
    default=None,
    help="Nodes of each service (default MINT_DEV_NODES, else 1). 3: a local cluster on "
    "127.0.0.1-3, topics RF 3 with min.insync.replicas 2, keyspaces NetworkTopologyStrategy RF 3.",
)
@one_line_errors(RuntimeError)  # the secure setup's broker refusals (streams/acls.py)
def dev_up(only: tuple[str, ...], secure: bool, nodes: int | None) -> None:
    """Start Kafka and Cassandra (idempotent) and wait until both answer.

    \b
    With --secure, each principal's settings land in .mint/secure/env/<principal>.env:
      set -a; . .mint/secure/env/operator.env; set +a   # the CLI and SDK as `operator`
    \b
    A local cluster (three brokers, three Cassandra nodes, about 6 GB resident):
      mint dev up --nodes 3
      export MINT_DEV_NODES=3        # every other command and worker then uses all three
      mint dev kill kafka-2          # a drill: kill -9 one node ...
      mint dev start kafka-2         # ... and start it again on its data
    """
    from mint.dev import status, up

    if nodes is not None:
        os.environ["MINT_DEV_NODES"] = str(nodes)
        get_settings.cache_clear()
    settings = _dev_settings(secure)
    other = (
        get_settings().model_copy(update={"state_dir": settings.state_dir.parent})
        if settings.kafka_secure
        else _dev_settings(True)
    )
    running = [s.name for s in status(other) if s.pid]
    if running:  # both pairs use the same ports: the other one would answer in this one's place
        flag = "" if settings.kafka_secure else " --secure"
        fail(
            f"the {'plain' if settings.kafka_secure else 'secure'} pair runs on these ports "
            f"({', '.join(running)}): stop it first with `mint dev down{flag}`"
        )
    ready = up(settings, only or ("kafka", "cassandra"))
    if secure and not only:
        from mint.dev.secure import setup

        applied = setup(settings)
        console.print(
            f"credentials: {applied['acls']} Kafka ACLs, {applied['roles']} "
            f"Cassandra roles; env files in {settings.state_dir / 'env'}"
        )
    for name, seconds in ready.items():
        console.print(f"{name} ready after {seconds:.1f} s")
    _print_status(settings)
    if nodes and nodes > 1:
        console.print(f"other commands and workers: export MINT_DEV_NODES={settings.dev_nodes}")


@dev.command("kill")
@click.argument("node")
@one_line_errors
def dev_kill(node: str) -> None:
    """Kill -9 one node (kafka-2, cassandra-3; kafka or cassandra alone), as a crash would.

    Its data stays; `mint dev start NODE` brings it back. In a local cluster the other two
    carry on: a drill for "one node down is not an outage"."""
    from mint.dev.launcher import kill

    pid = kill(get_settings(), node)
    console.print(f"killed {node} (pid {pid})" if pid else f"{node} was not running")


@dev.command("start")
@click.argument("node")
@one_line_errors
def dev_start(node: str) -> None:
    """Start one node again on its data (after `mint dev kill`) and wait until it answers."""
    from mint.dev import up

    ready = up(get_settings(), (node,))
    console.print(
        f"{node} ready after {ready[node]:.1f} s" if node in ready else f"{node} was running"
    )


@dev.command("down")
@click.option("--secure", is_flag=True, help="Stop the secure pair (see `up --secure`).")
@one_line_errors
def dev_down(secure: bool) -> None:
    """Stop the services that `mint dev up` started (by pid file, never by name)."""
    from mint.dev import down

    stopped = down(_dev_settings(secure))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@dev.command("status")
@click.option("--secure", is_flag=True, help="Check the secure pair (see `up --secure`).")
@one_line_errors
def dev_status(secure: bool) -> None:
    """Show whether Kafka and Cassandra answer; exit 1 if either does not."""
    if not _print_status(_dev_settings(secure)):
        sys.exit(1)


def _print_status(settings=None) -> bool:
    from mint.dev import status

    table = Table("service", "state", "mode", "address", "pid", "rss MB")
    rows = status(settings or get_settings())
    for s in rows:
        table.add_row(
            s.name,
            "[green]up[/green]" if s.answering else "[red]down[/red]",
            s.mode,
            s.address,
            str(s.pid or "-"),
            f"{s.rss_mb:.0f}" if s.rss_mb else "-",
        )
    out.print(table)
    return all(s.answering for s in rows)


def _register_commands() -> None:
    # Each area owns one module under mint/commands/ and lists its commands there.
    from mint.commands import (
        canary,
        catalog,
        gateway,
        lifecycle,
        models,
        security,
        streams,
        timeline,
        workers,
    )

    modules = (streams, catalog, models, workers, lifecycle, canary, timeline, security, gateway)
    for module in modules:
        for command in module.COMMANDS:
            main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main()
