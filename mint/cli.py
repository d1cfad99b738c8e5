"""The ``mint`` command line."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from schemas.logs import configure_logging
from schemas.settings import get_settings

console = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-format", type=click.Choice(["console", "json"]), default="console",
              show_default=True, help="Log lines for people (console) or machines (json).")  # fmt: skip
def main(log_format: str) -> None:
    """MinT: LoRA post-training and serving over resident base models.

    \b
    Quick start on a fresh machine:
      mint dev up        start local Kafka and Cassandra (JVM processes, data in .mint/)
      mint demo          run the end-to-end demo
      mint dev down      stop what `dev up` started

    Configuration comes from MINT_* environment variables (see README, "Configuration").
    """
    configure_logging(get_settings().log_level, log_format)


@main.group()
def dev() -> None:
    """Local Kafka 4.4 (KRaft) and Cassandra 5.0 for development and tests.

    Jars come from MINT_KAFKA_JARS / MINT_CASSANDRA_JARS, else ../shared/vendor/jvm, else Maven
    (deploy/local/*-pom.xml). A non-loopback MINT_KAFKA_BOOTSTRAP or MINT_CASSANDRA_HOSTS (or
    MINT_KAFKA_EXTERNAL / MINT_CASSANDRA_EXTERNAL=true) names an external cluster: then nothing
    is started and `status` checks that cluster.
    """


@dev.command("up")
@click.option("--only", type=click.Choice(["kafka", "cassandra"]), multiple=True,
              help="Start just this service (repeatable). Default: both.")  # fmt: skip
def dev_up(only: tuple[str, ...]) -> None:
    """Start Kafka and Cassandra (idempotent) and wait until both answer."""
    from mint.dev import LauncherError, up

    try:
        ready = up(get_settings(), only or ("kafka", "cassandra"))
    except LauncherError as e:
        console.print(f"[red]error:[/red] {e}")
        sys.exit(1)
    for name, seconds in ready.items():
        console.print(f"{name} ready after {seconds:.1f} s")
    _print_status()


@dev.command("down")
def dev_down() -> None:
    """Stop the services that `mint dev up` started (by pid file, never by name)."""
    from mint.dev import down

    stopped = down(get_settings())
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@dev.command("status")
def dev_status() -> None:
    """Show whether Kafka and Cassandra answer; exit 1 if either does not."""
    if not _print_status():
        sys.exit(1)


def _print_status() -> bool:
    from mint.dev import status

    table = Table("service", "state", "mode", "address", "pid", "rss MB")
    rows = status(get_settings())
    for s in rows:
        table.add_row(s.name, "[green]up[/green]" if s.answering else "[red]down[/red]", s.mode,
                      s.address, str(s.pid or "-"), f"{s.rss_mb:.0f}" if s.rss_mb else "-")  # fmt: skip
    console.print(table)
    return all(s.answering for s in rows)


def _register_commands() -> None:
    # Each area owns one module under mint/commands/ and lists its commands there.
    from mint.commands import catalog, lifecycle, models, streams, workers

    for module in (streams, catalog, models, workers, lifecycle):
        for command in module.COMMANDS:
            main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main()
